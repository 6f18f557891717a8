"""The operator<->runtime contract: what the operator writes and the runtime reads, defined once.

- `model.py`: RuntimeConfig, the one JSON document the operator writes into a ConfigMap and
  `neuronmodel-runtime serve --config FILE` reads, and its sections;
- `settings.py`, `load.py`: each field's NEURONMODEL_* variable and flag, and assembling the config at the edge;
- `limits.py`: a model's own length limit (its config.json);
- `env.py`: the environment variables the operator sets on the pods and the runtime reads;
- `sources.py`: the model-source grammar (hf://, s3://, pvc://, paths), also the CRD's CEL pattern;
- `rules.py`: the rules across fields that the CRD's CEL checks too;
- `buckets.py`: the bucket rule (NxDI's, TNx's) the runners compile with and the operator hands to vLLM Neuron.

Nothing here imports torch, the server, the engine or the runners (the operator imports this package).
"""

from neuronmodel_runtime.config import env, rules, sources
from neuronmodel_runtime.config.env import ENV_PREFIX
from neuronmodel_runtime.config.limits import (MODEL_LENGTH_KEYS, model_length_limit, read_model_config,
                                               resolve_model_limits)
from neuronmodel_runtime.config.load import (SETTINGS, VLLM_FRAMEWORK_VALUES, describe_validation_error,
                                             env_overrides, load_config)
from neuronmodel_runtime.config.model import (DEFAULT_MODEL_NAME, CachePolicy, CompileCacheConfig, ConfigError, Dtype,
                                              Framework, ParallelismConfig, RuntimeConfig, SamplingConfig,
                                              ServerConfig, SpeculationConfig, cache_root, default_model_path)
from neuronmodel_runtime.config.settings import QUALIFIED_NAMES, Setting, named, settings_table

__all__ = [
    "env", "rules", "sources",
    "RuntimeConfig", "SamplingConfig", "SpeculationConfig", "ParallelismConfig", "CompileCacheConfig",
    "ServerConfig", "Framework", "Dtype", "CachePolicy", "ConfigError", "DEFAULT_MODEL_NAME", "cache_root",
    "default_model_path", "load_config", "env_overrides", "describe_validation_error", "SETTINGS",
    "VLLM_FRAMEWORK_VALUES", "ENV_PREFIX", "QUALIFIED_NAMES", "Setting", "named", "settings_table",
    "MODEL_LENGTH_KEYS", "read_model_config", "model_length_limit", "resolve_model_limits",
]
