"""The compile Job: fills the compile cache for one compile key before the serving pods start.

Cold Neuron compiles fail intermittently (compiler OOM, a node lost mid-compile), so the Job retries with the Job
controller's exponential backoff (10 s, 20 s, ... capped at 6 min), under a deadline. It has no TTL: the
handler reads its completion as ArtifactsReady, and a Job that vanished would be created (and run) again.
"""

from __future__ import annotations

from typing import Any

from neuronmodel_operator import api
from neuronmodel_operator.builders.common import COMPONENT_COMPILE, Target, compile_name, metadata
from neuronmodel_operator.builders.pod import pod_template

BACKOFF_LIMIT = 4
ACTIVE_DEADLINE_S = 6 * 60 * 60


def compile_job(target: Target) -> dict[str, Any]:
    """`<name>-compile-<key10>`: `neuronmodel-runtime compile` with the compile ConfigMap, on the same instance
    type, resources and volumes as the serving pods (compiles target that instance family)."""
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": metadata(target, compile_name(target), COMPONENT_COMPILE,
                             {api.ANNOTATION_COMPILE_KEY: target.resolved.compile_key}),
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            "activeDeadlineSeconds": ACTIVE_DEADLINE_S,
            # An evicted or preempted pod (node drain, spot reclaim) is not the compile's fault: not a retry.
            "podFailurePolicy": {"rules": [{"action": "Ignore",
                                            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]},
            "template": pod_template(target, "compile"),
        },
    }
