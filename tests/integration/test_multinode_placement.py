"""Multi-node groups on trn1 as EKS has them: two managed node groups of two trn1.32xlarge each (kwok nodes with the
EFA device plugin's resource), a NeuronModel of TP 64 over 2 nodes with 2 replicas. The real scheduler and the
pinned LeaderWorkerSet controller place it: every group has a node group to itself (exclusive topology), every pod
requests its node's 8 EFA devices, and the model reaches Ready. A template change then rolls both groups over on those
same two node groups: with the exclusive topology a surge group needs a third, free node group, so the rollout
replaces each group in place (rollout 1 / 0 by default for nodes > 1); with the old default maxSurge 1 the surge group
stayed Pending forever and the model never left RollingOut.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client as kube

from k8s import nodes
from test_operator import neuronmodel

pytestmark = pytest.mark.slow

POOL = {"neuronmodel-test/pool": "multi-node"}  # only this test's nodes: the harness's own trn1 node stays out
NODE_GROUPS = {"trn1-a": ("kwok-trn1-a0", "kwok-trn1-a1"), "trn1-b": ("kwok-trn1-b0", "kwok-trn1-b1")}
SPEC = {"model": {"source": "s3://models/llama-70b"}, "framework": "nxdi", "instanceType": "trn1.32xlarge",
        "parallelism": {"tensorParallelDegree": 64, "nodes": 2}, "replicas": 2, "nodeSelector": POOL}


@pytest.fixture
def node_groups(control_plane, admin_client, wait_until):
    core = kube.CoreV1Api(admin_client)
    names = [name for members in NODE_GROUPS.values() for name in members]
    items = []
    for group, members in NODE_GROUPS.items():
        for name in members:
            node = nodes.node("trn1.32xlarge", name=name, nodegroup=group)
            node["metadata"]["labels"].update(POOL)
            items.append(node)
    control_plane.kubectl("apply", "--server-side", "-f", "-",
                          stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))

    def ready() -> bool:
        conditions = [c for name in names for c in core.read_node(name).status.conditions or []]
        return sum(c.type == "Ready" and c.status == "True" for c in conditions) == len(names)
    wait_until("the node groups Ready", ready, 60)
    yield NODE_GROUPS
    for name in names:
        core.delete_node(name)


def _placement(pods) -> dict[str, set[str]]:
    """LWS group index -> the node groups its pods run in."""
    node_group = {name: group for group, members in NODE_GROUPS.items() for name in members}
    placed: dict[str, set[str]] = {}
    for pod in pods:
        placed.setdefault(pod.metadata.labels["leaderworkerset.sigs.k8s.io/group-index"], set()).add(
            node_group[pod.spec.node_name])
    return placed


def test_each_group_has_a_node_group_to_itself_with_its_efa_devices(api, node_groups):
    api.apply(neuronmodel("big", SPEC))
    body = api.phase("big", "Ready", timeout=180)
    resolved = body["status"]["resolved"]
    assert (resolved["efaDevicesPerPod"], resolved["groupTopologyKey"]) == (8, nodes.NODEGROUP_LABEL)
    assert body["status"]["ready"] == "2/2"

    group = api.custom.get_namespaced_custom_object("leaderworkerset.x-k8s.io", "v1", api.ns, "leaderworkersets",
                                                    "big-lws")
    assert group["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/exclusive-topology"] == \
        nodes.NODEGROUP_LABEL
    pods = api.core.list_namespaced_pod(api.ns, label_selector="leaderworkerset.sigs.k8s.io/name=big-lws").items
    assert len(pods) == 4 and all(p.status.phase == "Running" for p in pods)
    for pod in pods:
        resources = pod.spec.containers[0].resources
        assert resources.requests["vpc.amazonaws.com/efa"] == resources.limits["vpc.amazonaws.com/efa"] == "8"
        assert resources.limits["aws.amazon.com/neuroncore"] == "32"
    placed = _placement(pods)
    assert sorted(placed) == ["0", "1"] and all(len(groups) == 1 for groups in placed.values()), placed
    assert placed["0"] != placed["1"], placed  # one group per node group, never two in one
    # every pod on its own node (a pod takes all of a trn1.32xlarge's NeuronCores)
    assert len({pod.spec.node_name for pod in pods}) == 4

    # the Service reaches the leaders only: the workers serve no HTTP
    selector = api.core.read_namespaced_service("big", api.ns).spec.selector
    leaders = api.core.list_namespaced_pod(api.ns, label_selector=",".join(f"{k}={v}" for k, v in selector.items()))
    assert sorted(p.metadata.labels["leaderworkerset.sigs.k8s.io/worker-index"] for p in leaders.items) == ["0", "0"]


def test_a_template_change_rolls_every_group_over_on_as_many_node_groups_as_groups(api, node_groups, wait_until):
    api.apply(neuronmodel("roll", SPEC))
    api.phase("roll", "Ready", timeout=180)
    group = api.custom.get_namespaced_custom_object("leaderworkerset.x-k8s.io", "v1", api.ns, "leaderworkersets",
                                                    "roll-lws")
    rolling = group["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]  # with LWS's own partition: 0
    assert (rolling["maxUnavailable"], rolling["maxSurge"]) == (1, 0)
    toleration = {"key": "example.com/maintenance", "operator": "Exists", "effect": "NoSchedule"}
    api.patch("roll", {"tolerations": [toleration]})  # a new pod template, the same compile key

    def rolled() -> list:
        body = api.get("roll")
        status = body.get("status") or {}
        if status.get("observedGeneration") != body["metadata"]["generation"] or status.get("phase") != "Ready":
            return []
        pods = [p for p in api.core.list_namespaced_pod(api.ns, label_selector="leaderworkerset.sigs.k8s.io/name="
                                                         "roll-lws").items if not p.metadata.deletion_timestamp]
        new = [p for p in pods if p.status.phase == "Running" and any(
            t.key == toleration["key"] for t in p.spec.tolerations or [])]
        return new if len(pods) == len(new) == 4 else []
    pods = wait_until("both groups on the new template, Ready", rolled, 300)
    placed = _placement(pods)
    assert sorted(placed) == ["0", "1"] and all(len(groups) == 1 for groups in placed.values()), placed
    assert placed["0"] != placed["1"], placed
    body = api.get("roll")
    assert body["status"]["ready"] == "2/2" and not body["status"].get("warnings"), body["status"]


def ready_message(api, name: str) -> str:
    return next((c["message"] for c in (api.get(name).get("status") or {}).get("conditions") or []
                 if c["type"] == "Ready"), "")


def test_a_group_more_than_the_node_groups_says_how_to_roll_without_a_free_one(api, node_groups, wait_until):
    """Three groups, two node groups: the third group (as a rollout's surge group would) is refused by the real
    scheduler for LWS's exclusive anti-affinity, and the status says what to change."""
    api.apply(neuronmodel("crowded", {**SPEC, "replicas": 3}))
    message = wait_until("the advice in the status", lambda: (m := ready_message(api, "crowded")) and
                         "anti-affinity" in m and m, 180)
    assert "each serving group needs a node group of its own (LeaderWorkerSet exclusive topology on " \
           f"{nodes.NODEGROUP_LABEL})" in message, message
    assert "set spec.rollout.maxSurge 0 and maxUnavailable 1" in message, message


def test_an_exclusive_key_on_no_node_is_named_in_the_status(api, node_groups, wait_until):
    """Karpenter's and Auto Mode's nodes carry no eks.amazonaws.com/nodegroup: here a key no node has."""
    spec = {**SPEC, "replicas": 1, "parallelism": {**SPEC["parallelism"], "groupTopologyKey": "example.com/rack"}}
    api.apply(neuronmodel("keyless", spec))
    body = api.phase("keyless", "Pending", timeout=120)
    message = wait_until("the key named", lambda: (m := ready_message(api, "keyless")) and
                         "exclusive-topology key example.com/rack" in m and m, 120)
    assert "is a label on none of the" in message and "spec.parallelism.groupTopologyKey" in message, message
    assert body["status"]["phase"] == "Pending"
