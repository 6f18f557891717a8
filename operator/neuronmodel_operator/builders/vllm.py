"""The container of an engine vllm pod: the spec translated into `vllm serve`'s own flags, and its environment. Pure.

AWS's vLLM Neuron image (images.VLLM_IMAGES) runs its container args as the command (DLC common/vllm_entrypoint.py),
so the args are the whole `vllm serve <model> ...` line; the model and the draft are the local paths sources.py
places them at (the fetch init container downloads hf:// and s3://). Per line, the operator sets what fixes the
compiled shape, so one spec always compiles the same graphs. Where each key is read (vllm-neuron.md §2):

NxDI line (inf2, trn1; vLLM 0.16.0, vllm-neuron 0.5, NxDI 0.10; vllm-neuron @3afb0a9, release 0.5.0):
- `--no-enable-prefix-caching`: the contiguous KV layout, in which the plugin sets block_size = max_model_len
  itself (`vllm_neuron/platform.py`, check_and_update_config). `--block-size` is not passed: vLLM 0.16's parser
  takes only 1, 8, 16, 32, 64, 128 and 256 (`vllm/config/cache.py`, BlockSize), so max_model_len is refused there;
- `--num-gpu-blocks-override <max_num_seqs>`: one block per sequence, as the user guide requires without prefix
  caching (the plugin adds vLLM's null block, `platform.py`);
- `--additional-config`: `max_prompt_length` (`platform.py`: NxDI's max_context_length, and longer prompts refused
  in `platform_overrides.py`) and `override_neuron_config` (`worker/neuronx_distributed_model_loader.py`
  get_neuron_model: merged last over `_get_default_neuron_config`), holding NxDI NeuronConfig keywords
  (`neuronx_distributed_inference/models/config.py`): `context_encoding_buckets` (config/buckets.py, our runtime's
  rule), `on_device_sampling_config` (an OnDeviceSamplingConfig dict: `dynamic`, `deterministic`, `global_topk`
  as the plugin's default has them; null samples on the host, the runner's cpu_sampler),
  `save_sharded_checkpoint: false` (the artifacts hold graphs only, whatever the release's default), then
  spec.neuronConfigOverrides.

Native line (trn2; vLLM 0.29.0, vllm-neuron 0.29.0.1.2.0):
- `--max-num-batched-tokens <max_context_length>`: the largest prefill bucket;
- `--no-enable-prefix-caching --block-size 32 --num-gpu-blocks-override <n>`: the KV block count is baked into the
  compiled programs (the features guide), so it is pinned: every sequence's blocks at full length (with the draft's
  lookahead), plus vLLM's null block;
- `--additional-config '{"neuron_config": {...}}'`: `on_device_sampling_config` with `max_top_k`, or null to sample
  on the host, which async scheduling cannot do (`--no-async-scheduling`), then spec.neuronConfigOverrides. The keys
  are `vllm_neuron/model/neuron_config.py`'s (NeuronConfig.from_dict, OnDeviceSamplingConfig), read in forks that
  carry upstream main (gregnetau/vllm-neuron@3c0a51c) since the code index lacks the upstream file;
  `vllm_neuron/vllm/worker/neuron_model_runner.py` (vllm-project/vllm-neuron@9fc042e) reads
  additional_config["neuron_config"], refuses async execution without on-device sampling, and speculates with
  method eagle3 or dflash only.

Speculation eagle: `--speculative-config {"method": ..., "model": <the draft's path>, "num_speculative_tokens": k}`,
method "eagle" on the NxDI line (EAGLE v1/v3 drafts; the plugin enables NxDI's EAGLE for this method only) and
"eagle3" on the native line.

tests/operator_tests/test_vllm_args.py parses these args with each line's own vLLM release.
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional

from neuronmodel_operator import images
from neuronmodel_operator.builders import sources
from neuronmodel_operator.builders.common import Target
from neuronmodel_runtime.config import env as runtime_env
from neuronmodel_runtime.config.buckets import context_buckets

#: vLLM's KV block on the native line (its documented default, passed so that the compiled shape never moves).
NATIVE_BLOCK_SIZE = 32
#: Where vLLM and the Neuron compilers write, on the pod's emptyDirs (pod.py): VLLM_CACHE_ROOT (the native line's
#: compile cache, torch.compile's), the NxDI line's compiled model, and the working directory (the image's own,
#: /workspace/vllm, is root's, and compilers write their logs into the working directory).
VLLM_CACHE_ROOT = "/var/cache/neuronmodel/vllm"
NXDI_ARTIFACTS = "/var/cache/neuronmodel/neuron-compiled-artifacts"
WORKING_DIR = "/tmp"
SPECULATION_METHOD = {"nxdi": "eagle", "native": "eagle3"}


def line_of(target: Target) -> images.VllmImage:
    """The vLLM Neuron line the pods run: the image table's entry of the instance family (spec.image replaces the
    image, not the line: it must be an image of the same line)."""
    return images.vllm_image_for(target.resolved.instance_family or "")


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _sampling(target: Target, line: str) -> Optional[dict[str, Any]]:
    """The line's on-device sampling config; None samples on the host."""
    sampling = target.spec.sampling
    if not sampling.on_device:
        return None
    if line == "nxdi":
        return {"dynamic": True, "deterministic": False, "global_topk": sampling.global_top_k}
    return {"max_top_k": sampling.global_top_k}


def additional_config(target: Target) -> dict[str, Any]:
    """`--additional-config`: the line's Neuron config, spec.neuronConfigOverrides merged last (engines.py refuses
    the keys set here)."""
    spec, line = target.spec, line_of(target).line
    overrides = dict(spec.neuron_config_overrides)
    if line == "nxdi":
        neuron = {"context_encoding_buckets": context_buckets(spec.batching.max_context_length),
                  "on_device_sampling_config": _sampling(target, line), "save_sharded_checkpoint": False}
        return {"max_prompt_length": spec.batching.max_context_length,
                "override_neuron_config": {**neuron, **overrides}}
    return {"neuron_config": {"on_device_sampling_config": _sampling(target, line), **overrides}}


def speculative_config(target: Target) -> Optional[dict[str, Any]]:
    """`--speculative-config` of speculation mode eagle; None without speculation (engines.py refuses the others)."""
    speculation = target.spec.speculation
    draft = sources.draft_mount(target.spec)
    if speculation.mode != "eagle" or draft is None:
        return None
    return {"method": SPECULATION_METHOD[line_of(target).line], "model": draft.path,
            "num_speculative_tokens": speculation.num_speculative_tokens}


def native_gpu_blocks(target: Target) -> int:
    """The native line's KV blocks: each sequence's at max_model_len plus the draft's lookahead, and the null block."""
    spec = target.spec
    lookahead = spec.speculation.num_speculative_tokens if spec.speculation.mode == "eagle" else 0
    per_sequence = math.ceil((spec.batching.max_seq_len + lookahead) / NATIVE_BLOCK_SIZE)
    return spec.batching.max_batch_size * per_sequence + 1


def serve_args(target: Target) -> list[str]:
    """The container's args: `vllm serve <model path>` and its flags."""
    spec, line = target.spec, line_of(target).line
    args = ["vllm", "serve", sources.model_mount(spec).path,
            "--served-model-name", spec.model.served_model_name or target.name,
            "--host", "0.0.0.0", "--port", str(spec.server.port),
            "--tensor-parallel-size", str(spec.parallelism.tensor_parallel_degree),
            "--max-num-seqs", str(spec.batching.max_batch_size),
            "--max-model-len", str(spec.batching.max_seq_len)]
    if spec.model.dtype != "auto":
        args += ["--dtype", spec.model.dtype]
    args.append("--no-enable-prefix-caching")
    if line == "nxdi":
        args += ["--num-gpu-blocks-override", str(spec.batching.max_batch_size)]
    else:
        args += ["--max-num-batched-tokens", str(spec.batching.max_context_length),
                 "--block-size", str(NATIVE_BLOCK_SIZE), "--num-gpu-blocks-override", str(native_gpu_blocks(target))]
        if not spec.sampling.on_device:
            args.append("--no-async-scheduling")
    args += ["--additional-config", _json(additional_config(target))]
    if (speculative := speculative_config(target)) is not None:
        args += ["--speculative-config", _json(speculative)]
    return args


def env(target: Target, startup_budget_s: int) -> list[dict[str, Any]]:
    """The container's environment: the API key (VLLM_API_KEY, which vLLM's server reads when --api-key is not
    given: vllm/envs.py), the logical NeuronCore config as for our runtime, an offline Hub (the model is local),
    vLLM's cache on the cache emptyDir, and no timeout inside the pod shorter than its startup budget (vLLM waits
    VLLM_ENGINE_READY_TIMEOUT_S, 600 s by default, for the engine, which compiles first).

    PROMETHEUS_MULTIPROC_DIR is left to vLLM: unset, it makes a fresh directory under /tmp (an emptyDir) at every
    start and removes it at exit, while a set one "must be wiped between vLLM runs" (vllm/v1/metrics/prometheus.py),
    which an emptyDir is not when the container restarts in the same pod.
    """
    resolved, line = target.resolved, line_of(target).line
    out: list[dict[str, Any]] = []
    if (ref := target.spec.server.api_key_secret_ref) is not None:
        out.append({"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    if resolved.logical_core_config is not None:
        out.append({"name": runtime_env.LOGICAL_NC_CONFIG, "value": str(resolved.logical_core_config)})
    out += [{"name": "HOME", "value": "/tmp"},
            {"name": "HF_HUB_OFFLINE", "value": "1"},
            {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
            {"name": "VLLM_CACHE_ROOT", "value": VLLM_CACHE_ROOT},
            {"name": "VLLM_ENGINE_READY_TIMEOUT_S", "value": str(startup_budget_s)},
            {"name": runtime_env.NEURON_COMPILE_CACHE_URL, "value": "/var/tmp/neuron-compile-cache"}]
    if line == "nxdi":
        # the plugin loads the compiled model from here, else compiles and saves it here; unset, it would write
        # next to the model, on a read-only mount
        out.append({"name": runtime_env.COMPILED_ARTIFACTS, "value": NXDI_ARTIFACTS})
    else:
        # the SDK's deployment guide: without EFA the server does not start unless told; these pods request no EFA
        out += [{"name": "NEURON_SKIP_EFA_AFFINITY", "value": "1"},
                {"name": "VLLM_NEURON_COMPILATION_TIMEOUT", "value": str(startup_budget_s)}]
    return out


__all__ = ["NATIVE_BLOCK_SIZE", "NXDI_ARTIFACTS", "SPECULATION_METHOD", "VLLM_CACHE_ROOT", "WORKING_DIR",
           "additional_config", "env", "line_of", "native_gpu_blocks", "serve_args", "speculative_config"]
