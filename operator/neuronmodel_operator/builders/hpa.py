"""The HorizontalPodAutoscaler of spec.autoscaling: the per-pod queue depth."""

from __future__ import annotations

from typing import Any, Optional

from neuronmodel_operator.builders.common import COMPONENT_SERVER, Target, metadata, workload_ref

#: Neuron pods take minutes to start (load, or compile): scale up at once, scale down only after 10 quiet minutes,
#: or a short lull would drop a replica that takes minutes to get back.
SCALE_UP_WINDOW_S = 0
SCALE_DOWN_WINDOW_S = 600


def metric_name(target: Target) -> str:
    """spec.autoscaling.metric, else the operator's default (Target.hpa_metric)."""
    autoscaling = target.spec.autoscaling
    return autoscaling.metric if autoscaling and autoscaling.metric else target.hpa_metric


def hpa(target: Target) -> Optional[dict[str, Any]]:
    """`<name>` on the Deployment (or the LeaderWorkerSet when nodes > 1); None without spec.autoscaling."""
    autoscaling = target.spec.autoscaling
    if autoscaling is None:
        return None
    metric = {"type": "Pods", "pods": {"metric": {"name": metric_name(target)},
                                       "target": {"type": "AverageValue",
                                                  "averageValue": autoscaling.target_average_value}}}
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": metadata(target, target.name, COMPONENT_SERVER),
            "spec": {"scaleTargetRef": workload_ref(target),
                     "minReplicas": autoscaling.min_replicas, "maxReplicas": autoscaling.max_replicas,
                     "metrics": [metric],
                     "behavior": {"scaleUp": {"stabilizationWindowSeconds": SCALE_UP_WINDOW_S},
                                  "scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_WINDOW_S}}}}
