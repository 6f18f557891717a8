"""Mirrors src/transformers_neuronx/version.py at 1ade6d7 (the 0.13.x line); the distribution version comes from the
dist-info that `install_tnx` writes."""

__version__ = "0.13.x"
