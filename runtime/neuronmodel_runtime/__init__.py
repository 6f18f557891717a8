"""neuronmodel's inference runtime: an OpenAI-compatible server around a Neuron (or reference) model runner."""

__version__ = "0.1.0"
