"""A multi-node NeuronModel reaches Ready on the harness's real LeaderWorkerSet controller (the release
scripts/k8s/install.py pins), its status read the way that release publishes it.

LWS v0.7.0 and v0.8.0 write no status.observedGeneration (it came in v0.9.0): a settled group is Available True with every
group ready and updated. The operator used to wait for an observedGeneration that never came, so a multi-node model
stayed Loading/RollingOut forever; tests/operator_tests/test_status.py has the status shapes of both releases.
"""

from __future__ import annotations

import pytest

from k8s import install
from test_operator import neuronmodel

pytestmark = pytest.mark.slow

#: One group of two pods, one NeuronCore each: both fit the harness's one inf2.xlarge node (2 cores), and a pod
#: with a single core needs no Neuron scheduler extension. No compile cache: no Job, the pods compile in place.
GROUP = {"model": {"source": "s3://models/tiny"}, "framework": "nxdi", "instanceType": "inf2.xlarge",
         "parallelism": {"tensorParallelDegree": 2, "nodes": 2}, "replicas": 1}
LWS_API = ("leaderworkerset.x-k8s.io", "v1")


def version(tag: str) -> tuple[int, ...]:
    return tuple(int(part) for part in tag.lstrip("v").split("."))


def leaderworkerset(api, name: str) -> dict:
    return api.custom.get_namespaced_custom_object(*LWS_API, api.ns, "leaderworkersets", f"{name}-lws")


def group_pods(api, name: str) -> list:
    return api.core.list_namespaced_pod(api.ns, label_selector=f"leaderworkerset.sigs.k8s.io/name={name}-lws").items


def conditions(body: dict) -> dict:
    return {c["type"]: (c["status"], c["reason"]) for c in body["status"]["conditions"]}


def test_a_multi_node_model_is_ready_on_the_pinned_leaderworkerset(api, wait_until):
    api.apply(neuronmodel("group", GROUP))
    body = api.phase("group", "Ready", timeout=120)
    status = body["status"]
    assert (status["ready"], status["replicas"], status["readyReplicas"]) == ("1/1", 1, 1)
    assert status["observedGeneration"] == body["metadata"]["generation"]
    assert conditions(body) == {"ArtifactsReady": ("True", "NotRequired"),
                                "Available": ("True", "MinimumReplicasAvailable"),
                                "Progressing": ("True", "RolloutComplete"), "Ready": ("True", "Ready")}
    wait_until("the Ready Event", lambda: any(e.reason == "Ready" and e.type == "Normal" for e in api.events("group")),
               10)

    written = leaderworkerset(api, "group")["status"]  # as the LWS controller wrote it, nothing removed
    assert ("observedGeneration" in written) == (version(install.LWS_VERSION) >= (0, 9, 0)), written
    assert (written.get("readyReplicas"), written.get("updatedReplicas"), written.get("replicas")) == (1, 1, 1)
    assert {c["type"]: c["status"] for c in written["conditions"]}["Available"] == "True"
    pods = group_pods(api, "group")
    assert len(pods) == 2 and all(p.status.phase == "Running" for p in pods)


def test_a_template_change_of_a_group_settles_ready_on_the_new_pods(api, wait_until):
    # the one inf2.xlarge node has no cores for a surge group: the group is replaced in place
    api.apply(neuronmodel("regroup", {**GROUP, "rollout": {"maxSurge": 0, "maxUnavailable": 1}}))
    api.phase("regroup", "Ready", timeout=120)
    api.patch("regroup", {"resources": {"requests": {"memory": "3Gi"}}})

    def rolled() -> bool:
        body = api.get("regroup")
        status = body.get("status") or {}
        if status.get("observedGeneration") != body["metadata"]["generation"] or status.get("phase") != "Ready":
            return False
        # a model serving through its rollout is Ready all along: settled is when its rollout reads complete
        if conditions(body)["Progressing"] != ("True", "RolloutComplete"):
            return False
        pods = [p for p in group_pods(api, "regroup") if not p.metadata.deletion_timestamp]
        return len(pods) == 2 and all(p.spec.containers[0].resources.requests.get("memory") == "3Gi" for p in pods)
    wait_until("Ready on the new template, the rollout complete", rolled, 120)
    written = leaderworkerset(api, "regroup")["status"]
    assert (written.get("readyReplicas"), written.get("updatedReplicas"), written.get("replicas")) == (1, 1, 1)
    # the new group's pods wait for the old group's cores (the node is full): Unschedulable for a moment, no failure
    assert not [(e.reason, e.message) for e in api.events("regroup") if e.type == "Warning"
                and e.reason != "Unschedulable"]
