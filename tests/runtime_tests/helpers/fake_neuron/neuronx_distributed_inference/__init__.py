"""Fake `neuronx_distributed_inference` (see tests/runtime_tests/helpers/fake_neuron). Install it with `install_nxdi`."""

from neuronx_distributed_inference._release import VERSION as _VERSION

# The real _version.py holds "<major>.<minor>.0" (e.g. "0.3.0" in the 0.3.5591 wheel); the build number is only
# in the distribution metadata.
__version__ = f"{_VERSION[0]}.{_VERSION[1]}.0"
