"""The spec translated into the `vllm serve` flags that fix vLLM Neuron's compiled shape, and the key they compile
under. Pure; no pod layout here (builders/vllm.py adds the paths, the port and the environment).

Per line, the operator sets what fixes the compiled shape, so one spec always compiles the same graphs. Where each
key is read (vllm-neuron.md §2):

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
  `save_sharded_checkpoint: false` (the artifacts hold graphs only, whatever the release's default), `is_eagle3:
  true` for an EAGLE3 draft (speculation.draftModel.eagle3: the plugin sets enable_eagle_speculation for method
  "eagle" but never is_eagle3, which sets the draft's input width, `models/config.py`), then
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

The key (`key_inputs`, named by `keys.digest`): the image and the releases its line pins (vLLM, the plugin, the
SDK, which pins neuronx-cc and the Neuron runtime), the target (instance family) and LNC, the model's and the
draft's source and revision, and every flag above as emitted. Upstream's own caches leave several of these out
(aws-neuron-sdk#1368, vllm-neuron#38); a change of any of them is a new entry, never a silent miss in a pod.
tests/operator_tests/test_vllm_args.py parses these flags with each line's own vLLM release.
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional

from neuronmodel_operator.api import NeuronModelSpec
from neuronmodel_operator.images import VllmImage
from neuronmodel_runtime.config.buckets import context_buckets

#: vLLM's KV block on the native line (its documented default, passed so that the compiled shape never moves).
NATIVE_BLOCK_SIZE = 32
SPECULATION_METHOD = {"nxdi": "eagle", "native": "eagle3"}


def as_json(value: Any) -> str:
    """A flag's JSON value, in one spelling (sorted keys, no spaces): the same spec gives the same bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _sampling(spec: NeuronModelSpec, line: str) -> Optional[dict[str, Any]]:
    """The line's on-device sampling config; None samples on the host."""
    sampling = spec.sampling
    if not sampling.on_device:
        return None
    if line == "nxdi":
        return {"dynamic": True, "deterministic": False, "global_topk": sampling.global_top_k}
    return {"max_top_k": sampling.global_top_k}


def additional_config(spec: NeuronModelSpec, line: str) -> dict[str, Any]:
    """`--additional-config`: the line's Neuron config, spec.neuronConfigOverrides merged last (engines.py refuses
    the keys set here)."""
    overrides = dict(spec.neuron_config_overrides)
    if line == "nxdi":
        neuron = {"context_encoding_buckets": context_buckets(spec.batching.max_context_length),
                  "on_device_sampling_config": _sampling(spec, line), "save_sharded_checkpoint": False}
        if speculation(spec, line) is not None and spec.speculation.draft_model.eagle3:
            neuron["is_eagle3"] = True  # the plugin never sets it: without, NxDI builds an EAGLE-1 draft graph
        return {"max_prompt_length": spec.batching.max_context_length,
                "override_neuron_config": {**neuron, **overrides}}
    return {"neuron_config": {"on_device_sampling_config": _sampling(spec, line), **overrides}}


def speculation(spec: NeuronModelSpec, line: str) -> Optional[dict[str, Any]]:
    """`--speculative-config` of speculation mode eagle without the draft's path (the pod adds it); None without
    speculation (engines.py refuses the other modes)."""
    if spec.speculation.mode != "eagle" or spec.speculation.draft_model is None:
        return None
    return {"method": SPECULATION_METHOD[line], "num_speculative_tokens": spec.speculation.num_speculative_tokens}


def native_gpu_blocks(spec: NeuronModelSpec) -> int:
    """The native line's KV blocks: each sequence's at max_model_len plus the draft's lookahead, and the null block."""
    lookahead = spec.speculation.num_speculative_tokens if spec.speculation.mode == "eagle" else 0
    per_sequence = math.ceil((spec.batching.max_seq_len + lookahead) / NATIVE_BLOCK_SIZE)
    return spec.batching.max_batch_size * per_sequence + 1


def shape_args(spec: NeuronModelSpec, line: str) -> list[str]:
    """The flags that fix the compiled shape, in the order `vllm serve` gets them."""
    args = ["--tensor-parallel-size", str(spec.parallelism.tensor_parallel_degree),
            "--max-num-seqs", str(spec.batching.max_batch_size),
            "--max-model-len", str(spec.batching.max_seq_len)]
    if spec.model.dtype != "auto":
        args += ["--dtype", spec.model.dtype]
    args.append("--no-enable-prefix-caching")
    if line == "nxdi":
        args += ["--num-gpu-blocks-override", str(spec.batching.max_batch_size)]
    else:
        args += ["--max-num-batched-tokens", str(spec.batching.max_context_length),
                 "--block-size", str(NATIVE_BLOCK_SIZE), "--num-gpu-blocks-override", str(native_gpu_blocks(spec))]
        if not spec.sampling.on_device:
            args.append("--no-async-scheduling")
    return args + ["--additional-config", as_json(additional_config(spec, line))]


def _source(source: str, revision: Optional[str]) -> dict[str, Optional[str]]:
    return {"source": source, "revision": revision}


def key_inputs(spec: NeuronModelSpec, image: str, line: VllmImage, family: str,
               lnc: Optional[int]) -> dict[str, Any]:
    """What the compiled artifacts of `spec` on `family` depend on, for the image `image` of vLLM Neuron `line` (the
    image table's entry of the family: spec.image replaces the image, not the line, and its reference is in the key
    with the releases the line pins). Replicas, resources, placement, the port and the served name are not in it."""
    draft = spec.speculation.draft_model
    return {"engine": "vllm", "image": image, "line": line.line, "vllm": line.vllm, "plugin": line.plugin,
            "sdk": line.sdk, "target": family, "logicalCoreConfig": lnc,
            "model": _source(spec.model.source, spec.model.revision),
            "draft": _source(draft.source, draft.revision) if draft is not None and speculation(spec, line.line)
            else None,
            "flags": shape_args(spec, line.line), "speculation": speculation(spec, line.line)}


__all__ = ["NATIVE_BLOCK_SIZE", "SPECULATION_METHOD", "additional_config", "as_json", "key_inputs",
           "native_gpu_blocks", "shape_args", "speculation"]
