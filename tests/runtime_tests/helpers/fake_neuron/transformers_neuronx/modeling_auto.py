"""Mirrors src/transformers_neuronx/modeling_auto.py (0.13.x, 1ade6d7): the HF model_type -> TNx class registry."""

from transformers_neuronx import _unbacked
from transformers_neuronx.llama.model import LlamaForSampling
from transformers_neuronx.mistral.model import MistralForSampling

NEURON_MODEL_FOR_CAUSAL_LM_MAPPING = {
    "bloom": _unbacked.BloomForSampling,
    "code_llama": LlamaForSampling,
    "gpt2": _unbacked.GPT2ForSamplingWithContextBroadcasting,
    "gpt_neox": _unbacked.GPTNeoXForSampling,
    "gptj": _unbacked.GPTJForSampling,
    "llama": LlamaForSampling,
    "mistral": MistralForSampling,
    "mixtral": _unbacked.MixtralForSampling,
    "opt": _unbacked.OPTForSampling,
}


class NeuronAutoModelForCausalLM:

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        from transformers_neuronx import _backing

        model_type = getattr(_backing.read_hf_config(pretrained_model_name_or_path), "model_type", None)
        if model_type not in NEURON_MODEL_FOR_CAUSAL_LM_MAPPING:
            raise AssertionError(f"The configuration model type '{model_type}' is not supported by Neuron")
        return NEURON_MODEL_FOR_CAUSAL_LM_MAPPING[model_type].from_pretrained(pretrained_model_name_or_path,
                                                                              *model_args, **kwargs)
