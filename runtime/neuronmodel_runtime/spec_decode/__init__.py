"""Speculative decoding pieces the engine composes: proposers (prompt lookup, a draft model), exact verification
(rejection sampling) and NxDI's fused output shape. The runner only scores (or, on Neuron, fuses all of it)."""
