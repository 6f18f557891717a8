"""models/application_base.py: NeuronApplicationBase (construct, compile, load), after
src/neuronx_distributed_inference/models/application_base.py at 5de79de (0.3), 2c46add (0.4) and ef2731e (0.9).

compile writes neuron_config.json (before tracing, so even a failed trace leaves it), runs the checks the real
trace would fail on, then writes the model.pt marker (and, with save_sharded_checkpoint, the per-rank weight
files); model_base.COMPILES counts compiles that produced a model.pt. load reads model.pt (ValueError as
torch.jit.load when missing), then builds the math from the checkpoint at config._name_or_path, which compile wrote
into neuron_config.json (shard on load, the default since 0.3), and the draft's at
fused_spec_config.draft_model_path: whatever is at those paths at load time is what serves. A missing
_name_or_path is a Hub id up to 0.6 and falls back to the compiled folder from 0.7 (fcb5a86), which has no
weights (model_base.NeuronBaseForCausalLM._checkpoint_path).

Ranks (multi-node: examples/multi_node.md, inference_demo.py; load_weights in application_base.py, and
neuronx-distributed trace/model_builder.py at fbac349, which NxDI's get_builder drives):
* compile writes into model.pt the SPMD models of neuron_config.local_ranks_size ranks out of world_size
  (build_nxd_model: SPMDModel(neff, metaneff, local_ranks_size, world_size)) and, with save_sharded_checkpoint, the
  shards of ranks start_rank_id .. start_rank_id+local_ranks_size-1 only (shard_checkpoint);
* load(start_rank_id, local_ranks_size) defaults both to the NeuronConfig's. A local_ranks_size other than the
  compiled one cannot be initialized (RuntimeError), nor ranks outside the group or not aligned to local_ranks_size
  (ValueError); pre-sharded files are read for the load arguments' ranks, while sharding on load shards the
  NeuronConfig's ranks (the builder's) and initializes them at the load argument's start rank: the real serves
  another rank's weights silently when the two differ, which the fake refuses (RuntimeError).
* `loaded_ranks` (the fake's record) is the ranks this host's process holds."""

from __future__ import annotations

import json
import os
from typing import Type

import torch

from neuronx_distributed_inference._release import VERSION, at_least
from neuronx_distributed_inference.models.config import InferenceConfig, NeuronConfig

COMPILED_MODEL_FILE_NAME = "model.pt"


def normalize_path(path):
    return os.path.join(os.path.normpath(path), "")


def is_compiled(model_path):
    return os.path.isfile(model_path + COMPILED_MODEL_FILE_NAME)


class NeuronApplicationBase(torch.nn.Module):
    def __init__(self, model_path: str, config: InferenceConfig = None, neuron_config: NeuronConfig = None):
        super().__init__()
        model_path = normalize_path(model_path)
        if config is None:  # reload from a compiled folder: FileNotFoundError without its neuron_config.json
            config = self.get_config_cls().load(model_path)
        if neuron_config is not None:
            config.neuron_config = neuron_config
        self.validate_config(config)
        self.config = config
        self.neuron_config = config.neuron_config
        self.fused_spec_config = config.fused_spec_config
        self.on_device_sampling = self.neuron_config.on_device_sampling_config is not None
        self.model_path = model_path
        self.is_compiled = is_compiled(model_path)
        self.is_loaded_to_neuron = False
        self.loaded_ranks = None  # the fake's record: the ranks load() put on this host

    @classmethod
    def validate_config(cls, config: InferenceConfig):
        if not hasattr(config, "neuron_config"):
            raise ValueError("Config must include a NeuronConfig")
        spec = getattr(config, "fused_spec_config", None)
        if at_least((0, 4)) and spec is not None and (
                spec.draft_config.neuron_config.torch_dtype != config.neuron_config.torch_dtype
                and config.neuron_config.cast_type == "config"):
            raise ValueError("cast-type must be set to 'as-declared' to be able to run different precisions for "
                             "draft and target model!")

    @classmethod
    def get_config_cls(cls) -> InferenceConfig:
        raise NotImplementedError("get_config_cls is not implemented")

    @classmethod
    def get_neuron_config_cls(cls) -> Type[NeuronConfig]:
        return cls.get_config_cls().get_neuron_config_cls()

    def _compile(self, compiled_model_path, debug, pre_shard_weights_hook, dry_run):
        from neuronx_distributed_inference.models import model_base

        compiled_model_path = normalize_path(compiled_model_path)
        self.config.save(compiled_model_path)
        self._check_traceable()
        if dry_run:
            return
        nc = self.neuron_config
        with open(compiled_model_path + COMPILED_MODEL_FILE_NAME, "w") as f:
            json.dump({"fake_nxdi": f"{VERSION[0]}.{VERSION[1]}", "local_ranks_size": nc.local_ranks_size,
                       "world_size": nc.world_size}, f)
        if pre_shard_weights_hook:
            pre_shard_weights_hook(self)
        if nc.save_sharded_checkpoint and not getattr(nc, "skip_sharding", False):
            os.makedirs(compiled_model_path + "weights", exist_ok=True)
            for rank in range(nc.start_rank_id, nc.start_rank_id + nc.local_ranks_size):
                open(compiled_model_path + f"weights/tp{rank}_sharded_checkpoint.safetensors", "w").close()
        model_base.COMPILES += 1
        self.is_compiled = True

    if at_least((0, 9)):  # ef2731e added disable_fail_fast
        def compile(self, compiled_model_path, debug=False, pre_shard_weights_hook=None, dry_run=False,
                    disable_fail_fast=False):
            self._compile(compiled_model_path, debug, pre_shard_weights_hook, dry_run)
    else:
        def compile(self, compiled_model_path, debug=False, pre_shard_weights_hook=None, dry_run=False):
            self._compile(compiled_model_path, debug, pre_shard_weights_hook, dry_run)

    def load(self, compiled_model_path, start_rank_id=None, local_ranks_size=None, skip_warmup=False):
        compiled_model_path = normalize_path(compiled_model_path)
        model_file = compiled_model_path + COMPILED_MODEL_FILE_NAME
        if not os.path.isfile(model_file):  # torch.jit.load's error
            raise ValueError(f"The provided filename {model_file} does not exist")
        nc = self.neuron_config
        start = nc.start_rank_id if start_rank_id is None else start_rank_id
        size = nc.local_ranks_size if local_ranks_size is None else local_ranks_size
        with open(model_file) as f:
            compiled = json.load(f)
        if size != compiled["local_ranks_size"]:
            raise RuntimeError(f"the fake NxDI: {model_file} holds SPMD models of {compiled['local_ranks_size']} "
                               f"local ranks (of {compiled['world_size']}); they cannot be initialized with {size}")
        if start % size or not 0 <= start <= compiled["world_size"] - size:
            raise ValueError(f"the fake NxDI: start_rank_id {start} must be a multiple of local_ranks_size {size} "
                             f"within the {compiled['world_size']} ranks of the group")
        if nc.save_sharded_checkpoint:  # presharded weights of ranks start .. start+size-1
            for rank in range(start, start + size):
                path = os.path.join(compiled_model_path, f"weights/tp{rank}_sharded_checkpoint.safetensors")
                if not os.path.isfile(path):
                    raise FileNotFoundError(f"No such file or directory: {path!r}")
        elif (nc.start_rank_id, nc.local_ranks_size) != (start, size):
            raise RuntimeError(f"the fake NxDI: sharding on load shards ranks {nc.start_rank_id}.."
                               f"{nc.start_rank_id + nc.local_ranks_size - 1} (neuron_config's, the ModelBuilder's) "
                               f"but initializes ranks {start}..{start + size - 1}: the real serves other ranks' "
                               "weights without an error")
        self._build_math()
        self.loaded_ranks = list(range(start, start + size))
        self.is_loaded_to_neuron = True

    def _check_traceable(self):  # overridden by NeuronBaseForCausalLM
        pass

    def _build_math(self):
        raise NotImplementedError("the fake backs only Llama-family math")


__all__ = ["COMPILED_MODEL_FILE_NAME", "NeuronApplicationBase", "is_compiled", "normalize_path"]
