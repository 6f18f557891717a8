"""A NeuronModel's status, computed from what the handler observed; and the Events worth sending about a change.

Pure: no I/O, no Kubernetes client, no clock (the caller passes `now`). Input objects are camelCase dicts as the
API server returns them. The output is the full status as a camelCase dict (it validates with
`api.NeuronModelStatus`); keys whose value is unknown are left out, so an unchanged model yields a dict equal to
the stored one and the handler can skip the write. `merge_patch` adds the nulls a JSON merge patch needs to remove
keys that went away.

Rules (tests/operator_tests/test_status.py checks each):

Desired replicas: the workload's `spec.replicas` (what the spec or the HPA asks for now), else
`Observed.desired_replicas` when there is no workload yet. `replicas` is the workload's `status.replicas`: ALL
pods (groups for a LeaderWorkerSet), ready or not, because the scale subresource reads it and an HPA fed ready
pods over-scales. `readyReplicas` is the workload's; `ready` is "<readyReplicas>/<desired>".

The rollout is complete when the workload controller has seen its latest spec, `updatedReplicas == replicas ==
desired`, and the rollout is not held. "Has seen": `status.observedGeneration >= metadata.generation` where the
status has one (a Deployment; a LeaderWorkerSet from LWS v0.9.0). LWS v0.7 and v0.8 publish no observedGeneration;
their controller sets Available True only when every group is ready on the current revision and then turns
Progressing and UpdateInProgress False, so there "has seen" is: Available True, neither of those True. A v0.7 status
in the moment between an apply that changes the template and the controller's first reconcile of it looks settled:
only the applier, which saw the generation change, can tell that it is stale.

While the Hub does not answer a revision the spec needs pinned, `hub_unavailable` writes the status instead: the
previous one with Progressing False/HubUnavailable (a new model: Pending, Ready False/HubUnavailable too).

Phase, first match wins (its reason and message are the Ready condition's):
  Failed     InvalidSpec     `spec_error` is set: the spec cannot be served; no retry until it changes. Or, with
                             that reason (`error_reason`), a child that cannot be written, retried with backoff:
             AlreadyOwned    an object of the child's kind and name exists and is not this model's (ownership.py);
             AdmissionDenied an admission webhook or ValidatingAdmissionPolicy refused the child.
  Failed     CompileFailed   the compile Job failed (condition Failed or FailureTarget True: backoffLimit or
                             activeDeadlineSeconds exceeded).
  Compiling  Compiling       a required compile Job has not succeeded (not created yet, created but not started,
                             or running), or the rollout is held. While held, the old pods keep serving: Available
                             stays True and Progressing says WaitingForArtifacts.
  Pending    ScaledToZero    desired replicas is 0.
  Pending    Creating        no workload yet, or it has no live pods (the Deployment's ReplicaFailure message, a
                             quota say, is the message).
  Pending    Unschedulable   no live pod is scheduled and some have PodScheduled=False: the scheduler's message
                             ("0/5 nodes are available: 5 Insufficient aws.amazon.com/neuroncore") is the message,
                             and for a multi-node group refused by its exclusive topology what to do (scheduler_hints.py:
                             free a node group for a surge group, or the key is on no node).
  Pending    Scheduling      no live pod is scheduled yet, none refused.
  Failed     NeuronDeviceAccessDenied  as ContainersFailing, and a container's termination message carries
                             DEVICE_ACCESS_MARKER (the runtime could not open /dev/neuron* as its non-root uid):
                             that message, which names the device, the uid and the node setting that fixes it.
  Failed     ArtifactsMissing  as ContainersFailing, and an init container's termination message carries
                             keys.ARTIFACTS_MISSING (engine vllm's `fetch-artifacts`: the compile cache holds no entry
                             for the compile key, and serving pods never compile): that message, naming the key.
  Failed     ContainersFailing  pods are scheduled, none is ready, and a container of every one is failing
                             (CrashLoopBackOff, ImagePullBackOff...: a wrong model path, a bad image): the first
                             container's reason is the message. The kubelet keeps retrying; the phase follows it.
  Loading    Loading         pods are scheduled, none is ready (weights loading, or compiling in place).
  Degraded   Degraded        0 < readyReplicas < desired.
  Loading    RollingOut      enough replicas are ready but the rollout is not complete (new pods loading).
  Ready      Ready           readyReplicas >= desired > 0 and the rollout is complete.
Loading and Degraded messages add what blocks the other pods (unschedulable, with scheduler_hints.py's advice, or a
container waiting reason such as CrashLoopBackOff). Live pods: not being deleted, not Succeeded/Failed. The pods of a
LeaderWorkerSet are every pod of its groups, workers too (a worker's ImagePullBackOff blocks its group); timings read
readiness from the leaders only.

Conditions, the four of CONDITION_TYPES in that order, then Autoscaling when the model has an HPA
(`Observed.hpa`, passed under spec.autoscaling only); each with observedGeneration and a message:
  ArtifactsReady  True/NotRequired (no Job: no compileCache.url, the pods compile in place; or policy Never, the
                  pods load from the cache), False/Compiling (Job pending or running; "retrying, attempt 3 of 5"
                  after failed pods, of backoffLimit+1), True/Compiled (with the compile seconds),
                  False/CompileFailed (the Job's Failed reason and message, the last failed attempt's container and
                  the tail of its termination message, and `kubectl logs job/<name>`),
                  Unknown/InvalidSpec (nothing resolved).
  Available       True/MinimumReplicasAvailable when >= 1 replica is available (the Deployment's
                  availableReplicas; readyReplicas for a LeaderWorkerSet), else False/NoReplicasAvailable.
  Progressing     first match: False/InvalidSpec (or the refused child's reason); False/CompileFailed;
                  True/WaitingForArtifacts (held, or compiling before any workload exists); True/Creating (no workload); False/ProgressDeadlineExceeded
                  (the Deployment's Progressing condition says so); True/RollingOut; True/RolloutComplete.
  Ready           True/Ready, or False with the phase's reason.
  Autoscaling     the HPA's AbleToScale and ScalingActive: False with the reason and message of the first of them
                  that is False (FailedGetPodsMetric: no custom metrics API, or no adapter rule for the metric);
                  True/ScalingActive when both are True; Unknown/NotEvaluated before the HPA controller wrote any
                  condition (or while one is Unknown).
lastTransitionTime (RFC 3339 UTC) is kept from the previous status while a condition's status stays the same and
set to `now` when it changes (metav1 semantics). One exception, so that a generation's start is on record:
Progressing is about the rollout of one generation, so its lastTransitionTime is also set to `now` on the first
reconcile of a new generation.

`resolved` is what the spec resolved to; a spec that resolves nothing (InvalidSpec) keeps only the previous
`resolved.revisions` (the hf:// pins): fixing the spec then serves the commits it served, not main's newest.

Timings, in seconds, each measured once and then kept:
  compileSeconds      the succeeded Job's completionTime - startTime; kept while the compile key is the same.
  loadSeconds         when the phase is Ready: the slowest ready live pod's Ready lastTransitionTime - its
                      status.startTime; kept for the generation.
  timeToReadySeconds  when the phase is first Ready in a generation: now - creationTimestamp for generation 1,
                      else now - Progressing's lastTransitionTime (the generation's first reconcile, see above;
                      later if Progressing went False and True again within the generation, a stalled rollout);
                      kept for the generation (once set it does not move, even if the phase leaves Ready).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Mapping, Optional, Sequence, Union

from neuronmodel_operator import scheduler_hints
from neuronmodel_operator.api import CONDITION_TYPES
from neuronmodel_operator.resolve import Resolved
from neuronmodel_operator.serving_pods import (FAILING, blockers, condition, failed_attempt, live_pods,
                                               termination_message, unschedulable, waiting)
from neuronmodel_runtime.config.keys import ARTIFACTS_MISSING

#: Ready reasons whose Event is a Warning; every other transition is Normal.
WARNING_REASONS = frozenset({"InvalidSpec", "CompileFailed", "ContainersFailing", "NeuronDeviceAccessDenied",
                             "ArtifactsMissing", "Unschedulable", "Degraded", "HubUnavailable", "AlreadyOwned",
                             "AdmissionDenied"})
#: Starts the runtime's termination message when it cannot open a Neuron device as its uid (the runtime's
#: frameworks.DEVICE_ACCESS_MARKER: the two packages share no code, tests/operator_tests/test_status.py pins both).
DEVICE_ACCESS_MARKER = "NeuronDeviceAccessDenied"
#: The HPA conditions that must both be True for it to scale (autoscaling/v2 HorizontalPodAutoscalerConditionType).
HPA_CONDITIONS = ("AbleToScale", "ScalingActive")
#: Condition reasons worth an Event of their own when a condition takes them (the phase does not show them).
CONDITION_EVENTS = {("ArtifactsReady", "Compiled"): "Normal", ("Progressing", "ProgressDeadlineExceeded"): "Warning"}


@dataclass(frozen=True)
class Observed:
    """Everything status is computed from (the handler reads it from the API server)."""

    generation: int  # metadata.generation of the NeuronModel
    created: datetime  # metadata.creationTimestamp (tz-aware)
    previous: Mapping  # the object's current .status (camelCase dict, maybe {}): keeps lastTransitionTime, timings
    resolved: Optional[Resolved]  # None when the spec cannot be served
    spec_error: Optional[str]  # the SpecError message when resolved is None
    desired_replicas: int  # spec.replica_count()
    workload: Optional[Mapping]  # the Deployment (or LeaderWorkerSet) as a camelCase dict from the API, None if absent
    compile_job: Optional[Mapping]  # the compile Job for the CURRENT compile key (camelCase dict), None if none exists
    compile_required: bool  # resolved.compile_job: a Job must succeed before serving the new spec
    rollout_held: bool  # the workload still serves an older spec while the new key compiles
    pods: Sequence[Mapping]  # serving pods (camelCase dicts)
    endpoint: str  # in-cluster URL
    selector: str  # label selector string of the serving pods
    now: datetime
    compile_cache_url: Optional[str] = None  # spec.compileCache.url: says why no Job is needed
    hpa: Optional[Mapping] = None  # the HorizontalPodAutoscaler (camelCase dict) under spec.autoscaling, else None
    compile_pods: Sequence[Mapping] = ()  # the compile Job's pods once an attempt of it failed (why it did), else none
    error_reason: str = "InvalidSpec"  # the reason of `spec_error`: AlreadyOwned, AdmissionDenied for a refused child


@dataclass(frozen=True)
class _Verdict:
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str


def _time(value: Union[str, datetime, None]) -> Optional[datetime]:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _stamp(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds(start, end) -> Optional[float]:
    start, end = _time(start), _time(end)
    return round((end - start).total_seconds(), 1) if start and end else None


def _name(obj: Mapping) -> str:
    return (obj.get("metadata") or {}).get("name", "")


# --- the compile Job -----------------------------------------------------------------------------------------

def _artifacts(o: Observed) -> _Verdict:
    job = o.compile_job
    if o.resolved is None:
        return _Verdict("Unknown", "InvalidSpec", "the spec cannot be served, so there is nothing to compile")
    if not o.compile_required:
        if o.compile_cache_url is None:
            return _Verdict("True", "NotRequired", "no compile Job: without compileCache.url the pods compile "
                                                   "in place at startup")
        return _Verdict("True", "NotRequired", f"no compile Job: compileCache.policy is Never, the pods load "
                                               f"compiled artifacts from {o.compile_cache_url}")
    if job is None:
        return _Verdict("False", "Compiling", "creating the compile Job")
    name, job_status = _name(job), job.get("status") or {}
    last = f"; the last attempt: {said}" if (said := failed_attempt(o.compile_pods)) else ""
    failed = condition(job, "Failed", "FailureTarget")
    if failed is not None:
        namespace = (job.get("metadata") or {}).get("namespace")
        logs = f"kubectl logs{f' -n {namespace}' if namespace else ''} job/{name}"
        return _Verdict("False", "CompileFailed", f"compile Job {name} failed: {failed.get('reason', 'Failed')}: "
                        f"{failed.get('message', '')}{last}. See its pod logs ({logs}), fix the cause, then change "
                        f"the spec or delete the Job to retry")
    if condition(job, "Complete", "SuccessCriteriaMet") is not None:
        took = _seconds(job_status.get("startTime"), job_status.get("completionTime"))
        return _Verdict("True", "Compiled", f"compiled by Job {name}" + (f" in {took:g}s" if took is not None else ""))
    attempt = job_status.get("failed", 0) + 1
    attempts = (job.get("spec") or {}).get("backoffLimit", 6) + 1
    retry = f", retrying, attempt {attempt} of {attempts}{last}" if attempt > 1 else ""
    state = "is compiling" if job_status.get("active") else "is waiting for its pod to start"
    return _Verdict("False", "Compiling", f"compile Job {name} {state}{retry}")


# --- the workload and its pods -------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Workload:
    kind: str
    desired: int
    total: int
    ready: int
    available: int
    complete: bool  # the rollout is complete (not held, controller caught up, every replica updated)
    deadline: Optional[str]  # the Deployment's ProgressDeadlineExceeded message
    failure: Optional[str]  # the Deployment's ReplicaFailure message (pods refused: quota, admission)

    @staticmethod
    def of(o: Observed) -> Optional[_Workload]:
        if o.workload is None:
            return None
        kind = o.workload.get("kind", "Deployment")
        spec, state = o.workload.get("spec") or {}, o.workload.get("status") or {}
        desired = spec.get("replicas", o.desired_replicas)
        total, ready, updated = (state.get(key, 0) for key in ("replicas", "readyReplicas", "updatedReplicas"))
        available = ready if kind == "LeaderWorkerSet" else state.get("availableReplicas", 0)
        complete = _caught_up(o.workload) and updated == total == desired and not o.rollout_held
        stalled = condition(o.workload, "Progressing", value="False")
        deadline = stalled.get("message", "") if stalled and stalled.get("reason") == "ProgressDeadlineExceeded" \
            else None
        failure = (condition(o.workload, "ReplicaFailure") or {}).get("message")
        return _Workload(kind, desired, total, ready, available, complete, deadline, failure)


def _caught_up(workload: Mapping) -> bool:
    """The workload controller has seen the workload's current spec (see the module docstring)."""
    state = workload.get("status") or {}
    if "observedGeneration" in state or workload.get("kind") != "LeaderWorkerSet":
        return state.get("observedGeneration", 0) >= (workload.get("metadata") or {}).get("generation", 0)
    return bool(condition(workload, "Available")) and not condition(workload, "Progressing", "UpdateInProgress")


# --- phase and conditions ------------------------------------------------------------------------------------

def _phase(o: Observed, artifacts: _Verdict, workload: Optional[_Workload]) -> tuple[str, _Verdict]:
    """(phase, the Ready condition)."""
    held = f"; the previous spec keeps serving on {workload.available} replica(s)" \
        if o.rollout_held and workload and workload.available else ""
    if o.spec_error:
        return "Failed", _Verdict("False", o.error_reason, o.spec_error)
    if artifacts.reason == "CompileFailed":
        return "Failed", _Verdict("False", "CompileFailed", artifacts.message + held)
    if artifacts.reason == "Compiling" or o.rollout_held:
        return "Compiling", _Verdict("False", "Compiling", artifacts.message + held)
    desired = workload.desired if workload else o.desired_replicas
    if desired == 0:
        return "Pending", _Verdict("False", "ScaledToZero", "replicas is 0: no pods serve; scale up to serve")
    pods = live_pods(o.pods)
    if workload is None:
        return "Pending", _Verdict("False", "Creating", "creating the serving workload")
    if not pods:
        refused = f": {workload.failure}" if workload.failure else ""
        return "Pending", _Verdict("False", "Creating", f"the {workload.kind} is creating its pods{refused}")
    if workload.ready == 0:
        scheduled = [pod for pod in pods if condition(pod, "PodScheduled")]
        if not scheduled:
            refused = unschedulable(pods)
            return "Pending", (_Verdict("False", "Unschedulable", refused) if refused else
                               _Verdict("False", "Scheduling", "waiting for the scheduler to place the serving pods"))
        if all(waiting([pod], FAILING) for pod in scheduled) and len(scheduled) == len(pods):
            for marker in (DEVICE_ACCESS_MARKER, ARTIFACTS_MISSING):
                if (told := termination_message(scheduled, marker)) is not None:
                    return "Failed", _Verdict("False", marker, told)
            return "Failed", _Verdict("False", "ContainersFailing", f"no serving pod can run: "
                                      f"{waiting(scheduled, FAILING)} (kubectl logs --previous -l {o.selector})")
        return "Loading", _Verdict("False", "Loading", f"{len(scheduled)} serving pod(s) scheduled, none ready yet: "
                                   f"loading the model (kubectl logs -l {o.selector}){blockers(pods)}")
    if workload.ready < desired:
        return "Degraded", _Verdict("False", "Degraded", f"{workload.ready}/{desired} replicas ready{blockers(pods)}")
    if not workload.complete:
        return "Loading", _Verdict("False", "RollingOut", f"{workload.ready}/{desired} replicas ready; the new spec "
                                   f"is rolling out")
    return "Ready", _Verdict("True", "Ready", f"{workload.ready}/{desired} replicas ready; serving at {o.endpoint}")


def _available(workload: Optional[_Workload], held: bool) -> _Verdict:
    if workload is None:
        return _Verdict("False", "NoReplicasAvailable", "no serving workload yet")
    if workload.available < 1:
        return _Verdict("False", "NoReplicasAvailable", f"none of {workload.total} replica(s) available")
    serving = ", serving the previous spec while the new one compiles" if held else ""
    return _Verdict("True", "MinimumReplicasAvailable", f"{workload.available} replica(s) available{serving}")


def _progressing(o: Observed, artifacts: _Verdict, workload: Optional[_Workload]) -> _Verdict:
    if o.spec_error:
        return _Verdict("False", o.error_reason, "nothing rolls out until the spec is fixed" if
                        o.error_reason == "InvalidSpec" else "nothing rolls out until the child can be written")
    if artifacts.reason == "CompileFailed":
        return _Verdict("False", "CompileFailed", "nothing rolls out until the compile succeeds (see ArtifactsReady)")
    if o.rollout_held or (artifacts.reason == "Compiling" and workload is None):
        return _Verdict("True", "WaitingForArtifacts", "the rollout starts when the compile Job succeeds")
    if workload is None:
        return _Verdict("True", "Creating", "creating the serving workload")
    if workload.deadline is not None:
        return _Verdict("False", "ProgressDeadlineExceeded", f"{workload.deadline}; see the new pods' events "
                        f"(kubectl describe pods -l {o.selector})")
    if not workload.complete:
        return _Verdict("True", "RollingOut", f"rolling out: {workload.total} replica(s), {workload.desired} desired")
    return _Verdict("True", "RolloutComplete", f"all {workload.desired} replica(s) run the current spec")


def _autoscaling(hpa: Mapping) -> _Verdict:
    found = {c.get("type"): c for c in (hpa.get("status") or {}).get("conditions") or []}
    name = _name(hpa)
    for type_ in HPA_CONDITIONS:
        condition = found.get(type_) or {}
        if condition.get("status") == "False":
            reason = condition.get("reason") or type_
            namespace = (hpa.get("metadata") or {}).get("namespace")
            describe = f"kubectl describe hpa{f' -n {namespace}' if namespace else ''} {name}"
            metric = ("; the custom metrics API must serve the metric for the pods (a prometheus-adapter rule: "
                      "docs/eks.md, Autoscaling)") if reason.startswith("FailedGet") and reason.endswith("Metric") \
                else ""
            return _Verdict("False", reason, f"HorizontalPodAutoscaler {name} cannot scale: "
                            f"{condition.get('message', '')} (its {type_} condition; {describe}){metric}")
    if all((found.get(type_) or {}).get("status") == "True" for type_ in HPA_CONDITIONS):
        return _Verdict("True", "ScalingActive", f"HorizontalPodAutoscaler {name}: "
                        f"{found['ScalingActive'].get('message', 'scaling on its metric')}")
    return _Verdict("Unknown", "NotEvaluated", f"HorizontalPodAutoscaler {name} has not evaluated its metric yet")


def _conditions(o: Observed, verdicts: Mapping[str, _Verdict]) -> list[dict]:
    before = {c.get("type"): c for c in o.previous.get("conditions") or []}
    new_generation = o.previous.get("observedGeneration") != o.generation
    return [_set(type_, verdicts[type_], before.get(type_) or {}, o.generation, o.now,
                 keep=not (type_ == "Progressing" and new_generation))
            for type_ in [*CONDITION_TYPES, *(["Autoscaling"] if "Autoscaling" in verdicts else [])]]


def _set(type_: str, verdict: _Verdict, old: Mapping, generation: int, now: datetime, keep: bool = True) -> dict:
    """The condition `type_` says `verdict`; its lastTransitionTime is `old`'s while the status stays (and `keep`)."""
    kept = keep and old.get("status") == verdict.status and old.get("lastTransitionTime")
    return {"type": type_, "status": verdict.status, "reason": verdict.reason, "message": verdict.message,
            "observedGeneration": generation, "lastTransitionTime": old["lastTransitionTime"] if kept else _stamp(now)}


# --- timings -------------------------------------------------------------------------------------------------

def _load_seconds(pods: Sequence[Mapping]) -> Optional[float]:
    """The slowest load of a ready pod that serves (a group's leader: its workers are ready before it loads)."""
    loads = [_seconds((pod.get("status") or {}).get("startTime"), ready.get("lastTransitionTime"))
             for pod in pods if (ready := condition(pod, "Ready")) and
             ((pod.get("metadata") or {}).get("labels") or {}).get(scheduler_hints.WORKER_INDEX_LABEL, "0") == "0"]
    return max((load for load in loads if load is not None), default=None)


def _timings(o: Observed, phase: str, conditions: list[dict]) -> dict:
    previous = o.previous.get("timings") or {}
    same_generation = o.previous.get("observedGeneration") == o.generation
    same_key = o.resolved is not None and (o.previous.get("resolved") or {}).get("compileKey") == o.resolved.compile_key
    job_status = (o.compile_job or {}).get("status") or {}

    def kept(key: str, keep: bool, measure) -> Optional[float]:
        return previous[key] if keep and previous.get(key) is not None else measure()

    def time_to_ready() -> Optional[float]:
        progressing = next(c for c in conditions if c["type"] == "Progressing")
        start = o.created if o.generation == 1 else progressing["lastTransitionTime"]
        return _seconds(start, o.now)

    ready = phase == "Ready"
    timings = {
        "compileSeconds": kept("compileSeconds", same_key, lambda: _seconds(
            job_status.get("startTime"), job_status.get("completionTime"))
            if condition(o.compile_job, "Complete", "SuccessCriteriaMet") else None),
        "loadSeconds": kept("loadSeconds", same_generation, lambda: _load_seconds(live_pods(o.pods)) if ready else None),
        "timeToReadySeconds": kept("timeToReadySeconds", same_generation, lambda: time_to_ready() if ready else None),
    }
    return {key: value for key, value in timings.items() if value is not None}


def _pins(previous: Mapping) -> Optional[dict]:
    """What a status that resolved nothing (a refused spec, a Hub that did not answer) keeps of the previous one's
    `resolved`: its pins, so that the fixed spec serves the commits it served instead of resolving main again."""
    revisions = (previous.get("resolved") or {}).get("revisions")
    return {"revisions": dict(revisions)} if revisions else None


# --- the public functions ------------------------------------------------------------------------------------

def status(observed: Observed) -> dict:
    """The full status (camelCase) for what was observed; see the module docstring for the rules."""
    o = observed
    artifacts, workload = _artifacts(o), _Workload.of(o)
    phase, ready = _phase(o, artifacts, workload)
    verdicts = {"ArtifactsReady": artifacts, "Available": _available(workload, o.rollout_held),
                "Progressing": _progressing(o, artifacts, workload), "Ready": ready}
    if o.hpa is not None:
        verdicts["Autoscaling"] = _autoscaling(o.hpa)
    conditions = _conditions(o, verdicts)
    desired = workload.desired if workload else o.desired_replicas
    ready_replicas = workload.ready if workload else 0
    current = {
        "phase": phase, "conditions": conditions,
        "replicas": workload.total if workload else 0, "readyReplicas": ready_replicas,
        "ready": f"{ready_replicas}/{desired}", "selector": o.selector, "endpoint": o.endpoint,
        "resolved": o.resolved.as_status() if o.resolved else _pins(o.previous),
        "timings": _timings(o, phase, conditions),
        "warnings": list(o.resolved.warnings) if o.resolved else [],
        "observedGeneration": o.generation,
    }
    return {key: value for key, value in current.items() if value is not None}


def hub_unavailable(previous: Mapping, generation: int, message: str, now: datetime) -> dict:
    """The status while the Hub does not answer the revision a spec needs pinned (revisions.HubUnavailable): nothing
    is built for this generation yet, and whatever served before keeps serving. The previous status, its
    observedGeneration too (this generation is not reconciled), with Progressing False/HubUnavailable and the
    message; a model that never had a status is also Pending, Ready False/HubUnavailable."""
    waiting = _Verdict("False", "HubUnavailable", message)
    verdicts = {"Progressing": waiting}
    if not previous.get("phase"):
        verdicts = {"ArtifactsReady": _Verdict("Unknown", "HubUnavailable", "nothing to compile until the revision "
                                               "is resolved"),
                    "Available": _Verdict("False", "NoReplicasAvailable", "no serving workload yet"),
                    "Progressing": waiting, "Ready": waiting}
    conditions = {c.get("type"): c for c in previous.get("conditions") or []}
    for type_, verdict in verdicts.items():
        conditions[type_] = _set(type_, verdict, conditions.get(type_) or {}, generation, now)
    return {**previous, "phase": previous.get("phase") or "Pending", "conditions": list(conditions.values())}


def merge_patch(previous: Mapping, current: Mapping) -> dict:
    """`current` as a JSON merge patch over `previous`: keys that went away become null, so they are removed."""
    patch = dict(current)
    for key, value in previous.items():
        if key not in current:
            patch[key] = None
        elif isinstance(value, Mapping) and isinstance(current[key], Mapping):
            patch[key] = merge_patch(value, current[key])
    return patch


def _ready(current: Mapping) -> Mapping:
    return next((c for c in current.get("conditions") or [] if c.get("type") == "Ready"), {})


def events(previous: Mapping, current: Mapping) -> list[tuple[str, str, str]]:
    """(type, reason, message) of each Event a change from `previous` to `current` status is worth.

    One Event when the phase or the Ready reason changes (Warning for WARNING_REASONS: InvalidSpec,
    CompileFailed, ContainersFailing, NeuronDeviceAccessDenied, Unschedulable, Degraded, HubUnavailable,
    AlreadyOwned, AdmissionDenied; Normal otherwise, e.g.
    Ready "... serving at <endpoint>"); one when a condition takes a reason of CONDITION_EVENTS (Normal Compiled,
    Warning ProgressDeadlineExceeded); a Warning with the HPA's reason when Autoscaling turns False (or False with
    another reason); a Warning of its own reason (resolve.SpecWarning: ModelMayNotFit, HostMemoryShort,
    NoNeuronScheduler, UnpatchedRuntime, NxdiUnsupportedOnTrn2) for each new warning. Nothing when nothing changed:
    the handler calls this on every reconcile.
    """
    found = []
    ready = _ready(current)
    if ready and (previous.get("phase"), _ready(previous).get("reason")) != (current.get("phase"), ready["reason"]):
        kind = "Warning" if ready["reason"] in WARNING_REASONS else "Normal"
        found.append((kind, ready["reason"], ready.get("message", "")))
    before = {(c.get("type"), c.get("reason")): c.get("status") for c in previous.get("conditions") or []}
    for condition in current.get("conditions") or []:
        key = (condition.get("type"), condition.get("reason"))
        if key in CONDITION_EVENTS and key not in before:
            found.append((CONDITION_EVENTS[key], condition["reason"], condition.get("message", "")))
        elif key[0] == "Autoscaling" and condition.get("status") == "False" and before.get(key) != "False":
            found.append(("Warning", condition["reason"], condition.get("message", "")))
    found += [("Warning", getattr(warning, "reason", "SpecWarning"), warning) for warning in current.get("warnings")
              or [] if warning not in (previous.get("warnings") or [])]
    return found
