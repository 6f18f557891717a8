"""One rank's shard of a Llama model for tensor parallelism (Megatron's split), a pure function of the weights.

Attention is split by heads: rank r holds query heads r*H/n .. (r+1)*H/n-1 and key/value heads likewise (the fused
qkv rows of those heads, column-parallel), and the matching columns of the output projection (row-parallel); the
MLP is split by its intermediate width: the gate and up rows of rank r's slice, the same columns of down. Each rank
then computes a partial sum of every attention and MLP output, which one all-reduce per block completes
(llama.LlamaModel's `reduce`). Embeddings, norms and the LM head are replicated, so every rank ends a forward with
the full logits: the sampler needs no gather. A bias of a row-parallel projection (o) stays on rank 0 only, so the
all-reduce adds it once. Each rank's KV cache holds only its own heads: the cache, the largest allocation of a
serving model, is split n ways too.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from neuronmodel_runtime.runners.base import RunnerError
from neuronmodel_runtime.runners.llama import LayerWeights, LlamaConfig, LlamaWeights


@dataclasses.dataclass(frozen=True)
class TensorParallel:
    """This process's rank in its tensor-parallel group, and the group's all-reduce (distributed.channel's)."""

    rank: int
    world: int
    reduce: Callable[[torch.Tensor], torch.Tensor]


def check_divisible(config: LlamaConfig, world: int) -> None:
    """Raises RunnerError naming parallelism.tensor_parallel_degree unless every split is even."""
    for name, value in (("num_attention_heads", config.num_heads), ("num_key_value_heads", config.num_kv_heads),
                        ("intermediate_size", config.intermediate_size)):
        if value % world:
            raise RunnerError(f"parallelism.tensor_parallel_degree {world} does not divide the model's {name} "
                              f"({value}): the torch reference runner splits attention heads and the MLP evenly; "
                              f"choose a degree that divides {config.num_heads} heads, {config.num_kv_heads} KV heads "
                              f"and {config.intermediate_size}")


def _rows(t: torch.Tensor, start: int, size: int) -> torch.Tensor:
    return t[start:start + size]


#: Names how `shard` splits a model: part of the key of pre-sharded weights in the compile-artifact cache, so that
#: a change of the split never loads a shard cut the old way. Change it with `shard`.
LAYOUT = "megatron-heads-mlp/o-bias-rank0/v1"


def shard_config(config: LlamaConfig, world: int) -> LlamaConfig:
    """A rank's config: heads and intermediate width divided by `world`."""
    check_divisible(config, world)
    return dataclasses.replace(config, num_heads=config.num_heads // world, num_kv_heads=config.num_kv_heads // world,
                               intermediate_size=config.intermediate_size // world)


def shard(config: LlamaConfig, weights: LlamaWeights, rank: int, world: int) -> tuple[LlamaConfig, LlamaWeights]:
    """Rank `rank` of `world`: its config (`shard_config`) and weights (contiguous copies, so the full tensors can be
    freed)."""
    part = shard_config(config, world)
    hd = config.head_dim
    heads, kv, inter = part.num_heads, part.num_kv_heads, part.intermediate_size
    q_rows, kv_rows = config.num_heads * hd, config.num_kv_heads * hd

    def qkv_part(t: torch.Tensor) -> torch.Tensor:  # rows [q | k | v] -> this rank's heads of each
        return torch.cat([_rows(t, rank * heads * hd, heads * hd),
                          _rows(t, q_rows + rank * kv * hd, kv * hd),
                          _rows(t, q_rows + kv_rows + rank * kv * hd, kv * hd)]).contiguous()

    layers = [
        LayerWeights(
            input_norm=layer.input_norm,
            qkv=qkv_part(layer.qkv),
            qkv_bias=None if layer.qkv_bias is None else qkv_part(layer.qkv_bias),
            o=layer.o[:, rank * heads * hd:(rank + 1) * heads * hd].contiguous(),
            o_bias=layer.o_bias if rank == 0 else None,
            post_norm=layer.post_norm,
            gate_up=torch.cat([_rows(layer.gate_up, rank * inter, inter),
                               _rows(layer.gate_up, config.intermediate_size + rank * inter, inter)]).contiguous(),
            down=layer.down[:, rank * inter:(rank + 1) * inter].contiguous(),
        )
        for layer in weights.layers
    ]
    return part, LlamaWeights(embed=weights.embed, layers=layers, norm=weights.norm, lm_head=weights.lm_head)


__all__ = ["LAYOUT", "TensorParallel", "check_divisible", "shard", "shard_config"]
