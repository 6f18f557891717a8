"""The serving engines a NeuronModel chooses with spec.engine, and what engine vllm refuses of a spec. Pure.

neuronmodel (the default) runs our runtime. vllm runs vLLM Neuron's own `vllm serve` from AWS's image of the
instance family (images.VLLM_IMAGES: the native plugin on trn2, the NxDI-based one on inf2/trn1), with the spec
translated into vLLM's flags (builders/vllm.py). `check_vllm` refuses again what the CRD's CEL refuses for it
(spec_rules.VLLM_RULES), for a spec admitted under an older CRD; `check_vllm_line` refuses what CEL cannot know,
since it depends on the line, that is on the resolved instance family.
"""

from __future__ import annotations

from neuronmodel_operator import devices
from neuronmodel_operator.api import NeuronModelSpec, SpecError
from neuronmodel_operator.images import VllmImage
from neuronmodel_operator.vllm_native_keys import check_native_overrides

_KV_LAYOUT = "the operator (the contiguous KV layout: prefix caching off, one KV block per sequence)"

#: NeuronConfig keywords that spec.neuronConfigOverrides may not set on the NxDI line (keyword -> what sets it): the
#: plugin derives them from vLLM's flags, which the operator derives from these fields (vllm-neuron 0.5
#: `worker/neuronx_distributed_model_loader.py`, `_get_default_neuron_config`), or the operator pins them. As
#: `override_neuron_config` is merged last, an override would silently contradict the flag.
NXDI_DERIVED = {
    "tp_degree": "parallelism.tensorParallelDegree",
    **dict.fromkeys(("batch_size", "ctx_batch_size", "tkg_batch_size", "max_batch_size", "kv_cache_batch_size",
                     "is_continuous_batching"), "batching.maxBatchSize"),
    "max_context_length": "batching.maxContextLength",
    **dict.fromkeys(("seq_len", "max_length", "n_positions"), "batching.maxSeqLen"),
    "torch_dtype": "model.dtype",
    "on_device_sampling_config": "sampling.onDevice and sampling.globalTopK",
    **dict.fromkeys(("speculation_length", "enable_fused_speculation", "enable_eagle_speculation"),
                    "speculation.mode and speculation.numSpeculativeTokens"),
    "is_eagle3": "speculation.draftModel.eagle3",
    **dict.fromkeys(("is_prefix_caching", "is_block_kv_layout", "pa_num_blocks", "pa_block_size"), _KV_LAYOUT),
    "save_sharded_checkpoint": "the operator (the weights load from the checkpoint)",
    "logical_nc_config": "parallelism.logicalCoreConfig",
}
#: The native plugin's neuron_config keys the operator sets (builders/vllm.py).
NATIVE_DERIVED = {"on_device_sampling_config": "sampling.onDevice and sampling.globalTopK"}


def check_vllm(spec: NeuronModelSpec) -> None:
    """Refuse what engine vllm cannot serve, whatever the instance family (the CRD's rules).

    Raises:
        SpecError: naming the field and the fix.
    """
    if spec.framework != "auto":
        raise SpecError(f"spec.framework: {spec.framework} chooses our runtime's runner, and engine vllm runs vLLM "
                        "Neuron's own; remove spec.framework (auto), or use engine neuronmodel")
    if spec.speculation.mode in ("draft", "promptLookup"):
        raise SpecError(f"spec.speculation.mode: {spec.speculation.mode} is not served by engine vllm (vLLM Neuron "
                        "speculates with EAGLE drafts only); use mode eagle with an EAGLE draft, or engine neuronmodel")
    if spec.speculation.mode != "none" and not spec.sampling.on_device:
        raise SpecError("spec.sampling.onDevice must be true with engine vllm and speculation: vLLM Neuron reads the "
                        "accepted draft tokens from the on-device sampler's output only (inf2/trn1) or refuses to "
                        "speculate without it (trn2); set sampling.onDevice true, or speculation.mode none, or use "
                        "engine neuronmodel")
    if spec.compile_cache.sharded_weights:
        raise SpecError("spec.compileCache.shardedWeights: vLLM Neuron loads the weights from the checkpoint and "
                        "stores compiled graphs only; remove shardedWeights, or use engine neuronmodel")
    if spec.instance_type is not None and not devices.is_neuron_instance(spec.instance_type):
        raise SpecError(f"spec.instanceType: {spec.instance_type} is not a Neuron instance type, and vLLM Neuron serves "
                        "inf2, trn1 and trn2; set one, or leave instanceType out, or use engine neuronmodel with "
                        "framework torch for a CPU node")
    if spec.parallelism.nodes != 1:
        raise SpecError("spec.parallelism.nodes must be 1 with engine vllm: vLLM Neuron serves no tensor parallelism "
                        "across nodes; use one node (a larger instanceType), or engine neuronmodel")


def check_vllm_line(spec: NeuronModelSpec, image: VllmImage) -> None:
    """Refuse what the line of `image` cannot take: overrides of what the operator sets through the flags, and on the
    native line a longest prompt shorter than the batch (vLLM refuses max_num_batched_tokens < max_num_seqs).

    Raises:
        SpecError: naming the field and the fix.
    """
    derived = NXDI_DERIVED if image.line == "nxdi" else NATIVE_DERIVED
    clash = sorted(set(spec.neuron_config_overrides) & set(derived))
    if clash:
        set_by = "; ".join(f"{key} is set by {derived[key]}" for key in clash)
        raise SpecError(f"spec.neuronConfigOverrides: {set_by} with engine vllm on {image.families[0]}, through "
                        "vLLM's flags: remove the key; where a field is named, set that field instead")
    if image.line == "native":  # keys its NeuronConfig reads (it drops the others silently)
        check_native_overrides(spec.neuron_config_overrides, image.families[0])
    batching = spec.batching
    if image.line == "native" and batching.max_context_length < batching.max_batch_size:
        raise SpecError(f"spec.batching.maxContextLength ({batching.max_context_length}) must be at least "
                        f"batching.maxBatchSize ({batching.max_batch_size}) with engine vllm on trn2: it is vLLM's "
                        "--max-num-batched-tokens, which vLLM refuses below --max-num-seqs")


__all__ = ["NATIVE_DERIVED", "NXDI_DERIVED", "check_vllm", "check_vllm_line"]
