"""Contract fake of transformers-neuronx 0.13.x (src/transformers_neuronx at 1ade6d7, the last public sync of the line
SDK 2.22-2.25 shipped). Same module paths and public names as the real package for what the neuronmodel TNx runner
uses; the rules the real code enforces are enforced here (each module names its source file); the numbers come from
our reference Llama implementation on the CPU (`_backing.py`), so the tokens are real. Installed per test by
`install_tnx` (fake_neuron/install.py)."""

from transformers_neuronx.version import __version__  # noqa: F401
from transformers_neuronx.constants import GQA, Layout  # noqa: F401
from transformers_neuronx.config import (  # noqa: F401
    ContinuousBatchingConfig, GenerationConfig, NeuronConfig, QuantizationConfig)
from transformers_neuronx.llama.model import LlamaForSampling  # noqa: F401
from transformers_neuronx.mistral.model import MistralForSampling  # noqa: F401
from transformers_neuronx.modeling_auto import NeuronAutoModelForCausalLM  # noqa: F401

__all__ = ["ContinuousBatchingConfig", "GQA", "GenerationConfig", "Layout", "LlamaForSampling", "MistralForSampling",
           "NeuronAutoModelForCausalLM", "NeuronConfig", "QuantizationConfig", "__version__"]
