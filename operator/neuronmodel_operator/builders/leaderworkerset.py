"""The LeaderWorkerSet of a multi-node model (nodes > 1): one group of `nodes` pods per replica.

The leader runs `neuronmodel-runtime serve` (the HTTP server, probes, the Service's endpoint, TP rank 0, the step
broadcast); the workers run `neuronmodel-runtime worker` and hold the other TP shards. Both find the group from
the LWS_* variables the LWS controller injects (runtime distributed/topology.py). A group is placed as one: its
pods request their node's EFA devices (resolve.efa_per_pod) and, with an exclusive-topology key, a group has a
node group (or whatever the key's value stands for) to itself. Field names follow the LeaderWorkerSet v1 CRD (v0.7).
"""

from __future__ import annotations

from typing import Any

from neuronmodel_operator import api
from neuronmodel_operator.builders.common import (COMPONENT_SERVER, LWS_API_VERSION, LWS_KIND, Target, metadata,
                                                  served_record, workload_name)
from neuronmodel_operator.builders.deployment import rolling_update
from neuronmodel_operator.builders.configmap import serving_configmap_name
from neuronmodel_operator.builders.pod import pod_template


#: LeaderWorkerSet's 1:1 placement of groups on topology domains: every pod of a group lands in one domain (the
#: node label's value), and no other group's pods in it.
EXCLUSIVE_TOPOLOGY = "leaderworkerset.sigs.k8s.io/exclusive-topology"


def leaderworkerset(target: Target) -> dict[str, Any]:
    """`<name>-lws` (see common.LWS_SUFFIX); `replicas` (groups) left out under autoscaling, as for the
    Deployment."""
    spec: dict[str, Any] = {}
    if target.spec.autoscaling is None:
        spec["replicas"] = target.spec.replica_count()
    spec.update({
        "leaderWorkerTemplate": {
            "size": target.spec.parallelism.nodes,
            # A group is one model sharded over its nodes: one pod lost means the whole group restarts.
            "restartPolicy": "RecreateGroupOnPodRestart",
            "leaderTemplate": pod_template(target, "serve", serving_configmap_name(target)),
            "workerTemplate": pod_template(target, "worker", serving_configmap_name(target)),
        },
        "startupPolicy": "LeaderCreated",
        "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": rolling_update(target)},
    })
    annotations = {api.ANNOTATION_SERVED: served_record(target)}
    if target.resolved.group_topology_key:
        annotations[EXCLUSIVE_TOPOLOGY] = target.resolved.group_topology_key
    return {"apiVersion": LWS_API_VERSION, "kind": LWS_KIND,
            "metadata": metadata(target, workload_name(target), COMPONENT_SERVER, annotations), "spec": spec}
