"""Per-request sampling: validated parameters, the batched `[B, 3]` tensor, and the on-device sampler."""
