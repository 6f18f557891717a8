"""One level-based reconcile of one NeuronModel: read it, build what should exist, apply it, write the status.

Synchronous (it runs on a worker thread; `handlers.py` serialises runs per object). Idempotent: running it
twice, or after a crash halfway, converges on the same children (names are deterministic, server-side apply).

Compile gating: when the spec needs a compile Job and the Job has not succeeded yet, the serving workload keeps
running the spec it runs now (read back from its `served-spec` annotation), with only the replica count taken
from the new spec; a NeuronModel that has never served gets its Service only. The workload rolls once the Job
succeeds. A spec change that keeps the compile key rolls at once, or not at all when the pod template is unchanged
(replicas, say).

Two entry points, to keep the requests per event low (bench/operator.py counts them): a full run (`changed` is
None: the NeuronModel was created, changed or resumed, or a child of a model with a compile Job changed) applies
every child; a refresh (`changed` holds the children whose events arrived) re-applies only a child that was
deleted or no longer holds what we set, and recomputes the status only when the workload or a pod changed. The
last status written per object is remembered, so a reconcile never needs the NeuronModel's freshest copy to
know what it already reported.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Optional

from neuronmodel_operator import api, builders, status
from neuronmodel_operator.builders.common import Target, selector_string, target_from_body, workload_name
from neuronmodel_operator.builders.service import endpoint
from neuronmodel_operator.k8s import ApiError, Kube
from neuronmodel_operator.resolve import OperatorDefaults, Resolved, resolve

log = logging.getLogger(__name__)

#: Kinds of children, each listed by label when stale ones must go (a model switched to multi-node, a PDB no
#: longer needed, the compile Job of an old key).
CHILD_KINDS = ("ConfigMap", "Job", "Deployment", "LeaderWorkerSet", "Service", "PodDisruptionBudget",
               "HorizontalPodAutoscaler")


@dataclass(frozen=True)
class Outcome:
    spec_error: Optional[str] = None  # the spec cannot be served: no retry until it changes
    gone: bool = False  # the NeuronModel no longer exists (or is being deleted)
    held: bool = False  # the rollout waits for the compile Job


def _time(stamp: str) -> datetime:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def _succeeded(job: Optional[dict]) -> bool:
    conditions = (job or {}).get("status", {}).get("conditions") or []
    return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)


def _served_target(workload: Optional[dict], target: Target, defaults: OperatorDefaults) -> Optional[Target]:
    """The target the workload serves now, when it differs in compile key from `target`; replicas from `target`."""
    annotations = ((workload or {}).get("metadata") or {}).get("annotations") or {}
    served = annotations.get(api.ANNOTATION_SERVED_SPEC)
    if served is None:
        return None
    try:
        spec = defaults.filled(api.parse_spec(json.loads(served)))
        resolved = resolve(spec, defaults)
    except (ValueError, api.SpecError):
        return None  # an annotation we cannot read is not worth holding a rollout for
    if resolved.compile_key == target.resolved.compile_key:
        return None
    spec = spec.model_copy(update={"replicas": target.spec.replicas, "autoscaling": target.spec.autoscaling})
    return replace(target, spec=spec, resolved=replace(resolved, compile_job=target.resolved.compile_job))


def contains(live: object, wanted: object) -> bool:
    """Does the live object still hold everything we set? (The server adds defaults; it never drops our fields
    unless someone edited them.) A false "no" costs one no-op apply, never a wrong object."""
    if isinstance(wanted, dict):
        return isinstance(live, dict) and all(key in live and contains(live[key], value)
                                              for key, value in wanted.items())
    if isinstance(wanted, list):
        return isinstance(live, list) and len(live) == len(wanted) and all(map(contains, live, wanted))
    return live == wanted


#: (kind, name) -> the child as its event showed it, None when it was deleted.
Changes = dict[tuple[str, str], Optional[dict]]


def _awaiting_controller(workload: Optional[dict]) -> bool:
    """A Deployment whose controller has not yet observed the generation just applied: its status says nothing
    about this spec yet, and the controller's next status write (an event that refreshes the status) will. Writing
    the status now would cost one more NeuronModel write, and one more kopf event, per change."""
    if workload is None or workload.get("kind") != "Deployment":
        return False
    observed = (workload.get("status") or {}).get("observedGeneration", 0)
    return observed < workload["metadata"].get("generation", 1)


class Reconcile:
    """Applies desired state for one object per call; `defaults` fill what specs leave unset."""

    def __init__(self, kube: Kube, defaults: OperatorDefaults, parallel_applies: int = 16):
        self.kube = kube
        self.defaults = defaults
        # A model's serving children are independent objects (pods wait for their ConfigMap): applied at once, a
        # reconcile costs one round trip instead of three to five.
        self._appliers = ThreadPoolExecutor(max_workers=parallel_applies, thread_name_prefix="apply")
        self._reported: dict[str, dict] = {}  # uid -> the last status written (only this operator writes it)

    def __call__(self, namespace: str, name: str, cleanup: bool, body: Optional[dict] = None,
                 changed: Optional[Changes] = None) -> Outcome:
        """`body`: the NeuronModel if the caller has a recent copy (else it is read); `changed`: see the module."""
        if body is None:
            body = self.kube.get(api.KIND, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            if body is not None:
                self._reported.pop(body["metadata"]["uid"], None)
            return Outcome(gone=True)  # children go with it through their ownerReferences
        try:
            target = target_from_body(body, self.defaults)
        except api.SpecError as exc:
            self._write_status(body, None, None, str(exc), None, None, [], held=False)
            return Outcome(spec_error=str(exc))
        resolved = target.resolved
        try:
            if changed is not None and not resolved.compile_job:
                return self._refresh(body, target, changed)
            return self._apply(body, target, cleanup)
        except ApiError as exc:
            if exc.retryable:
                raise
            message = f"the API server refused a child of this NeuronModel: {exc.message}"
            self._write_status(body, resolved, target, message, None, None, [], held=False)
            return Outcome(spec_error=message)

    def _apply(self, body: dict, target: Target, cleanup: bool) -> Outcome:
        job = None
        for manifest in builders.compile_children(target):
            applied = self.kube.apply(manifest)
            if manifest["kind"] == "Job":
                job = applied
        workload_kind = "LeaderWorkerSet" if target.multi_node else "Deployment"
        serving: Optional[Target] = target
        held = False
        if target.resolved.compile_job and not _succeeded(job):
            existing = self.kube.get(workload_kind, target.namespace, workload_name(target))
            previous = _served_target(existing, target, self.defaults)
            if previous is not None:
                serving, held = previous, True
            elif existing is None:
                serving = None  # never served: nothing to run until the artifacts exist
        desired = builders.serving_children(serving) if serving else \
            [m for m in builders.serving_children(target) if m["kind"] == "Service"]
        workload = None
        for manifest, applied in zip(desired, self._appliers.map(self.kube.apply, desired)):
            if manifest["kind"] == workload_kind:
                workload = applied
        if cleanup or (target.resolved.compile_job and not held):
            keep = {(m["kind"], m["metadata"]["name"]) for m in desired + builders.compile_children(target)}
            self._delete_stale(target, keep, full=cleanup)
        if not _awaiting_controller(workload):
            self._write_status(body, target.resolved, target, None, workload, job, self._pods(target, workload),
                               held)
        return Outcome(held=held)

    def _refresh(self, body: dict, target: Target, changed: Changes) -> Outcome:
        """Restore the changed children that drifted; the status when the workload or a pod changed."""
        desired = {(m["kind"], m["metadata"]["name"]): m for m in builders.serving_children(target)}
        workload_key = ("LeaderWorkerSet" if target.multi_node else "Deployment", workload_name(target))
        workload, status_changed = None, False
        for key, live in changed.items():
            wanted = desired.get(key)
            if wanted is not None and (live is None or not contains(live, wanted)):
                log.info("restoring %s %s/%s", key[0], target.namespace, key[1])
                live = self.kube.apply(wanted)
            if key == workload_key:
                workload, status_changed = live, True
            status_changed |= key[0] == "Pod"
        if status_changed:
            if workload is None:
                workload = self.kube.get(workload_key[0], target.namespace, workload_key[1])
            if _awaiting_controller(workload):
                return Outcome()
            self._write_status(body, target.resolved, target, None, workload, None,
                               self._pods(target, workload), held=False)
        return Outcome()

    def _pods(self, target: Target, workload: Optional[dict]) -> list:
        """The serving pods (status reads their scheduling and readiness); none to list for an empty workload."""
        if workload is None:
            return []
        desired = (workload.get("spec") or {}).get("replicas", 1)
        if desired == 0 and not (workload.get("status") or {}).get("replicas"):
            return []
        return self.kube.list("Pod", target.namespace, selector_string(target))

    def forget(self, uid: str) -> None:
        """The NeuronModel is gone: drop what was remembered of it."""
        self._reported.pop(uid, None)

    def _previous(self, body: dict) -> dict:
        return self._reported.get(body["metadata"]["uid"]) or body.get("status") or {}

    def _delete_stale(self, target: Target, keep: set, full: bool) -> None:
        """Children with our label that the current spec does not want. Without `full`, only compile leftovers."""
        selector = f"{api.LABEL_NAME}={target.name},{api.LABEL_MANAGED_BY}={api.OPERATOR_NAME}"
        for kind in CHILD_KINDS if full else ("Job", "ConfigMap"):
            for child in self.kube.list(kind, target.namespace, selector):
                meta = child["metadata"]
                owned = any(ref.get("uid") == target.uid for ref in meta.get("ownerReferences") or [])
                if owned and (kind, meta["name"]) not in keep:
                    log.info("deleting stale %s %s/%s", kind, target.namespace, meta["name"])
                    self.kube.delete(kind, target.namespace, meta["name"])

    def _write_status(self, body: dict, resolved: Optional[Resolved], target: Optional[Target],
                      spec_error: Optional[str], workload: Optional[dict], job: Optional[dict], pods: list,
                      held: bool) -> None:
        meta = body["metadata"]
        previous = self._previous(body)
        spec_replicas = (body.get("spec") or {}).get("replicas")
        observed = status.Observed(
            generation=meta.get("generation", 1), created=_time(meta["creationTimestamp"]), previous=previous,
            resolved=resolved, spec_error=spec_error,
            desired_replicas=target.spec.replica_count() if target else (spec_replicas or 0),
            workload=workload, compile_job=job, compile_required=bool(resolved and resolved.compile_job),
            rollout_held=held, pods=pods, endpoint=endpoint(target) if target else "",
            selector=selector_string(target) if target else "", now=datetime.now(timezone.utc),
            compile_cache_url=target.spec.compile_cache.url if target else None)
        current = status.status(observed)
        if current != previous:
            self.kube.patch_status(meta["namespace"], meta["name"], status.merge_patch(previous, current))
        self._reported[meta["uid"]] = current
        for type_, reason, message in status.events(previous, current):
            self.kube.event(body, type_, reason, message)
