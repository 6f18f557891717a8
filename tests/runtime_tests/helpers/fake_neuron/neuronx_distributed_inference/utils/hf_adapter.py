"""utils/hf_adapter.py: load_pretrained_config, after 5de79de (0.3) and fcb5a86/ef2731e (0.7+: reads "dtype" or
"torch_dtype"). The real images pin transformers 4.51 (up to 0.6) or 4.56/4.57 (0.7+); this machine has
transformers 5, whose to_dict() names the dtype "dtype" and keeps rope_theta only inside rope_parameters, so the
fake first gives the dict the shape the pinned transformers gives (torch_dtype before 0.7; rope_theta at the top)."""

from __future__ import annotations

from types import SimpleNamespace

from neuronx_distributed_inference._release import at_least
from neuronx_distributed_inference.models.config import to_torch_dtype


def load_pretrained_config(model_path_or_name=None, hf_config=None):
    """A load_config hook for InferenceConfig: AutoConfig.from_pretrained(path).to_dict() into the config's
    attributes (so `_name_or_path` is kept: load shards the weights from it), the checkpoint's dtype into
    neuron_config.torch_dtype unless NeuronConfig was given one, nested configs as SimpleNamespace."""

    def load_config(self):
        from transformers import AutoConfig, PretrainedConfig

        if (model_path_or_name is None) == (hf_config is None):
            raise ValueError('Please provide only one of "model_path_or_name" or "hf_config"')
        config = AutoConfig.from_pretrained(model_path_or_name) if model_path_or_name is not None else hf_config
        config_dict = config.to_dict()
        if "rope_theta" not in config_dict and isinstance(config_dict.get("rope_parameters"), dict):
            config_dict["rope_theta"] = config_dict["rope_parameters"].get("rope_theta")
        if not at_least((0, 7)) and "dtype" in config_dict:
            config_dict["torch_dtype"] = config_dict.pop("dtype")
        if at_least((0, 7)):
            config_dict["transformers_version"] = getattr(config, "transformers_version", None)
            hf_dtype = config_dict.get("dtype", config_dict.get("torch_dtype", None))
        else:
            hf_dtype = config_dict.get("torch_dtype", None)
        if hf_dtype is not None:
            if self.neuron_config is not None and not self.neuron_config.overrides_torch_dtype:
                self.neuron_config.torch_dtype = hf_dtype
                if isinstance(self.neuron_config.torch_dtype, str):
                    self.neuron_config.torch_dtype = to_torch_dtype(self.neuron_config.torch_dtype)
            config_dict.pop("dtype", None)
            config_dict.pop("torch_dtype", None)
        for key, value in config_dict.items():
            if isinstance(getattr(config, key, None), PretrainedConfig):
                config_dict[key] = SimpleNamespace(**value)
        self.__dict__.update(config_dict)
        if hasattr(config, "attribute_map"):
            self.attribute_map = config.attribute_map

    return load_config


__all__ = ["load_pretrained_config"]
