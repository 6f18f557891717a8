"""A model's own sequence-length limit (its config.json), and fitting RuntimeConfig's lengths to it as vLLM does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Optional

from neuronmodel_runtime.config.model import ConfigError, RuntimeConfig
from neuronmodel_runtime.config.settings import named

#: config.json keys that bound a model's sequence length, as vLLM's `_get_and_verify_max_len` reads them.
MODEL_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


def read_model_config(model_dir: Path, setting: str = "model") -> dict[str, Any]:
    """A model folder's config.json as a dict.

    Raises:
        ConfigError: unreadable, not UTF-8 JSON, or not a JSON object; the message names `setting` (the config
            field that points at the folder: `model`, `speculation.draft_model`) and the file.
    """
    path = model_dir / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{setting}: cannot read {path}: {exc.strerror}") from exc
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for a file that is not UTF-8
        raise ConfigError(f"{setting}: {path} is not valid JSON ({exc}); re-download or re-convert the model"
                          ) from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{setting}: {path} must hold a JSON object")
    return data


def model_length_limit(model_config: Mapping[str, Any]) -> Optional[tuple[str, int]]:
    """(key, value) of the smallest MODEL_LENGTH_KEYS entry in a model's config.json; None when it has none.

    Unlike vLLM, RoPE scaling does not stretch the limit: the runners bound positions by max_position_embeddings.
    """
    found = [
        (value, key)
        for key in MODEL_LENGTH_KEYS
        if isinstance(value := model_config.get(key), int) and not isinstance(value, bool) and value > 0
    ]
    if not found:
        return None
    value, key = min(found)
    return key, value


def resolve_model_limits(config: RuntimeConfig, model_config: Mapping[str, Any]) -> RuntimeConfig:
    """Fit the sequence lengths to the model (its config.json), as vLLM does; idempotent.

    max_model_len left unset (file, env, flag) becomes min(its default, the model's limit), and an unset
    max_context_length follows it (min(its default, max_model_len)). An explicit max_model_len above the model's
    limit, or an explicit max_context_length above the resulting max_model_len, is a ConfigError naming the fix.
    """
    limit = model_length_limit(model_config)
    if limit is None:
        return config
    key, value = limit
    if "max_model_len" in config.model_fields_set:
        if config.max_model_len > value:
            raise ConfigError(
                f"max_model_len {config.max_model_len} exceeds the model's limit ({key} {value} in its config.json): "
                f"set {named('max_model_len')} to {value} or less, or leave it unset"
            )
        return config
    if config.max_model_len <= value:
        return config
    if "max_context_length" in config.model_fields_set and config.max_context_length > value:
        raise ConfigError(
            f"max_context_length {config.max_context_length} exceeds the model's limit ({key} {value} in its "
            f"config.json): set {named('max_context_length')} to {value} or less"
        )
    resolved = config.model_copy()
    resolved.max_model_len = value  # validated; an unset max_context_length follows
    return resolved
