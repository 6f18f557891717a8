"""Model runners behind one contract (base.py): the PyTorch reference runner and the Neuron adapters."""
