"""Where the torch reference runner's weights come from: the whole checkpoint, or one tensor-parallel rank's shard.

A rank's shard is cut from the checkpoint; with compile_cache.sharded_weights it goes through the compile-artifact
cache under a key of its own (the TP degree, the rank and the split's layout are in it): the first start of a rank
(or the compile Job) cuts and stores it, every later one reads only its shard, never the whole checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Callable, Optional

import torch

from neuronmodel_runtime.artifacts.prepare import Artifacts, ArtifactsError, prepare_artifacts
from neuronmodel_runtime.config import RuntimeConfig
from neuronmodel_runtime.runners.base import RunnerError
from neuronmodel_runtime.runners.checkpoint import build_weights, read_tensors
from neuronmodel_runtime.runners.graph_artifacts import load_weights, save_weights
from neuronmodel_runtime.runners.llama import LlamaConfig, LlamaWeights
from neuronmodel_runtime.runners.tensor_parallel import LAYOUT as TP_LAYOUT
from neuronmodel_runtime.runners.tensor_parallel import TensorParallel, shard, shard_config

#: The weights converted to the serving dtype, in the compiled artifacts (`compile: true`) and in a rank's shard.
WEIGHTS_FILE = "weights.safetensors"
#: The pre-sharded weights of one TP rank (compile_cache.sharded_weights): their artifacts' format.
SHARD_FORMAT = "torch-tp-shard/1"


def checkpoint_weights(model_path: Path, model_config: LlamaConfig, device: torch.device,
                       dtype: torch.dtype) -> LlamaWeights:
    """The whole model's weights, read from the checkpoint and converted to `dtype`."""
    return build_weights(model_config, read_tensors(model_path), device, dtype)


def rank_shard(config: RuntimeConfig, model_path: Path, device: torch.device, model_config: LlamaConfig,
               dtype: torch.dtype, group: TensorParallel) -> tuple[LlamaConfig, LlamaWeights, Optional[Artifacts]]:
    """This rank's shard (its config and weights), cut from the checkpoint; with compile_cache.sharded_weights
    through the compile-artifact cache (`stored_shard`), whose artifacts come third (None without)."""
    part = shard_config(model_config, group.world)
    full = functools.partial(checkpoint_weights, model_path, model_config, device, dtype)
    if not config.compile_cache.sharded_weights:
        return part, shard(model_config, full(), group.rank, group.world)[1], None
    artifacts = stored_shard(config, model_path, device, model_config, dtype, group.rank, group.world, full)
    try:
        return part, load_weights(artifacts.folder / WEIGHTS_FILE, part, device, dtype), artifacts
    except (OSError, ValueError) as exc:
        raise RunnerError(f"compile_cache.sharded_weights: rank {group.rank}'s shard: {exc}") from exc


def stored_shard(config: RuntimeConfig, model_path: Path, device: torch.device, model_config: LlamaConfig,
                 dtype: torch.dtype, rank: int, world: int, full: Callable[[], LlamaWeights]) -> Artifacts:
    """Rank `rank`'s shard in the compile-artifact cache (the TP degree, the rank and the split's layout are in
    its key), cut from `full()` and stored where it is missing."""
    shape = {"format": SHARD_FORMAT, "device": device.type, "dtype": str(dtype).removeprefix("torch."),
             "architecture": dataclasses.asdict(model_config),
             "tensor_parallel": {"degree": world, "rank": rank, "layout": TP_LAYOUT}}
    try:
        return prepare_artifacts(
            config, model_path, "torch", torch.__version__, shape,
            lambda folder: save_weights(folder / WEIGHTS_FILE, shard(model_config, full(), rank, world)[1]))
    except ArtifactsError as exc:
        raise RunnerError(f"compile_cache.sharded_weights: rank {rank}'s shard: {exc}") from exc


__all__ = ["SHARD_FORMAT", "WEIGHTS_FILE", "checkpoint_weights", "rank_shard", "stored_shard"]
