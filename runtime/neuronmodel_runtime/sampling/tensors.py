"""The batched sampling tensor: one `[B, 3]` float32 row per sequence, NxDI's layout `top_k, top_p, temperature`.

Every runner receives per-request sampling this way, so the reference runner and the Neuron runners read the
same numbers. `validate_sampling_tensor` applies the rules of NxDI's `validate_sampling_params` (in
`neuronx_distributed_inference.modules.generation.sampling`) in the same order, so a batch the reference runner
accepts is one NxDI accepts too.
"""

from __future__ import annotations

import torch

from neuronmodel_runtime.sampling.params import RowSampling

#: Column of each field in the sampling tensor.
TOP_K, TOP_P, TEMPERATURE = 0, 1, 2


def sampling_tensor(rows: list[RowSampling], global_top_k: int) -> torch.Tensor:
    """The `[B, 3]` float32 tensor of `rows`; a top_k of -1 (no per-request limit) becomes `global_top_k`.

    Args:
        rows: per-row sampling, in batch order.
        global_top_k: candidates kept per row before the per-row top-k (`sampling.global_top_k`).

    Returns:
        `[B, 3]` float32 on the CPU: top_k, top_p, temperature.
    """
    data = [[float(global_top_k if r.top_k == -1 else r.top_k), float(r.top_p), float(r.temperature)] for r in rows]
    return torch.tensor(data, dtype=torch.float32).reshape(len(rows), 3)


def validate_sampling_tensor(t: torch.Tensor, global_top_k: int) -> None:
    """Check a sampling tensor with NxDI's rules.

    Args:
        t: `[B, 3]` top_k, top_p, temperature (any float or integer dtype).
        global_top_k: the largest top_k allowed (NxDI's `max_topk`).

    Raises:
        ValueError: naming the first rule broken: shape, top-k range, top-k integrality, top-p range, temperature.
    """
    if t.dim() != 2 or t.shape[1] != 3:
        raise ValueError(f"sampling tensor must have shape [batch, 3] (top_k, top_p, temperature), got {list(t.shape)}")
    t = t.to(torch.float32)
    top_k, top_p, temperature = t[:, TOP_K], t[:, TOP_P], t[:, TEMPERATURE]
    if not bool(torch.all((top_k == -1) | ((top_k > 0) & (top_k <= global_top_k)))):
        raise ValueError(f"top-k must be -1 or in (0, {global_top_k}] (the global top-k), got {top_k.tolist()}")
    if not torch.equal(top_k, top_k.floor()):
        raise ValueError(f"top-k must be an integer, got {top_k.tolist()}")
    if not bool(torch.all((top_p > 0.0) & (top_p <= 1.0))):
        raise ValueError(f"top-p must be in (0.0, 1.0], got {top_p.tolist()}")
    if not bool(torch.all(temperature > 0.0)):
        raise ValueError(f"temperature must be > 0.0 (greedy is top_k=1), got {temperature.tolist()}")


__all__ = ["TOP_K", "TOP_P", "TEMPERATURE", "sampling_tensor", "validate_sampling_tensor"]
