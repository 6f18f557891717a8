"""The PodDisruptionBudget of a model with more than one replica."""

from __future__ import annotations

from typing import Any, Optional

from neuronmodel_operator.builders.common import COMPONENT_SERVER, Target, metadata, selector


def wants_pdb(target: Target) -> bool:
    """More than one replica, now or under the autoscaler (maxReplicas > 1): with one pod, a PDB could only
    block node drains or allow them all."""
    spec = target.spec
    return spec.replica_count() > 1 or (spec.autoscaling is not None and spec.autoscaling.max_replicas > 1)


def pdb(target: Target) -> Optional[dict[str, Any]]:
    """`<name>`: at most one serving pod evicted at a time (a Neuron pod takes minutes to come back)."""
    if not wants_pdb(target):
        return None
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": metadata(target, target.name, COMPONENT_SERVER),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(target)},
                     # A pod that is not ready (still compiling, crash-looping) may always be evicted: it serves
                     # nothing, and keeping it would block node drains.
                     "unhealthyPodEvictionPolicy": "AlwaysAllow"}}
