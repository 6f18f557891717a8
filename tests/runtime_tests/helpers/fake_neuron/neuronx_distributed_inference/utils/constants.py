"""utils/constants.py: MODEL_TYPES as the real file has it per release (it is in utils/constants.py at 0.3 too,
5de79de; inference_demo.py keeps a smaller copy). Keys: 0.3/0.4 llama mllama mixtral dbrx; 0.5 (f9e99f9) +llama4
qwen2 qwen3; 0.6 (e07f056) +qwen3_moe; 0.7 (fcb5a86) +gpt_oss; 0.8 (cd3abf3) +pixtral qwen2_vl qwen3_vl (and
"image-encoding" tasks); 0.9 (ef2731e) +gemma3 mistral. Only llama, qwen2 and mistral have math in the fake;
the others' load raises NotImplementedError. The image-to-text classes (llama4, pixtral, qwen2_vl, qwen3_vl) take an
ImageToTextInferenceConfig, which a text-only config cannot build (models/image_to_text_model_base.py)."""

from __future__ import annotations

from neuronx_distributed_inference._release import at_least
from neuronx_distributed_inference.models.config import InferenceConfig
from neuronx_distributed_inference.models.image_to_text_model_base import ImageToTextInferenceConfig
from neuronx_distributed_inference.models.llama.modeling_llama import LlamaInferenceConfig, NeuronLlamaForCausalLM
from neuronx_distributed_inference.models.model_base import NeuronBaseForCausalLM

CONTEXT_ENCODING_MODEL = "context_encoding_model"
TOKEN_GENERATION_MODEL = "token_generation_model"
SPECULATION_MODEL = "speculation_model"
FUSED_SPECULATION_MODEL = "fused_speculation_model"
MEDUSA_MODEL = "medusa_speculation_model"


def _unbacked(name: str, config_cls: type = LlamaInferenceConfig) -> type:
    """A model class of the real whose math the fake does not have: constructs, compiles; load raises."""
    return type(name, (NeuronBaseForCausalLM,), {"get_config_cls": classmethod(lambda cls: config_cls),
                                                 "__module__": __name__})


class MllamaInferenceConfig(InferenceConfig):
    """models/mllama/modeling_mllama.py: its required attributes are text_config.* and vision_config.* (hidden_size,
    image_size, ...), which a text-only checkpoint's config does not have."""

    def get_required_attributes(self):
        return ["text_config", "vision_config"]


def _image_to_text(name: str) -> type:
    """An image-to-text class (NeuronBaseForImageToText in the real): its config class is ImageToTextInferenceConfig."""
    return _unbacked(name, type(f"{name.removeprefix('Neuron').removesuffix('ForCausalLM')}InferenceConfig",
                                (ImageToTextInferenceConfig,),
                                {"__module__": __name__,
                                 "get_required_attributes": lambda self: ["text_config", "vision_config"]}))


def _model_types() -> dict:
    causal = {"llama": NeuronLlamaForCausalLM, "mllama": _unbacked("NeuronMllamaForCausalLM", MllamaInferenceConfig),
              "mixtral": _unbacked("NeuronMixtralForCausalLM"), "dbrx": _unbacked("NeuronDbrxForCausalLM")}
    if at_least((0, 5)):
        from neuronx_distributed_inference.models.qwen2.modeling_qwen2 import NeuronQwen2ForCausalLM

        causal.update(llama4=_image_to_text("NeuronLlama4ForCausalLM"), qwen2=NeuronQwen2ForCausalLM,
                      qwen3=_unbacked("NeuronQwen3ForCausalLM"))
    if at_least((0, 6)):
        causal["qwen3_moe"] = _unbacked("NeuronQwen3MoeForCausalLM")
    if at_least((0, 7)):
        causal["gpt_oss"] = _unbacked("NeuronGptOssForCausalLM")
    if at_least((0, 8)):
        causal.update(pixtral=_image_to_text("NeuronPixtralForCausalLM"),
                      qwen2_vl=_image_to_text("NeuronQwen2VLForCausalLM"),
                      qwen3_vl=_image_to_text("NeuronQwen3VLForCausalLM"))
    if at_least((0, 9)):
        from neuronx_distributed_inference.models.mistral.modeling_mistral import NeuronMistralForCausalLM

        causal.update(gemma3=_unbacked("NeuronGemma3ForCausalLM"), mistral=NeuronMistralForCausalLM)
    types = {key: {"causal-lm": cls} for key, cls in causal.items()}
    if at_least((0, 8)):
        for key, encoder in (("llama4", "NeuronLlama4ForImageEncoding"), ("pixtral", "NeuronPixtralForImageEncoding"),
                             ("qwen2_vl", "NeuronQwen2VLForImageEncoding"),
                             ("qwen3_vl", "NeuronQwen3VLForImageEncoding")):
            types[key]["image-encoding"] = _unbacked(encoder)
    return types


MODEL_TYPES = _model_types()
