"""handlers.Reconciler: retries with exponential backoff and jitter, refused children retried (never a permanent
failure), and a persisting 401/403 reported once where users look."""

from __future__ import annotations

import asyncio
import random
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import pytest

from neuronmodel_operator import handlers
from neuronmodel_operator.k8s import ApiError
from neuronmodel_operator.peering import Peering, paused_by
from neuronmodel_operator.reconcile import Outcome

KEY = ("team", "llama")
BODY = {"metadata": {"name": "llama", "namespace": "team", "uid": "u-1"}}


def test_backoff_grows_exponentially_with_jitter_and_a_cap():
    random.seed(0)
    for attempt in range(1, 12):
        ceiling = min(handlers.RETRY_CAP_S, handlers.RETRY_BASE_S * 2 ** (attempt - 1))
        waits = {handlers.backoff_s(attempt) for _ in range(50)}
        assert all(ceiling / 2 <= wait <= ceiling for wait in waits)
        assert len(waits) > 1  # jitter: not one fixed delay for every model at once
    assert max(handlers.backoff_s(30) for _ in range(50)) <= handlers.RETRY_CAP_S


class ScriptedReconcile:
    """Stands in for reconcile.Reconcile: each call raises or returns the next scripted result."""

    def __init__(self, *results):
        self.results = list(results)
        self.calls = 0
        self.reported: list[str] = []

    def __call__(self, *args):
        self.calls += 1
        result = self.results.pop(0) if self.results else Outcome()
        if isinstance(result, Exception):
            raise result
        return result

    def report_access_denied(self, body, message):
        self.reported.append(message)


def run(reconcile: ScriptedReconcile, attempts: int) -> handlers.Reconciler:
    """`attempts` runs of one model, as kopf's retries make them; the errors swallowed."""
    async def main():
        reconciler = handlers.Reconciler(reconcile, ThreadPoolExecutor(max_workers=1))
        reconciler.models[KEY] = BODY
        for _ in range(attempts):
            try:
                await reconciler.run(KEY, cleanup=True, body=BODY)
            except ApiError:
                pass
        return reconciler
    return asyncio.run(main())


def test_a_refused_child_backs_off_and_recovers():
    refused = Outcome(child_error="Job.batch is invalid")
    reconciler = run(ScriptedReconcile(refused, refused, refused), attempts=3)
    assert reconciler.failures[KEY] == 3
    assert handlers.RETRY_BASE_S * 2 <= reconciler.retry_delay_s(KEY) <= handlers.RETRY_BASE_S * 4
    reconciler = run(ScriptedReconcile(refused, Outcome()), attempts=2)
    assert KEY not in reconciler.failures  # success resets the backoff


@pytest.mark.parametrize("code", [401, 403])
def test_persisting_access_denied_is_reported_once(code):
    denied = ApiError(code, "neuronmodels/status is forbidden")
    reconcile = ScriptedReconcile(*[denied] * 6)
    run(reconcile, attempts=handlers.ACCESS_DENIED_REPORT_AFTER - 1)
    assert reconcile.reported == []  # RBAC lagging a fresh install heals by itself: not worth a warning yet
    reconcile = ScriptedReconcile(*[denied] * 6)
    run(reconcile, attempts=6)
    assert len(reconcile.reported) == 1
    assert str(code) in reconcile.reported[0] and "rbac/operator-rules.yaml" in reconcile.reported[0]


def test_a_persisting_admission_denial_is_reported_naming_the_policy_not_rbac():
    """The status write itself refused by a ValidatingAdmissionPolicy (a child refused by one is reported by the
    reconcile: test_ownership.py): the warning names the policy, and sends nobody to the RBAC rules."""
    denied = ApiError(403, "neuronmodels.neuronmodel.dev \"llama\" is forbidden: ValidatingAdmissionPolicy "
                           "'freeze' with binding 'freeze' denied request: the team namespace is frozen")
    reconcile = ScriptedReconcile(*[denied] * 3)
    run(reconcile, attempts=3)
    (message,) = reconcile.reported
    assert "ValidatingAdmissionPolicy 'freeze' (binding 'freeze') denies them: an admission policy, not RBAC" in \
        message
    assert "rbac/operator-rules.yaml" not in message


@pytest.mark.parametrize("error", [
    ApiError(503, "etcd leader changed"),
    ApiError(403, 'configmaps "llama-runtime-0c1d" is forbidden: unable to create new content in namespace team '
                  'because it is being terminated', causes=("NamespaceTerminating",)),
], ids=["unavailable", "namespace-terminating"])
def test_other_api_errors_are_not_reported_as_access_denied(error):
    reconcile = ScriptedReconcile(*[error] * 5)
    run(reconcile, attempts=5)
    assert reconcile.reported == []


TERMINATING = ApiError(403, "unable to create new content in namespace team because it is being terminated",
                       causes=("NamespaceTerminating",))


@pytest.mark.parametrize("error, retried", [
    (ApiError(503, "etcd leader changed"), True),
    (ApiError(403, 'configmaps is forbidden: User "system:serviceaccount:nm:op" cannot create resource'), True),
    (TERMINATING, False),
], ids=["unavailable", "rbac", "namespace-terminating"])
def test_a_namespace_being_deleted_is_not_retried_or_warned_about(monkeypatch, caplog, error, retried):
    """Every create in a namespace being deleted is refused with a 403 until the namespace (and the model in it) is
    gone: retrying only fills the log with 403s that look like RBAC drift. Any other refusal is retried."""
    monkeypatch.setattr(handlers, "backoff_s", lambda attempt: 0.01)
    reconcile = ScriptedReconcile(error, Outcome())

    async def main():
        reconciler = handlers.Reconciler(reconcile, ThreadPoolExecutor(max_workers=1))
        reconciler.models[KEY] = BODY
        await reconciler._background(KEY, full=True, body=BODY)
        await asyncio.sleep(0.3)  # a retry, if one was scheduled, has run by now
    asyncio.run(main())
    assert reconcile.calls == (2 if retried else 1)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert bool(warned) == retried


class RecordingReconcile(ScriptedReconcile):
    """Records each run's (cleanup, changed) and the uids it forgot."""

    def __init__(self):
        super().__init__()
        self.runs: list[tuple[bool, object]] = []
        self.forgotten: list[str] = []

    def __call__(self, namespace, name, cleanup, body=None, changed=None):
        self.runs.append((cleanup, changed))
        return super().__call__()

    def forget(self, uid):
        self.forgotten.append(uid)


def model(generation: int, observed=None, uid: str = "u-1") -> dict:
    status = {"observedGeneration": observed} if observed else {}
    return {"metadata": {"name": "llama", "namespace": "team", "uid": uid, "generation": generation},
            "status": status}


def events(*seen: tuple) -> RecordingReconcile:
    """Feed NeuronModel watch events to a Reconciler, let its background runs finish; the runs it made."""
    reconcile = RecordingReconcile()

    async def main():
        reconciler = handlers.Reconciler(reconcile, ThreadPoolExecutor(max_workers=1))
        for kind, body in seen:
            reconciler.seen(KEY, {"type": kind, "object": body})
            await asyncio.sleep(0.05)
    asyncio.run(main())
    return reconcile


def test_a_new_model_runs_once_without_looking_for_stale_children():
    reconcile = events(("ADDED", model(1)), ("MODIFIED", model(1, observed=1)))  # then our own status write
    assert reconcile.runs == [(False, None)]


def test_an_edit_runs_in_full_with_the_stale_children_cleanup():
    reconcile = events(("ADDED", model(1)), ("MODIFIED", model(1, observed=1)), ("MODIFIED", model(2, observed=1)))
    assert reconcile.runs == [(False, None), (True, None)]


def test_a_restarted_operator_resumes_each_model_once_with_cleanup():
    reconcile = events((None, model(3, observed=3)), ("MODIFIED", model(3, observed=3)))
    assert reconcile.runs == [(True, None)]


def test_a_deleted_and_recreated_model_is_new_again():
    reconcile = events(("ADDED", model(1)), ("DELETED", model(1)), ("ADDED", model(1, uid="u-2")))
    assert reconcile.runs == [(False, None), (False, None)] and reconcile.forgotten == ["u-1"]


def peer(priority: int, seconds_ago: float = 0, lifetime: int = 60) -> dict:
    """A peer as kopf writes it into its peering object's status (kopf/_core/engines/peering.py Peer.as_dict)."""
    seen = datetime.now(timezone.utc) - timedelta(seconds=seconds_ago)
    return {"priority": priority, "lifetime": lifetime, "lastseen": seen.isoformat()}


@pytest.mark.parametrize("others,paused", [  # peer(*args) built when the test runs: lastseen is relative to now
    ({"replica-b": (200,)}, True),  # a higher priority lives: kopf pauses us
    ({"replica-b": (100,)}, True),  # the same priority: kopf pauses both
    ({"replica-b": (50,)}, False),
    ({"replica-b": (200, 120)}, False),  # dead: its lifetime ran out
    ({"kopf-freeze": (2**31, 0, 3600)}, True),  # `kopf freeze`
    ({}, False),
])
def test_the_peering_rule_is_kopfs(others, paused):
    body = {"status": {"replica-a": peer(100), **{name: peer(*args) for name, args in others.items()}}}
    assert paused_by(body, "replica-a", 100, datetime.now(timezone.utc)) is paused


class PeeringKube:
    def __init__(self, body):
        self.body, self.asked = body, []

    def get_peering(self, name, namespace):
        self.asked.append((name, namespace))
        return self.body


def test_a_peering_replica_reads_its_namespaces_objects():
    kube = PeeringKube({"status": {"replica-b": peer(200)}})
    assert Peering(kube, "neuronmodel", ("team", "ml"), "replica-a", 100)()
    assert kube.asked == [("neuronmodel", "team"), ("neuronmodel", "ml")]
    kube = PeeringKube(None)  # no such object yet
    assert not Peering(kube, "neuronmodel", (), "replica-a", 100)() and kube.asked == [("neuronmodel", None)]


def test_retries_wait_while_kopfs_peering_has_paused_this_replica():
    """kopf's pause stops its watches, not our call_later timers: a paused replica must not reconcile beside the
    active one; the retry waits and runs once the replica is active again."""
    reconcile = ScriptedReconcile()
    later: list = []

    async def main():
        reconciler = handlers.Reconciler(reconcile, ThreadPoolExecutor(max_workers=1))
        reconciler.paused = lambda: True
        loop = asyncio.get_running_loop()
        loop.call_later = lambda delay, callback, *args: later.append((callback, args))
        reconciler.retry(KEY)
        await asyncio.gather(*reconciler.tasks)
        assert reconcile.calls == 0 and len(later) == 1  # waited, not run
        reconciler.paused = lambda: False
        callback, args = later.pop()
        callback(*args)
        await asyncio.gather(*reconciler.tasks)
        assert reconcile.calls == 1
    asyncio.run(main())
