"""The Deployment of a single-node model (nodes == 1)."""

from __future__ import annotations

from typing import Any

from neuronmodel_operator import api, placement
from neuronmodel_operator.builders.common import (COMPONENT_SERVER, Target, metadata, selector, served_record,
                                                  workload_name)
from neuronmodel_operator.builders.configmap import serving_configmap_name
from neuronmodel_operator.builders.pod import pod_template, startup_budget_s

REVISION_HISTORY = 3
#: Beyond the startup budget: scheduling, image pull and the model download (init containers).
PROGRESS_MARGIN_S = 600


def rolling_update(target: Target) -> dict[str, Any]:
    """maxUnavailable / maxSurge of spec.rollout, its unset fields placement.rollout's defaults: 0 / 1 on one node
    (serving capacity kept; the surge pod needs spare NeuronCores), 1 / 0 for a multi-node group."""
    return placement.rollout(target.spec)


def deployment(target: Target) -> dict[str, Any]:
    """`<name>`: the serving pods. `replicas` is left out under spec.autoscaling: the HPA owns it, and the
    operator's server-side apply must not take the field back at each reconcile."""
    spec: dict[str, Any] = {}
    if target.spec.autoscaling is None:
        spec["replicas"] = target.spec.replica_count()
    spec.update({
        "selector": {"matchLabels": selector(target)},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling_update(target)},
        "revisionHistoryLimit": REVISION_HISTORY,
        # Only a condition (ProgressDeadlineExceeded), never a kill: status reports a rollout that is stuck.
        "progressDeadlineSeconds": startup_budget_s(target) + PROGRESS_MARGIN_S,
        "template": pod_template(target, "serve", serving_configmap_name(target)),
    })
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": metadata(target, workload_name(target), COMPONENT_SERVER,
                                 {api.ANNOTATION_SERVED: served_record(target)}),
            "spec": spec}
