"""How much of a node a model's pods ask for, and how large their emptyDirs may grow.

The runtime container requests its share of the instance type's CPU and RAM (devices.default_requests; at least
the RAM the weights take while they load) or, on the torch runner, TORCH_REQUESTS, plus the ephemeral storage its
emptyDirs may fill; each emptyDir gets a sizeLimit. Sizes follow spec.model.parameters, else an assumed size.
"""

from __future__ import annotations

import math

from neuronmodel_operator import devices
from neuronmodel_operator.builders import sources
from neuronmodel_operator.builders.common import Target
from neuronmodel_operator.resolve import loading_gib

#: Requests of a torch (CPU reference runner) container: it serves small models, and a dozen replicas fit one
#: 4-vCPU node (the local control plane's CPU node), two and a client the real-node end-to-end test's 2 cores.
TORCH_REQUESTS = {"cpu": "250m", "memory": "1Gi"}
#: Weights assumed when spec.model.parameters is unset: an 8B model in bfloat16 on the Neuron runners; the torch
#: runner's about 500M parameters (it serves small models on CPUs).
DEFAULT_WEIGHTS_GIB = 16
DEFAULT_WEIGHTS_GIB_TORCH = 1
#: /dev/shm (memory; the sizeLimit counts against the pod's memory): PyTorch and the Neuron runtime's IPC.
SHM_SIZE = {"neuron": "4Gi", "torch": "1Gi"}


def shm_size(target: Target) -> str:
    return SHM_SIZE["torch" if _torch(target) else "neuron"]


def _torch(target: Target) -> bool:
    return target.resolved.cores_per_pod == 0


def _weights_gib(target: Target) -> float:
    parameters = target.spec.model.parameter_count()
    if parameters is None:
        return DEFAULT_WEIGHTS_GIB_TORCH if _torch(target) else DEFAULT_WEIGHTS_GIB
    return devices.weights_gib(parameters, target.spec.model.dtype)


def _downloads(target: Target) -> list[sources.SourceMount]:
    mounts = (sources.model_mount(target.spec), sources.draft_mount(target.spec))
    return [m for m in mounts if m is not None and m.fetch is not None]


def volume_sizes_gib(target: Target) -> dict[str, int]:
    """sizeLimit (GiB) of each disk-backed emptyDir, from the weights' size (spec.model.parameters, else
    DEFAULT_WEIGHTS_GIB) with margin:

    - `models` (only when a source is downloaded): the checkpoint, +20% (tokenizer, staging), +20% more for a
      downloaded draft (smaller than its target), +1 GiB;
    - `cache` (/var/cache/neuronmodel, compiled artifacts): 10% of the weights + 2 GiB of graphs, plus the weights
      again when stored pre-sharded (compileCache.shardedWeights); torch stores its converted (float32) weights:
      twice their bfloat16 size + 1 GiB;
    - `neuron-cache` (/var/tmp, the Neuron compiler's work and cache): 25% of the weights + 4 GiB; torch 1 GiB;
    - `tmp` (/tmp, HOME): 2 GiB; torch 1 GiB.
    """
    weights, torch = _weights_gib(target), _torch(target)
    sizes = {}
    if downloads := _downloads(target):
        share = 1.2 + (0.2 if any(m.init_name == "fetch-draft" for m in downloads) else 0)
        sizes[sources.MODELS_VOLUME] = math.ceil(weights * share) + 1
    if torch:
        sizes.update({"cache": math.ceil(2 * weights) + 1, "neuron-cache": 1, "tmp": 1})
    else:
        stored = weights if target.spec.compile_cache.sharded_weights else 0
        sizes.update({"cache": math.ceil(0.1 * weights + stored) + 2, "neuron-cache": math.ceil(0.25 * weights) + 4,
                      "tmp": 2})
    return sizes


def default_requests(target: Target) -> dict[str, str]:
    """The runtime container's cpu, memory and ephemeral-storage requests: a Neuron pod's share of its instance
    type, and the RAM its weights take while they load (devices.default_requests), TORCH_REQUESTS on the torch
    runner; the storage its emptyDirs may fill."""
    resolved = target.resolved
    instance = devices.INSTANCE_TYPES.get(resolved.instance_type or "")
    if _torch(target) or instance is None:
        requests = dict(TORCH_REQUESTS)
    else:
        lnc = resolved.logical_core_config or instance.family.default_lnc
        requests = devices.default_requests(instance, lnc, resolved.cores_per_pod, loading_gib(target.spec))
    requests["ephemeral-storage"] = f"{sum(volume_sizes_gib(target).values())}Gi"
    return requests


def fetch_requests(target: Target) -> dict[str, str]:
    """A download init container writes the models emptyDir and /tmp."""
    sizes = volume_sizes_gib(target)
    return {"ephemeral-storage": f"{sizes[sources.MODELS_VOLUME] + sizes['tmp']}Gi"}


def artifacts_requests(target: Target) -> dict[str, str]:
    """Engine vllm's `artifacts` containers write the cache emptyDir (vLLM's compiled folder) and /tmp."""
    sizes = volume_sizes_gib(target)
    return {"ephemeral-storage": f"{sizes['cache'] + sizes['tmp']}Gi"}
