"""Which NxDI class serves a checkpoint: NxDI's own registry (`utils/constants.py` MODEL_TYPES), the classes a release
has before its registry lists them (FALLBACK_CLASSES), the multimodal classes the slot contract cannot drive
(NOT_TEXT_ONLY), a Mistral sliding window the Llama class would ignore, whether a draft is an EAGLE3 one, and the
decoder class a fused-speculation instance swaps on its class up to 0.6 (`decoder_class`).
"""

from __future__ import annotations

import importlib
import json
import logging
from pathlib import Path
from typing import Any, Mapping, Optional

from neuronmodel_runtime.runners.base import RunnerError

log = logging.getLogger(__name__)

#: NxDI model types the runner refuses although NxDI has a causal-LM class for them: the slot contract drives
#: text-only `NeuronBaseForCausalLM`s, and these take images.
NOT_TEXT_ONLY = {
    "mllama": "Llama 3.2 Vision: its forward needs pixel values, aspect ratios and a vision mask with each prompt",
    **dict.fromkeys(("llama4", "pixtral", "qwen2_vl", "qwen3_vl"),
                    "an image-to-text model in NxDI: its config takes a text and a vision NeuronConfig "
                    "(ImageToTextInferenceConfig) and its forward image inputs"),
}

#: Checkpoints a release's MODEL_TYPES does not list that a class of the same release serves exactly:
#: model_type -> (module, class, what serves it, why a release without that class cannot). NxDI lists mistral
#: from 0.9 (ef2731e) and qwen2 from 0.5 (f9e99f9).
FALLBACK_CLASSES = {
    # Mistral is Llama's architecture plus a sliding window, which the Llama class lacks (see sliding_window_error)
    "mistral": ("neuronx_distributed_inference.models.llama.modeling_llama", "NeuronLlamaForCausalLM",
                "the Llama class, as vLLM serves Mistral on NxDI releases without a Mistral class", ""),
    "qwen2": ("neuronx_distributed_inference.models.qwen2.modeling_qwen2", "NeuronQwen2ForCausalLM",
              "models/qwen2, which ships (2c46add, 0.4) before MODEL_TYPES lists it",
              " (no models/qwen2 before 0.4, and the Llama class cannot stand in: its attention has one bias flag "
              "for q/k/v and o, attention_bias, so Qwen2's q/k/v biases would be dropped)"),
}


def model_class(model_types: dict[str, dict[str, Any]], model_type: str, version: str) -> Any:
    """NxDI's causal-LM class for a checkpoint's model_type: from NxDI's own registry (`utils/constants.py`
    MODEL_TYPES), else FALLBACK_CLASSES where the release has the class; multimodal types are refused."""
    if model_type in NOT_TEXT_ONLY:
        raise RunnerError(f"model_type {model_type!r} is {NOT_TEXT_ONLY[model_type]}; the nxdi runner serves "
                          "text-only causal LMs: serve its text-only checkpoint, or the model with vLLM Neuron")
    entry = model_types.get(model_type, {})
    if "causal-lm" in entry:
        return entry["causal-lm"]
    module, name, how, why_not = FALLBACK_CLASSES.get(model_type, ("", "", "", ""))
    if module:
        try:
            cls = getattr(importlib.import_module(module), name)
        except ImportError:
            cls = None
        if cls is not None:
            log.info("NxDI %s lists no %s class: serving it with %s", version, model_type, how)
            return cls
    supported = sorted(k for k, v in model_types.items() if "causal-lm" in v and k not in NOT_TEXT_ONLY)
    raise RunnerError(
        f"model_type {model_type!r} is not supported by NxDI {version}{why_not} (it serves: {', '.join(supported)}); "
        "serve it with another NxDI release, framework tnx, or framework torch"
    )


def sliding_window_error(model_type: str, cls: Any, raw: Mapping[str, Any], max_model_len: int) -> Optional[str]:
    """Why the Llama class cannot serve this Mistral checkpoint (None when it can): it attends over the whole
    sequence, so a sliding window shorter than max_model_len would change what the model computes."""
    window = raw.get("sliding_window")
    if model_type != "mistral" or "Mistral" in cls.__name__ or not window or window >= max_model_len:
        return None
    return (f"this NxDI serves Mistral with its Llama class, which has no sliding window, and the checkpoint's "
            f"sliding_window is {window} < max_model_len {max_model_len}: set max_model_len to {window} or less, "
            "or use NxDI 0.9 or later (its Mistral class)")


#: Each NxDI application class's own decoder class (`_model_cls`), as first seen. NxDI 0.3-0.6 replace the class
#: attribute with NeuronFusedSpecModel when a fused-speculation instance is built (model_base.py,
#: `self.__class__._model_cls = NeuronFusedSpecModel`; per instance from 0.7, fcb5a86), after which the draft's
#: worker class and any later plain instance of the class in the process would get the fused module.
_DECODER_CLASSES: dict[Any, Any] = {}


def decoder_class(cls: Any) -> Any:
    """The class's own decoder class, restored on the class before it is instantiated again (a no-op from 0.7)."""
    decoder = _DECODER_CLASSES.setdefault(cls, cls._model_cls)
    cls._model_cls = decoder
    return decoder


def is_eagle3_draft(draft_path: Path) -> bool:
    """EAGLE3 draft checkpoints name an Eagle3 architecture in their config.json (e.g. LlamaForCausalLMEagle3)."""
    try:
        raw = json.loads((draft_path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return any("eagle3" in str(a).lower() for a in raw.get("architectures") or ())


__all__ = ["FALLBACK_CLASSES", "NOT_TEXT_ONLY", "decoder_class", "is_eagle3_draft", "model_class",
           "sliding_window_error"]
