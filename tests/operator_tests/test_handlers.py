"""handlers.Reconciler: retries with exponential backoff and jitter, refused children retried (never a permanent
failure), and a persisting 401/403 reported once where users look."""

from __future__ import annotations

import asyncio
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from neuronmodel_operator import handlers
from neuronmodel_operator.k8s import ApiError
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


def test_other_api_errors_are_not_reported_as_access_denied():
    reconcile = ScriptedReconcile(*[ApiError(503, "etcd leader changed")] * 5)
    run(reconcile, attempts=5)
    assert reconcile.reported == []
