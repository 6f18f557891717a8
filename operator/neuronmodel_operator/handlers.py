"""kopf glue: which events reconcile which NeuronModel, and the kopf settings, chosen deliberately.

- Every NeuronModel event keeps the latest copy of the object; one with a generation (or uid) not handled yet by
  this process runs a full reconcile: a new object, an edited spec, or each object once after the operator
  starts (kopf lists them first). Status writes and metadata edits keep the generation: they cost nothing. This is
  one raw event handler, not kopf's create/update/resume handlers: those persist their progress and the
  last-handled spec by patching the NeuronModel after every run, one more write and one more watch event per
  change (bench/operator.py measured them), for state the generation already gives.
- Failures are retried in the background with exponential backoff and jitter, capped (`backoff_s`): an API error
  that heals by itself, or a child the API server refused. A retry waits while kopf's peering has paused this
  replica (peering.py: kopf's pause stops its watches, not these timers). A spec the operator cannot serve is not
  retried (the Failed condition and an Event are written) until its generation changes. A 401/403 that persists for
  ACCESS_DENIED_REPORT_AFTER attempts is put in status.warnings and a Warning Event: RBAC drift is visible (an
  admission policy's 403, on the NeuronModel's own status say, is named as such: no RBAC change fixes it).
  The 403 of a namespace being deleted is neither retried nor reported: the model is deleted with its namespace.
- Any event of a child (Deployment, LeaderWorkerSet, Job, Service, ConfigMap, PDB, HPA, ResourceClaimTemplate,
  serving Pod), found by the `managed-by` label, refreshes its owner (`reconcile.py`): a deleted or hand-edited
  child is restored within seconds, and the status follows the workload and its pods. Runs are serialised per
  NeuronModel and coalesced: a burst of pod events costs one refresh, not one each. The owner comes from a copy kept from the NeuronModels'
  own watch, so a refresh that finds nothing drifted and no status change makes no request at all.
- No delete handler, timer or daemon: each would make kopf add a finalizer, and deleting a NeuronModel while the
  operator is down would hang. Children are deleted by the garbage collector through their ownerReferences.
- kopf's own Events ("Handler succeeded") are off, ours say what happened.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine, Optional

import kopf

from neuronmodel_operator import api
from neuronmodel_operator.k8s import ApiError
from neuronmodel_operator.metrics import OperatorMetrics, result_of
from neuronmodel_operator.reconcile import Changes, Outcome, Reconcile

log = logging.getLogger(__name__)

registry = kopf.OperatorRegistry()

#: Retries wait backoff_s(attempt): 2 s, 4 s, 8 s, ... capped at 5 min, each with jitter (so that a whole cluster's
#: models failing at once, an API server restart say, do not all come back in the same second).
RETRY_BASE_S = 2.0
RETRY_CAP_S = 300.0
#: Consecutive 401/403 answers after which the model's status says so.
ACCESS_DENIED_REPORT_AFTER = 3
Key = tuple[str, str]  # (namespace, name) of a NeuronModel
#: Children whose events re-run their owner's reconcile: (group, version, plural).
CHILDREN = (("", "v1", "configmaps"), ("", "v1", "services"), ("", "v1", "pods"), ("apps", "v1", "deployments"),
            ("apps", "v1", "replicasets"), ("batch", "v1", "jobs"), ("policy", "v1", "poddisruptionbudgets"),
            ("autoscaling", "v2", "horizontalpodautoscalers"), ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
            ("resource.k8s.io", "v1", "resourceclaimtemplates"))  # kopf watches only the APIs the cluster serves
_KINDS = {"configmaps": "ConfigMap", "services": "Service", "pods": "Pod", "deployments": "Deployment",
          "replicasets": "ReplicaSet", "jobs": "Job", "poddisruptionbudgets": "PodDisruptionBudget",
          "horizontalpodautoscalers": "HorizontalPodAutoscaler", "leaderworkersets": "LeaderWorkerSet",
          "resourceclaimtemplates": "ResourceClaimTemplate"}
OURS = {api.LABEL_MANAGED_BY: api.OPERATOR_NAME, api.LABEL_NAME: kopf.PRESENT}


def backoff_s(attempt: int) -> float:
    """The wait before retry `attempt` (1, 2, ...): exponential, capped, drawn from its upper half ("equal
    jitter")."""
    delay = min(RETRY_CAP_S, RETRY_BASE_S * 2 ** (max(attempt, 1) - 1))
    return random.uniform(delay / 2, delay)


@dataclass
class Reconciler:
    """Runs `reconcile` on worker threads, one run at a time per NeuronModel, coalescing child events."""

    reconcile: Reconcile
    executor: ThreadPoolExecutor
    locks: dict[Key, asyncio.Lock] = field(default_factory=dict)
    kicked: set[Key] = field(default_factory=set)  # a refresh is queued for these
    changes: dict[Key, Changes] = field(default_factory=dict)  # children whose events the queued refresh sees
    models: dict[Key, dict] = field(default_factory=dict)  # the latest copy of each NeuronModel the watch showed
    handled: dict[Key, tuple[str, int]] = field(default_factory=dict)  # (uid, generation) given a full run
    failures: dict[Key, int] = field(default_factory=dict)  # consecutive failed runs (the backoff's attempt)
    denied: dict[Key, int] = field(default_factory=dict)  # consecutive 401/403 answers
    tasks: set[asyncio.Task] = field(default_factory=set)  # runs in flight (the loop keeps only weak references)
    paused: Callable[[], bool] = lambda: False  # kopf's peering has paused this replica (peering.py; blocking)
    metrics: OperatorMetrics = field(init=False)  # served by the CLI on --metrics-port

    def __post_init__(self) -> None:
        self.metrics = OperatorMetrics(self.models.values)

    async def run(self, key: Key, cleanup: bool, body: Optional[dict] = None,
                  changed: Optional[Changes] = None) -> Outcome:
        lock = self.locks.setdefault(key, asyncio.Lock())
        async with lock:
            if changed is None:  # a full run covers every child event that arrived before it started
                self.changes.pop(key, None)
                self.kicked.discard(key)
            started, result = time.monotonic(), "error"
            try:
                outcome = await asyncio.get_running_loop().run_in_executor(
                    self.executor, self.reconcile, *key, cleanup, body, changed)
                result = result_of(outcome)
            except ApiError as exc:
                result = "api_error"
                self.failures[key] = self.failures.get(key, 0) + 1
                await self._count_denied(key, exc, body)
                raise
            finally:
                self.metrics.observe(result, time.monotonic() - started)
        self.denied.pop(key, None)
        if outcome.child_error:
            self.failures[key] = self.failures.get(key, 0) + 1
        else:
            self.failures.pop(key, None)
        if outcome.gone:
            self.locks.pop(key, None)
        return outcome

    def retry_delay_s(self, key: Key) -> float:
        return backoff_s(self.failures.get(key, 1))

    async def _count_denied(self, key: Key, exc: ApiError, body: Optional[dict]) -> None:
        """A 401/403: after ACCESS_DENIED_REPORT_AFTER in a row, once, into the status and an Event. Not the 403
        that a namespace being deleted answers every create with: that is no RBAC drift, and the model goes too."""
        if exc.status not in (401, 403) or exc.namespace_terminating:
            self.denied.pop(key, None)
            return
        self.denied[key] = count = self.denied.get(key, 0) + 1
        owner = body or self.models.get(key)
        if count == ACCESS_DENIED_REPORT_AFTER and owner is not None:
            fix = (f"{exc.admission} denies them: an admission policy, not RBAC; its owner decides what the operator "
                   "may write" if exc.admission is not None else
                   "check its ServiceAccount's RBAC against the chart's (rbac/operator-rules.yaml)")
            message = (f"the operator's requests are refused ({exc.status}: {exc.message}) for {count} attempts in "
                       f"a row; {fix}. Retrying with backoff")
            await asyncio.get_running_loop().run_in_executor(
                self.executor, self.reconcile.report_access_denied, owner, message)

    def kick(self, key: Key, child: tuple[str, str], body: Optional[dict]) -> None:
        """Refresh `key` soon for this child (its body, None when deleted); kicks that arrive while one is queued
        are folded into it."""
        self.changes.setdefault(key, {})[child] = body
        if key not in self.kicked:
            self.kicked.add(key)
            self._start(self._background(key, full=False))

    def seen(self, key: Key, event: dict) -> None:
        """A NeuronModel's watch event: keep its latest copy; a full reconcile of a generation not handled yet."""
        body = event["object"]
        meta = body["metadata"]
        if event.get("type") == "DELETED":
            self.models.pop(key, None)
            self.handled.pop(key, None)
            self.reconcile.forget(meta["uid"])
            return
        self.models[key] = body
        stamp, before = (meta["uid"], meta.get("generation", 1)), self.handled.get(key)
        if before == stamp:
            return  # our own status write, a label edit: the spec is what the last full run saw
        self.handled[key] = stamp
        # Stale children (a PDB no longer wanted, a kind switched) exist only where a reconcile ran before: in this
        # process (an earlier generation of this uid), or in an earlier one (it wrote status.observedGeneration).
        # A new object has none to list.
        cleanup = (before is not None and before[0] == meta["uid"]) or \
            bool((body.get("status") or {}).get("observedGeneration"))
        self._start(self._background(key, full=True, cleanup=cleanup, body=copy.deepcopy(body)))

    def retry(self, key: Key) -> None:
        self._start(self._retry(key))

    async def _retry(self, key: Key) -> None:
        """A retry, unless kopf's peering has paused this replica (its pause stops kopf's watches, not our
        timers): then it waits another backoff, and runs once the replica is active again."""
        if await asyncio.get_running_loop().run_in_executor(self.executor, self.paused):
            delay = self.retry_delay_s(key)
            log.info("%s/%s: this replica is paused by kopf's peering; the retry waits %.0f s", *key, delay)
            asyncio.get_running_loop().call_later(delay, self.retry, key)
            return
        await self._background(key, full=True, cleanup=True)

    def _start(self, run: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(run)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _background(self, key: Key, full: bool, cleanup: bool = True, body: Optional[dict] = None) -> None:
        """A full run or a queued refresh, its errors logged and retried with backoff: never raised."""
        try:
            if full:
                outcome = await self.run(key, cleanup=cleanup, body=body)
                if outcome.child_error:
                    self._retry_later(key, outcome.child_error)
                return
            async with self.locks.setdefault(key, asyncio.Lock()):
                self.kicked.discard(key)
                changed = self.changes.pop(key, None)
            if changed is None:
                return  # a full run took them
            # A deleted child is restored only after a fresh read shows its owner still exists.
            body = None if None in changed.values() else self.models.get(key)
            outcome = await self.run(key, cleanup=False, body=body, changed=changed)
            if outcome.child_error:
                self._retry_later(key, outcome.child_error)
        except ApiError as exc:
            if exc.namespace_terminating:
                log.info("%s/%s: its namespace is being deleted, and the model with it: not reconciled again", *key)
                return
            self._retry_later(key, str(exc))
        except Exception:  # never let one object's bug stop the others
            log.exception("reconcile of %s/%s failed", *key)
            self.failures[key] = self.failures.get(key, 0) + 1
            self._retry_later(key, "an error in the operator")

    def _retry_later(self, key: Key, why: str) -> None:
        delay = self.retry_delay_s(key)
        log.warning("reconcile of %s/%s failed (%s); retrying in %.0f s", *key, why, delay)
        asyncio.get_running_loop().call_later(delay, self.retry, key)


def configure(settings: kopf.OperatorSettings, client_timeout_s: float) -> None:
    settings.persistence.finalizer = f"{api.GROUP}/kopf-finalizer"  # unused: no handler needs one (see above)
    settings.posting.enabled = False
    # kopf on Python 3.10 has no inactivity timeout (it needs asyncio.timeout, bookmarks or not): a client-side
    # timeout restarts a watch that a load balancer silently dropped. The server ends each watch a little earlier.
    settings.watching.server_timeout = int(max(client_timeout_s - 30, 30))  # the API takes whole seconds
    settings.watching.client_timeout = client_timeout_s
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    # Watch children server-side filtered: without it kopf streams every pod of the cluster and filters here.
    # kopf 1.45 has it; 1.44 (the last for Python 3.10) filters by the handlers' labels= on the client only.
    if hasattr(settings.watching, "label_selectors"):
        for group, version, plural in CHILDREN:
            settings.watching.label_selectors[group, version, plural] = \
                f"{api.LABEL_MANAGED_BY}={api.OPERATOR_NAME}"


@kopf.on.login(registry=registry)
def login(**kwargs: Any) -> Any:
    """In a pod: the ServiceAccount; outside: the file KUBECONFIG names (read now, not at import time as the
    kubernetes client does). Our own registry does not get kopf's default login handlers.

    In a pod the server is KUBERNETES_SERVICE_HOST:PORT, as client-go's in-cluster config has it: kopf's own
    handler names https://kubernetes.default.svc, which needs cluster DNS (a cluster without it, or a pod whose
    dnsPolicy resolves elsewhere, never connects)."""
    info = kopf.login_with_service_account(**kwargs)
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if info is not None and host and port:
        return dataclasses.replace(info, server=f"https://{f'[{host}]' if ':' in host else host}:{port}")
    return info or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL, registry=registry, id="model")
async def model_changed(namespace: str, name: str, event: dict, memo: Any, **_: Any) -> None:
    memo.reconciler.seen((namespace, name), event)


def _on_child_event(group: str, version: str, plural: str) -> None:
    @kopf.on.event(group, version, plural, labels=OURS, registry=registry, id=f"child-{plural}")
    async def child_changed(namespace: str, name: str, labels: dict, event: dict, memo: Any, **_: Any) -> None:
        obj = event["object"]
        memo.reconciler.kick((namespace, labels[api.LABEL_NAME]), (obj.get("kind") or _KINDS[plural], name),
                             None if event.get("type") == "DELETED" else obj)


for _group, _version, _plural in CHILDREN:
    _on_child_event(_group, _version, _plural)
