"""models/application_base.py: NeuronApplicationBase (construct, compile, load), after
src/neuronx_distributed_inference/models/application_base.py at 5de79de (0.3), 2c46add (0.4) and ef2731e (0.9).

compile writes neuron_config.json (before tracing, so even a failed trace leaves it), runs the checks the real
trace would fail on, then writes the model.pt marker (and, with save_sharded_checkpoint, the per-rank weight
files); model_base.COMPILES counts compiles that produced a model.pt. load reads model.pt (ValueError as
torch.jit.load when missing), then builds the math from the checkpoint at config._name_or_path, which compile wrote
into neuron_config.json (shard on load, the default since 0.3), and the draft's at
fused_spec_config.draft_model_path: whatever is at those paths at load time is what serves. A missing
_name_or_path is a Hub id up to 0.6 and falls back to the compiled folder from 0.7 (fcb5a86), which has no
weights (model_base.NeuronBaseForCausalLM._checkpoint_path)."""

from __future__ import annotations

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
        with open(compiled_model_path + COMPILED_MODEL_FILE_NAME, "w") as f:
            f.write(f"fake NxDI {VERSION[0]}.{VERSION[1]} compiled-graph marker\n")
        if pre_shard_weights_hook:
            pre_shard_weights_hook(self)
        if self.neuron_config.save_sharded_checkpoint and not getattr(self.neuron_config, "skip_sharding", False):
            os.makedirs(compiled_model_path + "weights", exist_ok=True)
            for rank in range(self.neuron_config.world_size):
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
        start = self.neuron_config.start_rank_id if start_rank_id is None else start_rank_id
        size = self.neuron_config.local_ranks_size if local_ranks_size is None else local_ranks_size
        if self.neuron_config.save_sharded_checkpoint:  # presharded weights of ranks start .. start+size-1
            for rank in range(start, start + size):
                path = os.path.join(compiled_model_path, f"weights/tp{rank}_sharded_checkpoint.safetensors")
                if not os.path.isfile(path):
                    raise FileNotFoundError(f"No such file or directory: {path!r}")
        self._build_math()
        self.is_loaded_to_neuron = True

    def _check_traceable(self):  # overridden by NeuronBaseForCausalLM
        pass

    def _build_math(self):
        raise NotImplementedError("the fake backs only Llama-family math")


__all__ = ["COMPILED_MODEL_FILE_NAME", "NeuronApplicationBase", "is_compiled", "normalize_path"]
