"""The compile Job and its ConfigMap: fill the compile cache for one compile key before the serving pods start.

Cold Neuron compiles fail intermittently (compiler OOM, a node lost mid-compile), so the Job retries with the Job
controller's exponential backoff (10 s, 20 s, ... capped at 6 min), under a deadline. It has no TTL: the
handler reads its completion as ArtifactsReady, and a Job that vanished would be created (and run) again.

A Job's pod template is immutable, so the Job is named by everything in it (`compile_name`): an edit that changes
the template but not the compile key (memory, the ServiceAccount, the scheduler) is a new Job, never a 422. The
new Job of an unchanged key finds the artifacts in the cache (or waits on the running compile's lease) and exits.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Optional

from neuronmodel_operator import api
from neuronmodel_operator.builders.common import COMPONENT_COMPILE, Target, metadata
from neuronmodel_operator.builders.configmap import CONTENT_CHARS, config_map, runtime_config
from neuronmodel_operator.builders.pod import pod_template

BACKOFF_LIMIT = 4
ACTIVE_DEADLINE_S = 6 * 60 * 60


def _job(target: Target, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": metadata(target, name, COMPONENT_COMPILE,
                             {api.ANNOTATION_COMPILE_KEY: target.resolved.compile_key}),
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            "activeDeadlineSeconds": ACTIVE_DEADLINE_S,
            # An evicted or preempted pod (node drain, spot reclaim) is not the compile's fault: not a retry.
            "podFailurePolicy": {"rules": [{"action": "Ignore",
                                            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]},
            "template": pod_template(target, "compile", config_map=None if target.runs_vllm else name),
        },
    }


def compile_name(target: Target) -> str:
    """`<name>-compile-<sha10>`, the sha256 of the Job (with its own name left out) and of its RuntimeConfig (none
    for engine vllm, whose flags are in the Job): the compile key, the image and every pod setting are in it. The Job
    and its ConfigMap share the name."""
    config = None if target.runs_vllm else runtime_config(target, for_compile=True)
    rendered: dict[str, Any] = {"job": _job(target, "")}
    if config is not None:
        rendered["config"] = config
    digest = hashlib.sha256(json.dumps(rendered, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return f"{target.name}-compile-{digest[:CONTENT_CHARS]}"


def compile_job(target: Target) -> dict[str, Any]:
    """`compile_name`: `neuronmodel-runtime compile` with the compile ConfigMap, on the same instance type,
    resources and volumes as the serving pods (compiles target that instance family); engine vllm: vLLM compiling
    under its supervisor beside `store-artifacts`, which stores what it compiled (vllm.py): a vLLM that exits fails
    the pod, a retry of the Job's backoffLimit."""
    return _job(target, compile_name(target))


def compile_configmap(target: Target) -> Optional[dict[str, Any]]:
    """The compile Job's own config, of the NEW spec (the serving pods may still run an older one while the Job
    compiles), with the spec's own cache policy; None for engine vllm (its Job reads no RuntimeConfig)."""
    if target.runs_vllm:
        return None
    return config_map(target, compile_name(target), COMPONENT_COMPILE, for_compile=True)
