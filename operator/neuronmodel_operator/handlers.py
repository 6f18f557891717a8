"""kopf glue: which events reconcile which NeuronModel, and the kopf settings, chosen deliberately.

- NeuronModel create / update / resume run one reconcile and report its outcome to kopf: an API error that
  heals by itself is a `kopf.TemporaryError` (retried with backoff), a spec the operator cannot serve is a
  `kopf.PermanentError` (after the Failed condition and an Event are written; no retry until the spec changes).
- Any event of a child (Deployment, LeaderWorkerSet, Job, Service, ConfigMap, PDB, HPA, serving Pod), found by
  the `managed-by` label, re-runs its owner's reconcile: a deleted or hand-edited child is restored within
  seconds, and the status follows the pods. Runs are serialised per NeuronModel and coalesced: a burst of pod
  events costs one extra reconcile, not one each.
- No delete handler, timer or daemon: each would make kopf add a finalizer, and deleting a NeuronModel while the
  operator is down would hang. Children are deleted by the garbage collector through their ownerReferences.
- Progress and the last-handled spec live in annotations under `neuronmodel.dev/` (a structural schema would
  prune kopf's status fields); kopf's own Events ("Handler succeeded") are off, ours say what happened.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import kopf

from neuronmodel_operator import api
from neuronmodel_operator.k8s import ApiError
from neuronmodel_operator.reconcile import Outcome, Reconcile

log = logging.getLogger(__name__)

registry = kopf.OperatorRegistry()

RETRY_DELAY_S = 5.0
#: Children whose events re-run their owner's reconcile: (group, version, plural).
CHILDREN = (("", "v1", "configmaps"), ("", "v1", "services"), ("", "v1", "pods"), ("apps", "v1", "deployments"),
            ("batch", "v1", "jobs"), ("policy", "v1", "poddisruptionbudgets"),
            ("autoscaling", "v2", "horizontalpodautoscalers"), ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets"))
OURS = {api.LABEL_MANAGED_BY: api.OPERATOR_NAME, api.LABEL_NAME: kopf.PRESENT}


@dataclass
class Reconciler:
    """Runs `reconcile` on worker threads, one run at a time per NeuronModel, coalescing kicks."""

    reconcile: Reconcile
    executor: ThreadPoolExecutor
    locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)
    kicked: set[tuple[str, str]] = field(default_factory=set)

    async def run(self, key: tuple[str, str], cleanup: bool) -> Outcome:
        lock = self.locks.setdefault(key, asyncio.Lock())
        async with lock:
            self.kicked.discard(key)  # this run sees every change made before it started
            outcome = await asyncio.get_running_loop().run_in_executor(self.executor, self.reconcile, *key, cleanup)
        if outcome.gone:
            self.locks.pop(key, None)
        return outcome

    def kick(self, key: tuple[str, str]) -> None:
        """Reconcile `key` soon; kicks that arrive while one is queued are folded into it."""
        if key not in self.kicked:
            self.kicked.add(key)
            asyncio.get_running_loop().create_task(self._kicked(key))

    async def _kicked(self, key: tuple[str, str]) -> None:
        try:
            await self.run(key, cleanup=False)
        except ApiError as exc:
            log.warning("reconcile of %s/%s after a child event failed (%s); retrying in %.0f s", *key, exc,
                        RETRY_DELAY_S)
            asyncio.get_running_loop().call_later(RETRY_DELAY_S, self.kick, key)
        except Exception:  # never let one object's bug stop the others
            log.exception("reconcile of %s/%s failed", *key)


def configure(settings: kopf.OperatorSettings, client_timeout_s: float) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=api.ANNOTATION_PREFIX, key="last-handled-configuration")
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
    kubernetes client does). Our own registry does not get kopf's default login handlers."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.resume(api.GROUP, api.VERSION, api.PLURAL, registry=registry)
@kopf.on.create(api.GROUP, api.VERSION, api.PLURAL, registry=registry)
@kopf.on.update(api.GROUP, api.VERSION, api.PLURAL, field="spec", registry=registry)
async def reconcile_model(namespace: str, name: str, memo: Any, **_: Any) -> None:
    try:
        outcome = await memo.reconciler.run((namespace, name), cleanup=True)
    except ApiError as exc:
        raise kopf.TemporaryError(f"the API server failed ({exc}); retrying", delay=RETRY_DELAY_S) from None
    if outcome.spec_error:
        raise kopf.PermanentError(outcome.spec_error)


def _on_child_event(group: str, version: str, plural: str) -> None:
    @kopf.on.event(group, version, plural, labels=OURS, registry=registry, id=f"child-{plural}")
    async def child_changed(namespace: str, labels: dict, memo: Any, **_: Any) -> None:
        memo.reconciler.kick((namespace, labels[api.LABEL_NAME]))


for _group, _version, _plural in CHILDREN:
    _on_child_event(_group, _version, _plural)
