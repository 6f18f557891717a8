"""One level-based reconcile of one NeuronModel: read it, build what should exist, apply it, write the status.

Synchronous (it runs on a worker thread; `handlers.py` serialises runs per object). Idempotent: running it
twice, or after a crash halfway, converges on the same children (names are deterministic, server-side apply).

A serving model keeps serving while its spec changes:
- Compile gating: when the spec needs a compile Job and the Job has not succeeded yet, the serving workload keeps
  running what it runs now, exactly as recorded on it (`served.py`: the spec and its resolution, so an operator
  upgrade that changes a default compiles first too), with only the replica count taken from the new spec; a
  NeuronModel that has never served gets its Service only. The workload rolls once the Job succeeds. A spec change
  that keeps the compile key rolls at once, or not at all when the pod template is unchanged (replicas, say).
- A change of workload kind (nodes 1 <-> more): the new workload is created beside the old one, which keeps
  serving, and the Service and HPA stay on the old side until the new one is ready; then they follow it and the
  old workload is deleted.
- replicas -> autoscaling: spec.replicas is handed to another field manager at the live value before the
  operator's apply omits it (server-side apply would otherwise reset it to 1), so the HPA takes over from N.
- Runtime ConfigMaps are immutable and content-named; one is deleted only once no ReplicaSet, StatefulSet or pod
  of the model refers to it.
- Compile Jobs are named by their whole template: an edit is a new Job, never a 422 on an immutable template.

Two entry points, to keep the requests per event low (bench/operator.py counts them): a full run (`changed` is
None: the NeuronModel was created, changed or resumed; or a child changed of a model whose compile Job has not
succeeded, whose rollout is held, whose kind change is pending, or whose generation no full run applied yet)
applies every child; a refresh (`changed` holds the children whose events arrived) re-applies only a child that
was deleted or no longer holds what we set, and recomputes the status only when the workload, the HPA or a pod
changed. The last status written per object is
remembered, so a reconcile never needs the NeuronModel's freshest copy to know what it already reported.
"""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Optional

from neuronmodel_operator import api, builders, ownership, revisions, status
from neuronmodel_operator.builders.common import (COMPONENT_COMPILE, LWS_SUFFIX, Target, selector, selector_string,
                                                  target_from_body, workload_name)
from neuronmodel_operator.builders.service import endpoint
from neuronmodel_operator.k8s import ApiError, Kube
from neuronmodel_operator.replica_handover import hand_over_replicas, match_replicas
from neuronmodel_operator.resolve import OperatorDefaults, Resolved
from neuronmodel_operator.served import UnreadableRecord, served_target
from neuronmodel_operator.stale_children import CHILD_KINDS, REFERENCED_KINDS, REVISION_HOLDERS, delete_stale

log = logging.getLogger(__name__)

#: Children that follow the side that serves while a model changes workload kind.
FOLLOW_THE_SERVING_SIDE = ("Service", "HorizontalPodAutoscaler")
#: The label the Job controller puts on a Job's pods (Kubernetes 1.27+).
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


@dataclass(frozen=True)
class Outcome:
    spec_error: Optional[str] = None  # the spec cannot be served: no retry until it changes
    child_error: Optional[str] = None  # the API server refused a child (a 4xx): reported, retried with backoff
    gone: bool = False  # the NeuronModel no longer exists (or is being deleted)
    held: bool = False  # the rollout waits for the compile Job


def _time(stamp: str) -> datetime:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def _has(obj: Optional[dict], *types: str) -> bool:
    """Is a condition of one of `types` True on the object?"""
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") in types and c.get("status") == "True" for c in conditions)


def _succeeded(job: Optional[dict]) -> bool:
    return _has(job, "Complete")


def _kind(target: Target) -> str:
    return "LeaderWorkerSet" if target.multi_node else "Deployment"


def _ready(workload: Optional[dict]) -> bool:
    """The workload serves its whole desired count: its controller has seen its spec (where the kind says so: LWS
    v0.7 publishes no observedGeneration) and readyReplicas >= spec.replicas."""
    if workload is None:
        return False
    state = workload.get("status") or {}
    if "observedGeneration" in state and state["observedGeneration"] < workload["metadata"].get("generation", 1):
        return False
    return state.get("readyReplicas", 0) >= (workload.get("spec") or {}).get("replicas", 1)


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
    """A workload whose controller has not yet observed the generation just applied: its status says nothing
    about this spec yet, and the controller's next status write (an event that refreshes the status) will. Writing
    the status now would cost one more NeuronModel write, and one more kopf event, per change. Only where the
    status says so: LeaderWorkerSet before v0.9 publishes no observedGeneration (status.py reads its conditions)."""
    if workload is None:
        return False
    state = workload.get("status") or {}
    if workload.get("kind") == "Deployment":
        return state.get("observedGeneration", 0) < workload["metadata"].get("generation", 1)
    return "observedGeneration" in state and state["observedGeneration"] < workload["metadata"].get("generation", 1)


class Reconcile:
    """Applies desired state for one object per call; `defaults` fill what specs leave unset."""

    def __init__(self, kube: Kube, defaults: OperatorDefaults, parallel_applies: int = 16):
        self.kube = kube
        self.defaults = defaults
        # A model's serving children are independent objects (pods wait for their ConfigMap): applied at once, a
        # reconcile costs one round trip instead of three to five.
        self._appliers = ThreadPoolExecutor(max_workers=parallel_applies, thread_name_prefix="apply")
        self._reported: dict[str, dict] = {}  # uid -> the last status written (only this operator writes it)
        self._switching: set[str] = set()  # uids whose old-kind workload serves until the new one is ready
        self._hpas: dict[str, dict] = {}  # uid -> the HPA as last applied or seen (status reads its conditions)
        self._ours: dict[str, set[tuple[str, str]]] = {}  # uid -> (kind, name) of children known to be its own
        self._settled: dict[str, dict] = {}  # uid -> the succeeded compile Job of the key its workload serves
        self._applied: dict[str, int] = {}  # uid -> the generation this process's last full run applied

    def __call__(self, namespace: str, name: str, cleanup: bool, body: Optional[dict] = None,
                 changed: Optional[Changes] = None) -> Outcome:
        """`body`: the NeuronModel if the caller has a recent copy (else it is read); `changed`: see the module."""
        if body is None:
            body = self.kube.get(api.KIND, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            if body is not None:
                self.forget(body["metadata"]["uid"])
            return Outcome(gone=True)  # children go with it through their ownerReferences
        self._ours.get(body["metadata"]["uid"], set()).difference_update(
            key for key, live in (changed or {}).items() if live is None)  # deleted: its name may be taken next
        try:
            target = self._target(body)
        except api.SpecError as exc:
            return self._refuse(body, exc)
        except revisions.HubUnavailable as exc:  # retried with backoff; no child is changed meanwhile
            log.warning("%s/%s: %s", namespace, name, exc)
            previous = self._previous(body)
            self._publish(body, previous, status.hub_unavailable(previous, body["metadata"].get("generation", 1),
                                                                 f"{exc}; {revisions.RETRYING}",
                                                                 datetime.now(timezone.utc)))
            return Outcome(child_error=str(exc))
        resolved = target.resolved
        switching = target.uid in self._switching
        try:
            # A compile-cache model needs the full run only while its Job runs, its rollout is held or its kind
            # changes; once its workload serves its compiled key, a child event costs what any model's does.
            settled = not resolved.compile_job or self._compiled_job(target) is not None
            if changed is not None and settled and not switching and self._has_applied(body):
                return self._refresh(body, target, changed)
            return self._apply(body, target, cleanup or switching)
        except api.SpecError as exc:  # found only once the children are built: two sources at one path, say
            return self._refuse(body, exc)
        except ownership.AlreadyOwned as exc:
            return self._refused_child(body, target, "AlreadyOwned", str(exc))
        except ApiError as exc:
            if exc.retryable:
                raise
            # Our own object shape (or an admission policy) was refused: say which child and why, and try again
            # with backoff; a spec change retries at once. Never a permanent failure.
            return self._refused_child(body, target, *ownership.refused(exc.message, exc.admission))

    def _refused_child(self, body: dict, target: Target, reason: str, message: str) -> Outcome:
        """A child the API server refused, or one the operator may not write: the Failed status and a Warning Event
        say which and why; retried with backoff."""
        self._write_status(body, target.resolved, target, message, None, None, [], held=False, error_reason=reason)
        return Outcome(child_error=message)

    def _refuse(self, body: dict, exc: api.SpecError) -> Outcome:
        """A spec the operator cannot serve: the Failed status says why; no retry until the spec changes."""
        self._write_status(body, None, None, str(exc), None, None, [], held=False)
        return Outcome(spec_error=str(exc))

    def _target(self, body: dict) -> Target:
        """The Target of `body`, its hf:// sources pinned to commits: the ones recorded in the status are reused,
        any other is resolved now, once (revisions.py), and recorded in status.resolved with the rest."""
        known = ((self._previous(body).get("resolved") or {}).get("revisions")) or {}
        pins: dict[str, str] = {}

        def pin(spec: api.NeuronModelSpec) -> api.NeuronModelSpec:
            pinned, used = revisions.pin(spec, known)
            pins.update(used)
            return pinned

        target = target_from_body(body, self.defaults, pin)
        draft = target.spec.speculation.draft_model
        hf = "hf://"
        resolved = dataclasses.replace(
            target.resolved, revisions=pins,
            model_revision=target.spec.model.revision if target.spec.model.source.startswith(hf) else None,
            draft_revision=draft.revision if draft is not None and draft.source.startswith(hf) else None)
        return dataclasses.replace(target, resolved=resolved)

    def _apply(self, body: dict, target: Target, cleanup: bool) -> Outcome:
        # A compile key that a Job (of any template) has compiled, or compiles now, needs no new Job: an edit
        # outside the key rolls at once (or once that Job is done). Otherwise the Job of the current template runs.
        compile_children = builders.compile_children(target)
        job = self._compiled(target, next((m["metadata"]["name"] for m in compile_children if m["kind"] == "Job"),
                                          None))
        if job is not None:
            compile_children = []
        for manifest in compile_children:
            applied = self.kube.apply(manifest)
            if manifest["kind"] == "Job":
                job = applied
        # The live workloads of both kinds: what serves now (a model that changed kind still has the other one).
        live = self._workloads(target) if cleanup or target.resolved.compile_job else {}
        serving: Optional[Target] = target
        held, frozen = False, None  # frozen: the live workload, left as it is (its served record is unreadable)
        if target.resolved.compile_job and not _succeeded(job):
            running = live.get(_kind(target)) or next(iter(live.values()), None)
            try:
                previous = served_target(running, target, self.defaults)
            except UnreadableRecord as exc:
                log.warning("%s/%s: %s: it is left as it is until the compile Job succeeds", target.namespace,
                            target.name, exc)
                previous, serving, held, frozen = None, None, True, running
            if previous is not None and previous.resolved.compile_key != target.resolved.compile_key:
                serving, held = previous, True
            elif running is None:
                serving = None  # never served: nothing to run until the artifacts exist
        leaving = None  # the other kind's workload serves until the new one is ready
        if serving is not None:
            old = next((w for kind, w in live.items() if kind != _kind(serving)), None)
            leaving = self._leaving(old, target) if old is not None else None
        desired = self._desired(serving or target, leaving, service_only=serving is None)
        self._claim(target, desired)
        hand_over_replicas(self.kube, desired, live)
        if leaving is not None and serving.spec.autoscaling is not None:
            match_replicas(self.kube, desired, live, live[_kind(leaving)])
        applied = dict(zip(((m["kind"], m["metadata"]["name"]) for m in desired),
                           self._appliers.map(self.kube.apply, desired)))
        workload = applied.get((_kind(serving), workload_name(serving))) if serving else frozen
        if leaving is not None and _ready(workload):
            desired, leaving = self._switch_over(serving, leaving), None
        if leaving is not None:
            self._switching.add(target.uid)
        else:
            self._switching.discard(target.uid)
        if target.resolved.compile_job and _succeeded(job) and leaving is None:
            self._settled[target.uid] = job
        else:
            self._settled.pop(target.uid, None)
        if frozen is None and (cleanup or (target.resolved.compile_job and not held)):
            keep = {(m["kind"], m["metadata"]["name"]) for m in desired + compile_children}
            if job is not None:
                keep |= {("Job", job["metadata"]["name"]), ("ConfigMap", job["metadata"]["name"])}
            if leaving is not None:
                keep |= {(_kind(leaving), workload_name(leaving))}
                if (config := builders.serving_configmap_name(leaving)) is not None:  # none for engine vllm
                    keep.add(("ConfigMap", config))
            delete_stale(self.kube, target, keep, CHILD_KINDS if cleanup else ("Job", *REFERENCED_KINDS),
                         self._ours.get(target.uid, set()))
        hpa = next((obj for (kind, _), obj in applied.items() if kind == "HorizontalPodAutoscaler"), None)
        self._remember_hpa(target, hpa)
        if not _awaiting_controller(workload):
            self._write_status(body, target.resolved, target, None, workload, job,
                               self._pods(target, workload), held)
        self._applied[target.uid] = body["metadata"].get("generation", 1)
        return Outcome(held=held)

    def _has_applied(self, body: dict) -> bool:
        """A full run applied the children of `body`'s generation: in this process, else in an earlier one (its
        status was written for it). A child event handled after the watch showed a new spec, but before that spec's
        full run, must take the full run: a refresh would write the new generation's status from the old children
        (Ready "1/1" for a spec that asks for 2)."""
        meta = body["metadata"]
        done = self._applied.get(meta["uid"], (body.get("status") or {}).get("observedGeneration"))
        return done == meta.get("generation", 1)

    def _remember_hpa(self, target: Target, hpa: Optional[dict]) -> None:
        if hpa is not None and target.spec.autoscaling is not None:
            self._hpas[target.uid] = hpa
        else:
            self._hpas.pop(target.uid, None)

    def _switch_over(self, serving: Target, leaving: Target) -> list[dict]:
        """The new kind's workload is ready: the Service and HPA follow it, the old workload goes. The children
        wanted from now on."""
        log.info("%s/%s: the %s serves; removing the %s", serving.namespace, serving.name, _kind(serving),
                 _kind(leaving))
        desired = builders.serving_children(serving)
        for manifest in desired:
            if manifest["kind"] in FOLLOW_THE_SERVING_SIDE:
                self.kube.apply(manifest)
        self.kube.delete(_kind(leaving), leaving.namespace, workload_name(leaving))
        return desired

    @staticmethod
    def _desired(serving: Target, leaving: Optional[Target], service_only: bool) -> list[dict]:
        """The serving children of `serving`; while `leaving` still serves, its Service and HPA instead."""
        desired = builders.serving_children(serving)
        if service_only:
            return [m for m in desired if m["kind"] == "Service"]
        if leaving is None:
            return desired
        old = {m["kind"]: m for m in builders.serving_children(leaving) if m["kind"] in FOLLOW_THE_SERVING_SIDE}
        return [old.pop(m["kind"], m) if m["kind"] in FOLLOW_THE_SERVING_SIDE else m for m in desired] + \
            list(old.values())  # an old HPA the new spec has none of

    def _claim(self, target: Target, manifests: list[dict]) -> None:
        """Raise ownership.AlreadyOwned, before anything is written, if one of `manifests` names an object that
        exists and is not this model's. One GET each, at once, for the children of fixed names not known to be its
        own yet (a model's first reconcile in this process; a new PDB or HPA); what was found its own is known."""
        ours = self._ours.setdefault(target.uid, set())
        unknown = [m for m in manifests if m["kind"] not in ownership.NAMED_BY_CONTENT and
                   (m["kind"], m["metadata"]["name"]) not in ours]
        found = self._appliers.map(lambda m: self.kube.get(m["kind"], target.namespace, m["metadata"]["name"]),
                                   unknown)
        for manifest, live in zip(unknown, found):
            if ownership.foreign(live, target.uid):
                raise ownership.AlreadyOwned(manifest["kind"], target.namespace, manifest["metadata"]["name"], live,
                                             target.name)
        ours.update((m["kind"], m["metadata"]["name"]) for m in unknown)

    def _workloads(self, target: Target) -> dict[str, dict]:
        """The live Deployment and LeaderWorkerSet of the model, by kind (one GET each)."""
        found = {}
        for kind, name in (("Deployment", target.name), ("LeaderWorkerSet", target.name + LWS_SUFFIX)):
            obj = self.kube.get(kind, target.namespace, name)
            if obj is not None and any(ref.get("uid") == target.uid
                                       for ref in obj["metadata"].get("ownerReferences") or []):
                found[kind] = obj
        return found

    def _leaving(self, old: dict, target: Target) -> Optional[Target]:
        """The Target the other kind's live workload serves, None when its record cannot be read (it goes)."""
        try:
            return served_target(old, target, self.defaults)
        except UnreadableRecord as exc:
            log.warning("%s/%s: %s", target.namespace, target.name, exc)
            return None

    def _refresh(self, body: dict, target: Target, changed: Changes) -> Outcome:
        """Restore the changed children that drifted; the status when the workload, the HPA or a pod changed; the
        runtime ConfigMaps no revision uses any more when a ReplicaSet or pod is gone."""
        desired = {(m["kind"], m["metadata"]["name"]): m for m in builders.serving_children(target)}
        workload_key = (_kind(target), workload_name(target))
        workload, status_changed = None, False
        for key, live in changed.items():
            wanted = desired.get(key)
            if wanted is not None and (live is None or not contains(live, wanted)):
                log.info("restoring %s %s/%s", key[0], target.namespace, key[1])
                self._claim(target, [wanted])
                live = self.kube.apply(wanted)
            if key == workload_key:
                workload, status_changed = live, True
            if key[0] == "HorizontalPodAutoscaler":
                self._remember_hpa(target, live)
            status_changed |= key[0] in ("Pod", "HorizontalPodAutoscaler")
        if any(live is None and key[0] in REVISION_HOLDERS for key, live in changed.items()):
            delete_stale(self.kube, target, set(desired), REFERENCED_KINDS, self._ours.get(target.uid, set()))
        if status_changed:
            if workload is None:
                workload = self.kube.get(workload_key[0], target.namespace, workload_key[1])
            if _awaiting_controller(workload):
                return Outcome()
            self._write_status(body, target.resolved, target, None, workload, self._compiled_job(target),
                               self._pods(target, workload), held=False)
        return Outcome()

    def _compiled_job(self, target: Target) -> Optional[dict]:
        """The succeeded compile Job of the target's key that its workload serves (as the last full run saw it)."""
        job = self._settled.get(target.uid)
        keys = ((job or {}).get("metadata") or {}).get("annotations") or {}
        return job if keys.get(api.ANNOTATION_COMPILE_KEY) == target.resolved.compile_key else None

    def _pods(self, target: Target, workload: Optional[dict]) -> list:
        """The serving pods, every pod of a multi-node group (status reads what blocks any of them, readiness from
        the leaders); none to list for an empty workload."""
        if workload is None:
            return []
        desired = (workload.get("spec") or {}).get("replicas", 1)
        if desired == 0 and not (workload.get("status") or {}).get("replicas"):
            return []
        return self.kube.list("Pod", target.namespace, ",".join(f"{k}={v}" for k, v in selector(target).items()))

    def forget(self, uid: str) -> None:
        """The NeuronModel is gone: drop what was remembered of it."""
        self._reported.pop(uid, None)
        self._switching.discard(uid)
        self._hpas.pop(uid, None)
        self._ours.pop(uid, None)
        self._settled.pop(uid, None)
        self._applied.pop(uid, None)

    def report_access_denied(self, body: dict, message: str) -> None:
        """Put a persisting 401/403 where users look: status.warnings (the next successful reconcile's status
        drops it) and a Warning Event. Either may be refused as well: that is logged, never raised."""
        previous = self._previous(body)
        warnings = list(previous.get("warnings") or [])
        current = {**previous, "warnings": [*warnings, message]}
        meta = body["metadata"]
        log.error("%s/%s: %s", meta["namespace"], meta["name"], message)
        try:
            self.kube.patch_status(meta["namespace"], meta["name"], status.merge_patch(previous, current))
            self._reported[meta["uid"]] = current
            self.kube.event(body, "Warning", "APIAccessDenied", message)
        except ApiError as exc:
            log.error("%s/%s: could not report it either (%s)", meta["namespace"], meta["name"], exc)

    def _hpa(self, target: Target) -> Optional[dict]:
        """The model's HPA under spec.autoscaling (remembered, else read once), None without autoscaling."""
        if target.spec.autoscaling is None:
            return None
        if target.uid not in self._hpas:
            live = self.kube.get("HorizontalPodAutoscaler", target.namespace, target.name)
            if live is None:
                return None
            self._hpas[target.uid] = live
        return self._hpas[target.uid]

    def _previous(self, body: dict) -> dict:
        return self._reported.get(body["metadata"]["uid"]) or body.get("status") or {}

    def _compiled(self, target: Target, current: Optional[str]) -> Optional[dict]:
        """The compile Job of the target's compile key to go on with: a succeeded one, else one of another template
        (a toleration, a ServiceAccount edited) whose pod runs the compile and none failed: replacing it would throw
        hours of compile away. None when there is neither (or no Job is needed): the Job `current` runs.
        A pending Job of another template is replaced: the edit may be what lets it schedule."""
        if not target.resolved.compile_job:
            return None
        selector = f"{api.LABEL_NAME}={target.name},{api.LABEL_COMPONENT}={COMPONENT_COMPILE}"
        of_key = [job for job in self.kube.list("Job", target.namespace, selector)
                  if (job["metadata"].get("annotations") or {}).get(api.ANNOTATION_COMPILE_KEY)
                  == target.resolved.compile_key]
        return next((job for job in of_key if _succeeded(job)), None) or \
            next((job for job in of_key if job["metadata"]["name"] != current and self._compiling(job)), None)

    def _compiling(self, job: dict) -> bool:
        """The Job's pod runs (scheduled), no pod of it failed and the Job has not failed."""
        state = job.get("status") or {}
        if not state.get("active") or state.get("failed") or _has(job, "Failed", "FailureTarget"):
            return False
        pods = self.kube.list("Pod", job["metadata"]["namespace"], f"{JOB_NAME_LABEL}={job['metadata']['name']}")
        return any(_has(pod, "PodScheduled") for pod in pods)

    def _write_status(self, body: dict, resolved: Optional[Resolved], target: Optional[Target],
                      spec_error: Optional[str], workload: Optional[dict], job: Optional[dict], pods: list,
                      held: bool, error_reason: str = "InvalidSpec") -> None:
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
            compile_cache_url=target.spec.compile_cache.url if target else None,
            hpa=self._hpa(target) if target else None, error_reason=error_reason,
            compile_pods=self._failed_attempts(job))
        self._publish(body, previous, status.status(observed))

    def _failed_attempts(self, job: Optional[dict]) -> list:
        """The pods of a compile Job an attempt of which failed (status quotes why: vLLM's own lines, say); none
        to list while no attempt failed."""
        if job is None or not ((job.get("status") or {}).get("failed") or _has(job, "Failed", "FailureTarget")):
            return []
        return self.kube.list("Pod", job["metadata"]["namespace"], f"{JOB_NAME_LABEL}={job['metadata']['name']}")

    def _publish(self, body: dict, previous: dict, current: dict) -> None:
        """Write `current` over `previous` (only if it changed) and the Events the change is worth."""
        meta = body["metadata"]
        if current != previous:
            self.kube.patch_status(meta["namespace"], meta["name"], status.merge_patch(previous, current))
        self._reported[meta["uid"]] = current
        for type_, reason, message in status.events(previous, current):
            self.kube.event(body, type_, reason, message)
