"""Linear layers on pre-packed weights (CPU): the compiled graphs' matmuls in float32 on oneDNN.

Each weight is packed once at load (`pack_weights`) and looked up by the `packed_linear` op the graphs call: in
float32 at decode batch sizes that is twice the matmul speed of the default kernels on this project's CPU machines.
"""

from __future__ import annotations

import weakref
from typing import Any, Optional

import torch
import torch.nn.functional as F

from neuronmodel_runtime.runners.llama import LlamaWeights

#: Weight (data_ptr, shape, stride, dtype) -> the same weight reordered for oneDNN, made by `pack_weights`.
_PACKED: dict[tuple[Any, ...], torch.Tensor] = {}


def _weight_key(weight: torch.Tensor) -> tuple[Any, ...]:
    return (weight.data_ptr(), tuple(weight.shape), tuple(weight.stride()), weight.dtype)


@torch.library.custom_op("neuronmodel::linear", mutates_args=())
def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`F.linear` on the oneDNN-packed copy of `weight` (`pack_weights`), or plain F.linear where it has none.

    An opaque op to inductor, so the graph calls it with the dense weight and the packed copy is looked up here.
    Why: in float32 at decode batch sizes, oneDNN on a packed weight reads it about twice as fast as the default
    matmul (MKL) does on this project's CPU machines, and inductor packs weights only when it freezes them into the
    graph as constants, which its FX-graph cache (our compiled artifact) does not hold.
    """
    packed = _PACKED.get(_weight_key(weight))
    if packed is None:
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@packed_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN packing serves float32 on the CPU (the CPU quickstart's dtype); elsewhere the graphs use F.linear."""
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()


def pack_weights(weights: LlamaWeights, batch_hint: int) -> int:
    """Pack every matrix of `weights` for `packed_linear` (a second copy of each); returns the bytes packed. Each
    entry goes when its dense weight is freed."""
    matrices = [weights.lm_head] + [m for layer in weights.layers for m in (layer.qkv, layer.o, layer.gate_up,
                                                                             layer.down)]
    packed = 0
    for matrix in matrices:
        key = _weight_key(matrix)
        if key not in _PACKED:
            _PACKED[key] = torch.ops.mkldnn._reorder_linear_weight(matrix, batch_hint)
            weakref.finalize(matrix, _PACKED.pop, key, None)
            packed += matrix.numel() * matrix.element_size()
    return packed


__all__ = ["can_pack", "pack_weights", "packed_linear"]
