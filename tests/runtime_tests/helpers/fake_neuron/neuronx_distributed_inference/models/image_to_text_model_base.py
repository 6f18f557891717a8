"""models/image_to_text_model_base.py (from 0.5, f9e99f9; cd3abf3 the same): ImageToTextInferenceConfig, the config
of the image-to-text models (Llama 4, Pixtral, Qwen2-VL, Qwen3-VL). It takes a text and a vision NeuronConfig and
asserts the loaded Hugging Face config has text_config and vision_config, so a text-only config cannot build one:
`get_config_cls()(neuron_config, load_config=...)` lacks vision_neuron_config (TypeError)."""

from __future__ import annotations

import copy
from typing import Dict, Optional

from neuronx_distributed_inference.models.config import InferenceConfig


class ImageToTextInferenceConfig(InferenceConfig):
    def __init__(self, text_neuron_config, vision_neuron_config, fused_spec_config=None, load_config=None,
                 metadata: Optional[Dict] = None, **kwargs):
        super().__init__(neuron_config=copy.deepcopy(text_neuron_config), fused_spec_config=fused_spec_config,
                         load_config=load_config, metadata=metadata, **kwargs)
        assert hasattr(self, "text_config"), "Passed config doesn't contain text_config"
        assert hasattr(self, "vision_config"), "Passed config doesn't contain vision_config"

    def get_required_attributes(self):
        raise NotImplementedError("get_required_attributes is not implemented")


__all__ = ["ImageToTextInferenceConfig"]
