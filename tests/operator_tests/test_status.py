"""status.py: phase, conditions, timings and Events from observed children (camelCase dicts as the API returns)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from neuronmodel_operator import api
from neuronmodel_operator.resolve import Resolved, SpecWarning
from neuronmodel_operator.status import Observed, events, merge_patch, status

T0 = datetime(2026, 1, 2, 3, 0, 0, tzinfo=timezone.utc)  # the NeuronModel's creationTimestamp
ENDPOINT = "http://llama.team.svc.cluster.local:8000"
SELECTOR = "app.kubernetes.io/component=server,neuronmodel.dev/name=llama"
UNSCHEDULABLE = "0/5 nodes are available: 5 Insufficient aws.amazon.com/neuroncore."
RESOLVED = Resolved("nxdi", "inf2.8xlarge", "inf2", None, 2, 1, {"aws.amazon.com/neuroncore": "2"},
                    "ghcr.io/neuronmodel/neuronmodel-runtime:0.1.0", "k" * 64, False, ())


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def stamp(minutes: float) -> str:
    return at(minutes).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- factories: objects shaped as the API server returns them ------------------------------------------------

def deployment(desired=3, ready=0, total=None, available=None, updated=None, generation=1, observed_generation=1,
               conditions=()) -> dict:
    state = {"observedGeneration": observed_generation, "replicas": desired if total is None else total,
             "readyReplicas": ready, "availableReplicas": ready if available is None else available,
             "updatedReplicas": desired if updated is None else updated, "conditions": list(conditions)}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "llama", "namespace": "team", "generation": generation},
            "spec": {"replicas": desired}, "status": {k: v for k, v in state.items() if v != 0}}


def lws_condition(type_: str, status: str = "True", observed_generation=None) -> dict:
    """A condition as the LWS controller's makeCondition writes it (v0.7.0 leaderworkerset_controller.go:779-804;
    v0.9.0+ adds ObservedGeneration: v0.10.0 :899)."""
    reason, message = {"Available": ("AllGroupsReady", "All replicas are ready"),
                       "Progressing": ("GroupsProgressing", "Replicas are progressing"),
                       "UpdateInProgress": ("GroupsUpdating", "Rolling Upgrade is in progress")}[type_]
    condition = {"type": type_, "status": status, "reason": reason, "message": message,
                 "lastTransitionTime": stamp(10)}
    if observed_generation is not None:
        condition["observedGeneration"] = observed_generation
    return condition


def lws(desired=2, ready=0, total=None, updated=None, generation=1, conditions=(), observed_generation=None) -> dict:
    """A LeaderWorkerSet as its controller writes the status. v0.7.0 (api/leaderworkerset/v1/
    leaderworkerset_types.go:337-354): conditions, readyReplicas, updatedReplicas, replicas, hpaPodSelector, each
    `omitempty` (a zero count is absent), and no observedGeneration; `observed_generation` gives the v0.9.0+ shape
    (types.go:389 at v0.9.0, set by updateStatus: leaderworkerset_controller.go:536-538 at v0.10.0)."""
    state = {"conditions": list(conditions), "readyReplicas": ready,
             "updatedReplicas": desired if updated is None else updated,
             "replicas": desired if total is None else total,
             "hpaPodSelector": "leaderworkerset.sigs.k8s.io/name=llama-lws,leaderworkerset.sigs.k8s.io/worker-index=0",
             "observedGeneration": observed_generation}
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "llama-lws", "namespace": "team", "generation": generation},
            "spec": {"replicas": desired, "leaderWorkerTemplate": {"size": 2}},
            "status": {k: v for k, v in state.items() if v}}


#: v0.7's conditions once every group is ready on the current revision: Available appended True, and Progressing
#: (and UpdateInProgress, after an update) turned False by setCondition's exclusivity (controller.go:815-848).
LWS_SETTLED = (lws_condition("Progressing", "False"), lws_condition("Available"),
               lws_condition("UpdateInProgress", "False"))
#: v0.7's conditions while a template update rolls (updateConditions, controller.go:456-461).
LWS_UPDATING = (lws_condition("Progressing"), lws_condition("Available", "False"), lws_condition("UpdateInProgress"))


def job(active=0, failed=0, start=None, completion=None, conditions=(), backoff_limit=4) -> dict:
    state = {"active": active, "failed": failed, "startTime": start, "completionTime": completion,
             "conditions": list(conditions)}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "llama-compile-abc123", "namespace": "team"},
            "spec": {"backoffLimit": backoff_limit}, "status": {k: v for k, v in state.items() if v}}


def compiled_job(start=1, end=15) -> dict:
    done = [{"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}]
    return job(start=stamp(start), completion=stamp(end), conditions=done)


def failed_job() -> dict:
    return job(failed=5, start=stamp(1), conditions=[
        {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded",
         "message": "Job has reached the specified backoff limit"},
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
         "message": "Job has reached the specified backoff limit"}])


def pod(name="llama-0", scheduled=True, ready=False, start=20, ready_at=None, refused=None, waiting=None,
        deleting=False) -> dict:
    conditions = []
    if refused:
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": refused,
                           "lastTransitionTime": stamp(start)})
    elif scheduled:
        conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(start)})
    if scheduled and not refused:
        conditions.append({"type": "Ready", "status": "True" if ready else "False",
                           "lastTransitionTime": stamp(ready_at if ready else start)})
    state = {"phase": "Running" if scheduled and not refused else "Pending", "conditions": conditions}
    if scheduled and not refused:
        state["startTime"] = stamp(start)
    if waiting:
        state["containerStatuses"] = [{"name": "runtime", "ready": False, "state": {"waiting": waiting}}]
    metadata = {"name": name, "namespace": "team"}
    if deleting:
        metadata["deletionTimestamp"] = stamp(start)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "status": state}


def observe(**overrides) -> Observed:
    base = dict(generation=1, created=T0, previous={}, resolved=RESOLVED, spec_error=None, desired_replicas=3,
                workload=None, compile_job=None, compile_required=False, rollout_held=False, pods=(),
                endpoint=ENDPOINT, selector=SELECTOR, now=at(30))
    return Observed(**{**base, **overrides})


def run(observed: Observed) -> dict:
    """status() of `observed`, checked against the CRD's status type."""
    current = status(observed)
    api.NeuronModelStatus.model_validate(current)
    return current


def cond(current: dict, type_: str) -> dict:
    return next(c for c in current["conditions"] if c["type"] == type_)


def ready_pods(n=3, start=20, ready_at=25) -> list[dict]:
    return [pod(f"llama-{i}", ready=True, start=start, ready_at=ready_at) for i in range(n)]


def ready_observation(**overrides) -> Observed:
    return observe(workload=deployment(ready=3), pods=ready_pods(), **overrides)


# --- phases --------------------------------------------------------------------------------------------------

def test_invalid_spec_is_failed_with_the_spec_error():
    message = "spec.parallelism: no Neuron instance type holds 48 NeuronCores per node"
    current = run(observe(resolved=None, spec_error=message, desired_replicas=1))
    assert current["phase"] == "Failed"
    assert cond(current, "Ready") | {"lastTransitionTime": None} == {
        "type": "Ready", "status": "False", "reason": "InvalidSpec", "message": message, "observedGeneration": 1,
        "lastTransitionTime": None}
    assert cond(current, "ArtifactsReady")["status"] == "Unknown"
    assert cond(current, "Progressing")["reason"] == "InvalidSpec"
    assert "resolved" not in current and current["warnings"] == []


def test_compile_job_failed_is_failed_with_the_job_reason_and_a_logs_hint():
    current = run(observe(compile_required=True, compile_job=failed_job()))
    assert current["phase"] == "Failed"
    artifacts = cond(current, "ArtifactsReady")
    assert (artifacts["status"], artifacts["reason"]) == ("False", "CompileFailed")
    assert "BackoffLimitExceeded: Job has reached the specified backoff limit" in artifacts["message"]
    assert "kubectl logs -n team job/llama-compile-abc123" in artifacts["message"]
    assert cond(current, "Ready")["reason"] == "CompileFailed"
    assert (cond(current, "Progressing")["status"], cond(current, "Progressing")["reason"]) == ("False",
                                                                                                "CompileFailed")


#: A compile pod whose vLLM refused its flags: the supervisor exits with vLLM's status, its log tail the message (as
#: the real node showed, tests/integration/realnode/test_end_to_end.py); store-artifacts stops waiting and fails too.
VLLM_REFUSED = ("INFO 12-06 non-default args: {'max_model_len': 4096}\nINFO 12-06 resolved architecture\n"
                "Traceback (most recent call last):\n  File \"vllm/engine/arg_utils.py\", line 1, in create_model_config\n"
                "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
                "  Value error, max_model_len 4096 exceeds the model's 1024 positions\n"
                "    For further information visit https://errors.pydantic.dev/2.12/v/value_error\n"
                "neuronmodel: vllm serve exited with status 1 before its compiled folder was stored\n")


def compile_pod(name: str, created: int, runtime_exit: int, message: str = "", reason: str = "Error") -> dict:
    ended = {"exitCode": runtime_exit, "reason": reason, "message": message}
    return {"metadata": {"name": name, "creationTimestamp": stamp(created)}, "status": {
        "phase": "Failed" if runtime_exit else "Running",
        "initContainerStatuses": [{"name": "fetch-model", "state": {"terminated": {"exitCode": 0}}}],
        "containerStatuses": [
            {"name": "runtime", "state": {"terminated": ended} if runtime_exit else {"running": {}}},
            {"name": "store-artifacts", "state": {"terminated": {
                "exitCode": 1, "reason": "Error", "message": "vLLM exited with status 1 before it served"}}}]}}


def test_a_failed_compile_quotes_the_last_attempts_own_error():
    """A compile Job whose vLLM (or runtime) fails says why in the status, from the newest failed pod's container
    termination message, not only 'BackoffLimitExceeded' and a logs hint."""
    pods = [compile_pod("c-1", 10, 1, "an older attempt"), compile_pod("c-2", 20, 1, VLLM_REFUSED)]
    current = run(observe(compile_required=True, compile_job=failed_job(), compile_pods=pods))
    message = cond(current, "ArtifactsReady")["message"]
    quoted = message.split("; the last attempt: ", 1)[1].split(". See its pod logs", 1)[0]
    assert quoted.startswith("container runtime exited 1: Traceback (most recent call last): | File "), quoted
    assert " | Value error, max_model_len 4096 exceeds the model's 1024 positions | " in quoted, quoted
    assert quoted.endswith("| neuronmodel: vllm serve exited with status 1 before its compiled folder was stored")
    assert "an older attempt" not in message and "non-default args" not in message  # the newest pod, its last lines
    assert "kubectl logs -n team job/llama-compile-abc123" in message
    assert cond(current, "Ready")["message"] == message  # the phase's message, which the Warning Event carries
    retrying = run(observe(compile_required=True, compile_job=job(active=1, failed=1, start=stamp(1)),
                           compile_pods=[compile_pod("c-1", 10, 137, "", "OOMKilled")]))
    assert cond(retrying, "ArtifactsReady")["message"].endswith(
        "retrying, attempt 2 of 5; the last attempt: container runtime exited 137 (OOMKilled)")


@pytest.mark.parametrize("compile_job, words", [
    (None, "creating the compile Job"),
    (job(), "is waiting for its pod to start"),
    (job(active=1, start=stamp(1)), "is compiling"),
])
def test_compiling_while_the_required_job_has_not_succeeded(compile_job, words):
    current = run(observe(compile_required=True, compile_job=compile_job))
    assert current["phase"] == "Compiling"
    artifacts = cond(current, "ArtifactsReady")
    assert (artifacts["status"], artifacts["reason"]) == ("False", "Compiling")
    assert words in artifacts["message"] and "attempt" not in artifacts["message"]
    assert cond(current, "Ready")["reason"] == "Compiling"
    assert cond(current, "Progressing")["reason"] == "WaitingForArtifacts"  # nothing serves yet


def test_compile_retries_show_the_attempt():
    current = run(observe(compile_required=True, compile_job=job(active=1, failed=2, start=stamp(1))))
    assert current["phase"] == "Compiling"
    assert cond(current, "ArtifactsReady")["message"].endswith("retrying, attempt 3 of 5")


def test_compiled_job_makes_artifacts_ready_and_records_compile_seconds():
    current = run(observe(compile_required=True, compile_job=compiled_job(start=1, end=15)))
    artifacts = cond(current, "ArtifactsReady")
    assert (artifacts["status"], artifacts["reason"]) == ("True", "Compiled")
    assert artifacts["message"] == "compiled by Job llama-compile-abc123 in 840s"
    assert current["timings"]["compileSeconds"] == 840
    assert current["phase"] == "Pending"  # next: the handler creates the workload


@pytest.mark.parametrize("url, words", [(None, "without compileCache.url the pods compile in place"),
                                        ("s3://cache/llama", "policy is Never, the pods load compiled artifacts "
                                                             "from s3://cache/llama")])
def test_no_compile_job_needed_says_why(url, words):
    artifacts = cond(run(observe(compile_cache_url=url)), "ArtifactsReady")
    assert (artifacts["status"], artifacts["reason"]) == ("True", "NotRequired")
    assert words in artifacts["message"]


def test_no_workload_yet_is_pending():
    current = run(observe())
    assert (current["phase"], cond(current, "Ready")["reason"]) == ("Pending", "Creating")
    assert (current["replicas"], current["readyReplicas"], current["ready"]) == (0, 0, "0/3")
    assert cond(current, "Available")["reason"] == "NoReplicasAvailable"
    assert cond(current, "Progressing")["reason"] == "Creating"


def test_workload_without_pods_shows_its_replica_failure():
    failure = {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
               "message": 'pods "llama-7d9" is forbidden: exceeded quota: neuron'}
    current = run(observe(workload=deployment(conditions=[failure])))
    assert (current["phase"], cond(current, "Ready")["reason"]) == ("Pending", "Creating")
    assert "exceeded quota: neuron" in cond(current, "Ready")["message"]


def test_scaled_to_zero_is_pending():
    current = run(observe(desired_replicas=0, workload=deployment(desired=0)))
    assert (current["phase"], cond(current, "Ready")["reason"]) == ("Pending", "ScaledToZero")
    assert current["ready"] == "0/0"


def test_unschedulable_pods_surface_the_scheduler_message():
    pods = [pod(f"llama-{i}", scheduled=False, refused=UNSCHEDULABLE) for i in range(3)]
    current = run(observe(workload=deployment(), pods=pods))
    ready = cond(current, "Ready")
    assert (current["phase"], ready["reason"]) == ("Pending", "Unschedulable")
    assert ready["message"] == f"3 serving pod(s) cannot be scheduled: {UNSCHEDULABLE}"


def group_pod(group: int, worker: int, key: str = "eks.amazonaws.com/nodegroup", **kwargs) -> dict:
    """A pod of a LeaderWorkerSet group as its webhook makes it: the exclusive-topology affinities on `key`."""
    made = pod(f"llama-lws-{group}" + (f"-{worker}" if worker else ""), **kwargs)
    group_key = {"key": "leaderworkerset.sigs.k8s.io/group-key", "operator": "In", "values": [f"g{group}"]}
    others = [{"key": group_key["key"], "operator": "Exists"},
              {"key": group_key["key"], "operator": "NotIn", "values": [f"g{group}"]}]
    made["metadata"]["labels"] = {"leaderworkerset.sigs.k8s.io/worker-index": str(worker),
                                  "leaderworkerset.sigs.k8s.io/group-key": f"g{group}"}
    made["spec"] = {"affinity": {
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchExpressions": [group_key]}, "topologyKey": key}]},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchExpressions": others}, "topologyKey": key}]}}}
    return made


#: kube-scheduler's messages for a group pod (tests/integration/test_multinode_placement.py gets them for real).
TAKEN = ("0/6 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, 4 node(s) didn't match pod "
         "anti-affinity rules. preemption: 0/6 nodes are available: 6 Preemption is not helpful for scheduling.")
NO_KEY = ("0/3 nodes are available: 3 node(s) didn't match pod affinity rules. preemption: 0/3 nodes are available: "
          "3 Preemption is not helpful for scheduling.")


def test_a_surge_group_without_a_free_node_group_says_how_to_roll_without_one():
    pods = [group_pod(0, 0, ready=True, ready_at=25), group_pod(0, 1, ready=True, ready_at=25),
            group_pod(1, 0, scheduled=False, refused=TAKEN), group_pod(1, 1, scheduled=False, refused=TAKEN)]
    current = run(observe(workload=lws(desired=2, ready=1, total=2, updated=2), pods=pods, desired_replicas=2))
    message = cond(current, "Ready")["message"]
    assert current["phase"] == "Degraded" and TAKEN in message
    assert "each serving group needs a node group of its own (LeaderWorkerSet exclusive topology on " \
           "eks.amazonaws.com/nodegroup)" in message
    assert "set spec.rollout.maxSurge 0 and maxUnavailable 1" in message and "or add a node group" in message


def test_an_exclusive_key_that_no_node_carries_is_named_with_how_to_set_another():
    pods = [group_pod(0, 0, key="karpenter.sh/nodepool-group", scheduled=False, refused=NO_KEY)]
    current = run(observe(workload=lws(desired=1), pods=pods, desired_replicas=1))
    ready = cond(current, "Ready")
    assert (current["phase"], ready["reason"]) == ("Pending", "Unschedulable")
    assert "the exclusive-topology key karpenter.sh/nodepool-group is a label on none of the 3 node(s)" in \
        ready["message"]
    assert "spec.parallelism.groupTopologyKey" in ready["message"] and "multiNode.groupTopologyKey" in ready["message"]


def test_a_refusal_of_a_pod_without_exclusive_topology_gets_no_group_advice():
    pods = [pod(scheduled=False, refused=NO_KEY)]  # a Deployment pod with an affinity of the user's
    assert cond(run(observe(workload=deployment(), pods=pods)), "Ready")["message"] == \
        f"1 serving pod(s) cannot be scheduled: {NO_KEY}"


def test_load_seconds_of_a_group_are_its_leaders():
    pods = [group_pod(0, 0, ready=True, start=20, ready_at=25), group_pod(0, 1, ready=True, start=2, ready_at=25)]
    current = run(observe(workload=lws(desired=1, ready=1, total=1, updated=1, conditions=LWS_SETTLED), pods=pods,
                          desired_replicas=1))
    assert current["phase"] == "Ready" and current["timings"]["loadSeconds"] == 300


def test_pods_not_scheduled_yet_are_pending():
    current = run(observe(workload=deployment(), pods=[pod(scheduled=False)]))
    assert (current["phase"], cond(current, "Ready")["reason"]) == ("Pending", "Scheduling")


def test_scheduled_pods_none_ready_is_loading_and_names_container_problems():
    crash = {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container=runtime"}
    pods = [pod("llama-0"), pod("llama-1", waiting=crash), pod("llama-2", refused=UNSCHEDULABLE)]
    current = run(observe(workload=deployment(), pods=pods))
    message = cond(current, "Ready")["message"]
    assert (current["phase"], cond(current, "Ready")["reason"]) == ("Loading", "Loading")
    assert message.startswith("2 serving pod(s) scheduled, none ready yet")
    assert f"kubectl logs -l {SELECTOR}" in message
    assert f"1 serving pod(s) cannot be scheduled: {UNSCHEDULABLE}" in message
    assert "container runtime: CrashLoopBackOff: back-off 40s" in message


def test_every_scheduled_pod_failing_is_failed_with_the_containers_reason():
    """A wrong model path: the runtime exits at start, every pod crash-loops; a Warning Event, not Loading forever."""
    crash = {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container=runtime"}
    current = run(observe(workload=deployment(), pods=[pod("llama-0", waiting=crash), pod("llama-1", waiting=crash)]))
    ready = cond(current, "Ready")
    assert (current["phase"], ready["reason"]) == ("Failed", "ContainersFailing")
    assert "container runtime: CrashLoopBackOff: back-off 40s" in ready["message"]
    assert f"kubectl logs --previous -l {SELECTOR}" in ready["message"]
    assert events({}, current) == [("Warning", "ContainersFailing", ready["message"])]
    pulling = {"reason": "ImagePullBackOff", "message": "pull access denied"}
    assert run(observe(workload=deployment(), pods=[pod("llama-0", waiting=pulling)]))["phase"] == "Failed"
    # one pod still loading (or one not yet scheduled): it may come up, so Loading (or Pending) with the problem named
    loading = run(observe(workload=deployment(), pods=[pod("llama-0", waiting=crash), pod("llama-1")]))
    assert (loading["phase"], cond(loading, "Ready")["reason"]) == ("Loading", "Loading")
    unplaced = run(observe(workload=deployment(), pods=[pod("llama-0", waiting=crash), pod("llama-1", scheduled=False)]))
    assert unplaced["phase"] == "Loading"


def test_degraded_reports_total_replicas_for_the_scale_subresource():
    pods = [pod("llama-0", ready=True, ready_at=25), pod("llama-1"), pod("llama-2")]
    current = run(observe(workload=deployment(desired=3, ready=1), pods=pods))
    assert current["phase"] == "Degraded"
    assert (current["replicas"], current["readyReplicas"], current["ready"]) == (3, 1, "1/3")
    assert cond(current, "Ready")["reason"] == "Degraded"
    assert cond(current, "Available")["status"] == "True"


def test_ready():
    current = run(ready_observation())
    assert current["phase"] == "Ready"
    assert {c["type"]: (c["status"], c["reason"]) for c in current["conditions"]} == {
        "ArtifactsReady": ("True", "NotRequired"), "Available": ("True", "MinimumReplicasAvailable"),
        "Progressing": ("True", "RolloutComplete"), "Ready": ("True", "Ready")}
    assert cond(current, "Ready")["message"] == f"3/3 replicas ready; serving at {ENDPOINT}"
    assert {key: current[key] for key in ("replicas", "readyReplicas", "ready", "selector", "endpoint",
                                          "observedGeneration")} == {
        "replicas": 3, "readyReplicas": 3, "ready": "3/3", "selector": SELECTOR, "endpoint": ENDPOINT,
        "observedGeneration": 1}
    assert current["resolved"] == RESOLVED.as_status()
    assert [c["type"] for c in current["conditions"]] == list(api.CONDITION_TYPES)


@pytest.mark.parametrize("workload", [
    deployment(ready=3, total=4, updated=1),  # surge: one new pod, three old ones
    deployment(ready=3, generation=2, observed_generation=1),  # the controller has not seen the new template
])
def test_ready_waits_for_a_complete_rollout(workload):
    current = run(observe(workload=workload, pods=ready_pods()))
    assert (current["phase"], cond(current, "Ready")["reason"]) == ("Loading", "RollingOut")
    assert (cond(current, "Progressing")["status"], cond(current, "Progressing")["reason"]) == ("True", "RollingOut")


def test_progress_deadline_exceeded():
    stalled = {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
               "message": 'ReplicaSet "llama-7d9" has timed out progressing.'}
    current = run(observe(workload=deployment(ready=3, total=4, updated=1, conditions=[stalled]), pods=ready_pods()))
    progressing = cond(current, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "ProgressDeadlineExceeded")
    assert progressing["message"].startswith('ReplicaSet "llama-7d9" has timed out progressing.')


def test_held_rollout_is_compiling_while_old_pods_stay_available():
    current = run(observe(workload=deployment(ready=3), pods=ready_pods(), compile_required=True,
                          compile_job=job(active=1, start=stamp(1)), rollout_held=True))
    assert current["phase"] == "Compiling"
    assert (cond(current, "Available")["status"], cond(current, "Available")["reason"]) == (
        "True", "MinimumReplicasAvailable")
    assert "serving the previous spec" in cond(current, "Available")["message"]
    assert cond(current, "Progressing")["reason"] == "WaitingForArtifacts"
    assert cond(current, "Ready")["message"].endswith("the previous spec keeps serving on 3 replica(s)")
    assert current["readyReplicas"] == 3


def test_leaderworkerset_availability_comes_from_ready_groups():
    workload = lws(desired=2, ready=1, conditions=[lws_condition("Progressing")])
    current = run(observe(desired_replicas=2, workload=workload, pods=[pod(ready=True, ready_at=25), pod("w-1")]))
    assert current["phase"] == "Degraded"
    assert cond(current, "Available")["status"] == "True"


def lws_pods(groups=2) -> list[dict]:
    """Leader and worker pods of `groups` ready groups (two nodes each)."""
    return [pod(f"llama-lws-{g}{suffix}", ready=True, ready_at=25) for g in range(groups) for suffix in ("", "-1")]


def test_leaderworkerset_v0_7_settled_status_is_ready():
    """v0.7.0 publishes no status.observedGeneration (it came in v0.9.0): a settled status, as its controller writes
    it (updateConditions and updateStatus, leaderworkerset_controller.go:379-534 at v0.7.0: counts of ready and
    updated groups, Available True once all are), is a complete rollout; reading a missing observedGeneration as 0
    kept every multi-node model RollingOut forever."""
    current = run(observe(desired_replicas=2, workload=lws(ready=2, conditions=LWS_SETTLED), pods=lws_pods()))
    assert (current["phase"], cond(current, "Ready")["reason"]) == ("Ready", "Ready")
    assert cond(current, "Progressing")["reason"] == "RolloutComplete"
    assert (current["replicas"], current["readyReplicas"], current["ready"]) == (2, 2, "2/2")
    fresh = run(observe(desired_replicas=2, workload=lws(ready=2, generation=1, conditions=LWS_SETTLED[:2]),
                        pods=lws_pods()))  # created and never updated: no UpdateInProgress condition at all
    assert fresh["phase"] == "Ready"


@pytest.mark.parametrize("workload", [
    # a template update the controller has seen: UpdateInProgress, one group updated, the surge group counted
    lws(ready=2, total=3, updated=1, generation=2, conditions=LWS_UPDATING),
    # counts that look done under conditions that say the update is not (v0.7 writes both in one pass, so this
    # guards against the two disagreeing: the conditions win)
    lws(ready=2, generation=2, conditions=LWS_UPDATING),
    # replicas 2 -> 3 applied, the status still the settled one of 2 groups: the counts give it away
    lws(desired=3, ready=2, total=2, updated=2, generation=2, conditions=LWS_SETTLED),
    # created, its controller has not written a status yet
    {**lws(), "status": {}},
], ids=["updating", "update-not-done", "stale-after-scale", "no-status-yet"])
def test_leaderworkerset_v0_7_status_in_flight_is_not_ready(workload):
    current = run(observe(desired_replicas=2, workload=workload, pods=lws_pods()))
    assert current["phase"] != "Ready"
    assert cond(current, "Progressing")["reason"] != "RolloutComplete"


def test_leaderworkerset_with_observed_generation_uses_it():
    """v0.9.0+ (status.observedGeneration, types.go:389; conditions carry it too, controller.go:899 at v0.10.0):
    a status of an older generation is stale even when its conditions say Available."""
    settled = [lws_condition("Available", observed_generation=1), lws_condition("Progressing", "False", 1)]
    stale = lws(ready=2, generation=2, observed_generation=1, conditions=settled)
    current = run(observe(desired_replicas=2, workload=stale, pods=lws_pods()))
    assert (current["phase"], cond(current, "Ready")["reason"]) == ("Loading", "RollingOut")
    seen = lws(ready=2, generation=2, observed_generation=2,
               conditions=[{**c, "observedGeneration": 2} for c in settled])
    assert run(observe(desired_replicas=2, workload=seen, pods=lws_pods()))["phase"] == "Ready"


def test_desired_is_the_workloads_own_replicas():
    """With autoscaling the HPA sets the Deployment's replicas; the spec only gave the minimum."""
    current = run(observe(desired_replicas=1, workload=deployment(desired=5, ready=5), pods=ready_pods(5)))
    assert (current["phase"], current["ready"], current["replicas"]) == ("Ready", "5/5", 5)


def test_terminating_and_finished_pods_are_ignored():
    old = pod("llama-old", ready=True, ready_at=25, deleting=True)
    current = run(observe(workload=deployment(), pods=[old, pod("llama-0", scheduled=False, refused=UNSCHEDULABLE)]))
    assert cond(current, "Ready")["reason"] == "Unschedulable"


# --- lastTransitionTime, a fixed point, timings --------------------------------------------------------------

def test_an_identical_reconcile_changes_nothing():
    first = run(ready_observation(now=at(30)))
    again = run(ready_observation(previous=first, now=at(31)))
    assert again == first  # the handler skips the write
    assert events(first, again) == []


def test_last_transition_time_is_kept_until_the_status_changes():
    loading = run(observe(workload=deployment(), pods=[pod()], now=at(20)))
    degraded = run(observe(workload=deployment(ready=1), pods=[pod(ready=True, ready_at=24)], previous=loading,
                           now=at(24)))
    assert cond(loading, "Ready")["lastTransitionTime"] == stamp(20)
    assert cond(degraded, "Ready")["lastTransitionTime"] == stamp(20)  # still False, reason Loading -> Degraded
    assert cond(degraded, "Available")["lastTransitionTime"] == stamp(24)  # False -> True
    assert cond(degraded, "ArtifactsReady")["lastTransitionTime"] == stamp(20)


def test_time_to_ready_for_the_first_generation_counts_from_creation_and_is_kept():
    ready = run(ready_observation(now=at(30)))
    assert ready["timings"] == {"loadSeconds": 300, "timeToReadySeconds": 1800}
    later = run(observe(workload=deployment(ready=2), pods=ready_pods(2, start=40, ready_at=50), previous=ready,
                        now=at(60)))
    assert later["phase"] == "Degraded"
    assert later["timings"] == ready["timings"]  # measured once per generation, not again


def test_time_to_ready_of_a_new_generation_counts_from_its_first_reconcile():
    ready = run(ready_observation(now=at(30)))
    rolling = run(observe(generation=2, workload=deployment(ready=3, total=4, updated=1), pods=ready_pods(),
                          previous=ready, now=at(40)))
    assert cond(rolling, "Progressing")["lastTransitionTime"] == stamp(40)  # the generation's start, on record
    assert rolling["timings"] == {}
    ready_again = run(observe(generation=2, workload=deployment(ready=3), pods=ready_pods(start=41, ready_at=46),
                              previous=rolling, now=at(47)))
    assert ready_again["phase"] == "Ready"
    assert ready_again["timings"] == {"loadSeconds": 300, "timeToReadySeconds": 420}


def test_compile_seconds_are_kept_for_the_same_compile_key_only():
    first = run(observe(compile_required=True, compile_job=compiled_job(start=1, end=15)))
    job_gone = run(observe(compile_required=True, compile_job=None, previous=first))
    assert job_gone["timings"]["compileSeconds"] == 840
    new_key = replace(RESOLVED, compile_key="n" * 64)
    recompiling = run(observe(resolved=new_key, compile_required=True, compile_job=job(active=1), previous=first))
    assert "compileSeconds" not in recompiling["timings"]


def test_load_seconds_is_the_slowest_ready_pod():
    pods = [pod("a", ready=True, start=20, ready_at=22), pod("b", ready=True, start=21, ready_at=29),
            pod("c", ready=True, start=20, ready_at=25)]
    assert run(observe(workload=deployment(ready=3), pods=pods))["timings"]["loadSeconds"] == 480


# --- events --------------------------------------------------------------------------------------------------

def test_events_follow_a_lifecycle_once_per_transition():
    compiling = dict(compile_required=True, compile_job=job(active=1, start=stamp(1)))
    compiled = dict(compile_required=True, compile_job=compiled_job(start=1, end=15))
    steps = [
        observe(**compiling),
        observe(**compiling),
        observe(**compiled),
        observe(**compiled, workload=deployment(), pods=[pod(f"p{i}", scheduled=False, refused=UNSCHEDULABLE)
                                                          for i in range(3)]),
        observe(**compiled, workload=deployment(), pods=[pod(f"p{i}") for i in range(3)]),
        observe(**compiled, workload=deployment(ready=1), pods=[pod("p0", ready=True, ready_at=25)]),
        observe(**compiled, workload=deployment(ready=3), pods=ready_pods()),
        observe(**compiled, workload=deployment(ready=3), pods=ready_pods()),
    ]
    previous, seen = {}, []
    for step in steps:
        current = run(replace(step, previous=previous))
        seen.append([(kind, reason) for kind, reason, _ in events(previous, current)])
        previous = current
    assert seen == [
        [("Normal", "Compiling")], [],
        [("Normal", "Creating"), ("Normal", "Compiled")],
        [("Warning", "Unschedulable")],
        [("Normal", "Loading")],
        [("Warning", "Degraded")],
        [("Normal", "Ready")], [],
    ]
    assert events({}, previous)[0] == ("Normal", "Ready", f"3/3 replicas ready; serving at {ENDPOINT}")


@pytest.mark.parametrize("observed, reason", [
    (observe(resolved=None, spec_error="spec.instanceType: 'm5.large' is not a Neuron instance type"), "InvalidSpec"),
    (observe(compile_required=True, compile_job=failed_job()), "CompileFailed"),
])
def test_failures_are_warning_events(observed, reason):
    current = run(observed)
    assert events({}, current) == [("Warning", reason, cond(current, "Ready")["message"])]
    assert events(current, run(replace(observed, previous=current))) == []


@pytest.mark.parametrize("reason", ["ModelMayNotFit", "HostMemoryShort", "NoNeuronScheduler", "UnpatchedRuntime",
                                    "NxdiUnsupportedOnTrn2"])
def test_a_new_warning_is_an_event_of_its_own_reason_once(reason):
    warning = SpecWarning(reason, "the model needs ~140 GiB of weights; TP 2 on inf2 holds 32 GiB of HBM")
    before = run(ready_observation())
    after = run(ready_observation(resolved=replace(RESOLVED, warnings=(warning,)), previous=before))
    assert after["warnings"] == [warning] and after["phase"] == "Ready"  # a warning never stops the rollout
    assert events(before, after) == [("Warning", reason, warning)]
    assert events(after, run(ready_observation(resolved=replace(RESOLVED, warnings=(warning,)), previous=after))) == []


def test_progress_deadline_is_a_warning_event():
    rolling = run(observe(workload=deployment(ready=3, total=4, updated=1), pods=ready_pods()))
    stalled = {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "timed out"}
    stuck = run(observe(workload=deployment(ready=3, total=4, updated=1, conditions=[stalled]), pods=ready_pods(),
                        previous=rolling))
    assert [(kind, reason) for kind, reason, _ in events(rolling, stuck)] == [("Warning", "ProgressDeadlineExceeded")]


# --- merge patch ---------------------------------------------------------------------------------------------

def test_merge_patch_removes_keys_that_went_away():
    ready = run(ready_observation())
    failed = run(observe(generation=2, resolved=None, spec_error="bad", previous=ready))
    patch = merge_patch(ready, failed)
    assert patch["resolved"] is None
    assert patch["timings"] == {"loadSeconds": None, "timeToReadySeconds": None}
    assert patch["conditions"] == failed["conditions"]


# --- autoscaling: the HPA's conditions -----------------------------------------------------------------------

NO_METRICS = ("the HPA was unable to compute the replica count: unable to get metric vllm:num_requests_waiting: "
              "unable to fetch metrics from custom metrics API: no custom metrics API (custom.metrics.k8s.io) "
              "registered")


def hpa(*conditions: tuple[str, str, str, str]) -> dict:
    """An autoscaling/v2 HPA; `conditions` (type, status, reason, message) as the HPA controller sets them
    (pkg/controller/podautoscaler/horizontal.go setCondition)."""
    status = {"currentReplicas": 3, "desiredReplicas": 3}
    if conditions:
        status["conditions"] = [{"type": t, "status": s, "reason": r, "message": m,
                                 "lastTransitionTime": stamp(20)} for t, s, r, m in conditions]
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "llama", "namespace": "team"},
            "spec": {"minReplicas": 1, "maxReplicas": 6, "metrics": [{"type": "Pods", "pods": {
                "metric": {"name": "vllm:num_requests_waiting"},
                "target": {"type": "AverageValue", "averageValue": "4"}}}]},
            "status": status}


ABLE = ("AbleToScale", "True", "SucceededGetScale", "the HPA controller was able to get the target's current scale")
ACTIVE = ("ScalingActive", "True", "ValidMetricFound",
          "the HPA was able to successfully calculate a replica count from pods metric vllm:num_requests_waiting")
NO_METRIC = ("ScalingActive", "False", "FailedGetPodsMetric", NO_METRICS)


def test_no_autoscaling_condition_without_an_hpa():
    assert [c["type"] for c in run(ready_observation())["conditions"]] == list(api.CONDITION_TYPES)


def test_an_hpa_without_conditions_yet_is_unknown():
    current = run(ready_observation(hpa=hpa()))
    assert [c["type"] for c in current["conditions"]] == [*api.CONDITION_TYPES, "Autoscaling"]
    autoscaling = cond(current, "Autoscaling")
    assert (autoscaling["status"], autoscaling["reason"]) == ("Unknown", "NotEvaluated")
    assert events({}, current) == [("Normal", "Ready", cond(current, "Ready")["message"])]


def test_an_hpa_that_scales_is_true():
    autoscaling = cond(run(ready_observation(hpa=hpa(ABLE, ACTIVE))), "Autoscaling")
    assert (autoscaling["status"], autoscaling["reason"]) == ("True", "ScalingActive")
    assert ACTIVE[3] in autoscaling["message"]


@pytest.mark.parametrize("failing", [
    NO_METRIC,  # no custom metrics API, or no adapter rule for the metric
    ("AbleToScale", "False", "FailedGetScale", 'the HPA controller was unable to get the target\'s current scale: '
                                               'leaderworkersets.leaderworkerset.x-k8s.io "llama-lws" not found'),
])
def test_an_hpa_that_cannot_scale_is_false_with_its_reason_and_a_warning_once(failing):
    scaling = run(ready_observation(hpa=hpa(ABLE, ACTIVE)))
    broken_hpa = hpa(*[c for c in (ABLE, ACTIVE) if c[0] != failing[0]], failing)
    broken = run(ready_observation(hpa=broken_hpa, previous=scaling, now=at(40)))
    autoscaling = cond(broken, "Autoscaling")
    assert (autoscaling["status"], autoscaling["reason"]) == ("False", failing[2])
    assert failing[3] in autoscaling["message"] and "kubectl describe hpa -n team llama" in autoscaling["message"]
    assert ("prometheus-adapter rule" in autoscaling["message"]) == (failing[2] == "FailedGetPodsMetric")
    assert autoscaling["lastTransitionTime"] == stamp(40)
    assert broken["phase"] == "Ready"  # the model serves; only scaling is broken
    assert events(scaling, broken) == [("Warning", failing[2], autoscaling["message"])]
    assert events(broken, run(ready_observation(hpa=broken_hpa, previous=broken, now=at(41)))) == []
    recovered = run(ready_observation(hpa=hpa(ABLE, ACTIVE), previous=broken, now=at(42)))
    assert cond(recovered, "Autoscaling")["status"] == "True" and events(broken, recovered) == []


def test_a_failing_hpa_on_first_sight_is_a_warning():
    current = run(ready_observation(hpa=hpa(ABLE, NO_METRIC)))
    assert ("Warning", "FailedGetPodsMetric", cond(current, "Autoscaling")["message"]) in events({}, current)


# --- Neuron devices the runtime cannot open ------------------------------------------------------------------

def test_runtime_denied_a_neuron_device_is_failed_with_the_node_fix():
    """The runtime's own message (frameworks.device_access_error) as the kubelet reports it: the container's last
    termination message, the pod crash-looping."""
    from neuronmodel_runtime.frameworks import device_access_error

    message = f"neuronmodel-runtime: {device_access_error('/dev/neuron0')}\n"
    crash = {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container=runtime"}
    pods = [pod(f"llama-{i}", waiting=crash) for i in range(2)]
    pods[1]["status"]["containerStatuses"][0]["lastState"] = {
        "terminated": {"exitCode": 2, "reason": "Error", "message": message}}
    current = run(observe(workload=deployment(), pods=pods))
    ready = cond(current, "Ready")
    assert (current["phase"], ready["reason"]) == ("Failed", "NeuronDeviceAccessDenied")
    assert ready["message"] == message.strip()
    assert "device_ownership_from_security_context = true" in ready["message"]
    assert events({}, current) == [("Warning", "NeuronDeviceAccessDenied", ready["message"])]
    other = {"terminated": {"exitCode": 2, "reason": "Error", "message": "neuronmodel-runtime: model: no folder"}}
    pods[1]["status"]["containerStatuses"][0]["lastState"] = other
    assert cond(run(observe(workload=deployment(), pods=pods)), "Ready")["reason"] == "ContainersFailing"
