"""Which checkpoints the TNx runner serves: the model types of transformers-neuronx 0.13's own registry
(`modeling_auto.NEURON_MODEL_FOR_CAUSAL_LM_MAPPING`) whose classes can drive the slot contract, and why each other one
cannot (src/transformers_neuronx at 1ade6d7).
"""

from __future__ import annotations

from typing import Any, Optional

from neuronmodel_runtime.runners.base import RunnerError

#: The model types of TNx's registry (modeling_auto.py) the runner drives: their classes (llama/model.py, which
#: code_llama maps to; mistral/model.py; mixtral/model.py) are base.NeuronModelBase models (save/load of compiled
#: artifacts) with forward(input_ids, cache_ids, start_ids) and continuous batching (context_batch_sizes [1]).
SERVED_MODEL_TYPES = ("code_llama", "llama", "mistral", "mixtral")
#: Why each other model type of the 0.13 registry is not served (src/transformers_neuronx at 1ade6d7).
UNSERVED_MODEL_TYPES = {
    "gptj": "GPTJForSampling (gptj/model.py) is a module.PretrainedModel: no save/load of compiled artifacts, and "
            "its forward takes cache_offset, not per-row cache_ids and start_ids (no continuous batching)",
    "gpt_neox": "GPTNeoXForSampling (gptneox/model.py) is a module.PretrainedModel: no save/load of compiled "
                "artifacts, and its forward takes cache_offset, not per-row cache_ids and start_ids (no continuous "
                "batching)",
    "bloom": "BloomForSampling (bloom/model.py) sets no context_batch_sizes, so continuous batching's context "
             "encoding fails (base.py _context_dynamic_batching: \"doesn't support dynamic batching\")",
    "opt": "OPTForSampling (opt/model.py) sets no context_batch_sizes, so continuous batching's context encoding "
           "fails (base.py _context_dynamic_batching: \"doesn't support dynamic batching\")",
    "gpt2": "GPT2ForSamplingWithContextBroadcasting (gpt2/model.py) has no continuous batching: its forward never "
            "maps start_ids to KV lines (no base.py _preprocess) but takes them as a padding offset",
}


def model_class(mapping: dict[str, Any], model_type: Optional[str], version: str, what: str = "model") -> Any:
    """TNx's class for a checkpoint's model_type, from its own registry (modeling_auto.py), if the runner serves it
    (`SERVED_MODEL_TYPES`)."""
    served = [name for name in SERVED_MODEL_TYPES if name in mapping]
    if model_type not in served:
        reason = (UNSERVED_MODEL_TYPES.get(str(model_type), "the tnx runner was not written for it")
                  if model_type in mapping else f"transformers-neuronx {version} has no class for it")
        raise RunnerError(f"{what}: model_type {model_type!r} is not served by the tnx runner: {reason}. It serves "
                          f"{', '.join(served)}; serve it with framework nxdi or torch")
    return mapping[model_type]


__all__ = ["SERVED_MODEL_TYPES", "UNSERVED_MODEL_TYPES", "model_class"]
