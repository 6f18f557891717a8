"""Assembling a RuntimeConfig at the edge: the JSON file, then NEURONMODEL_* variables, then CLI flags.

Every leaf field has a variable and a flag, from one table (`SETTINGS`) generated from the fields themselves, whose
`description`s are also the flags' help. Errors are one line naming each field with its flag and variable.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any, Mapping, Optional

from pydantic import ValidationError

from neuronmodel_runtime.config import env as env_names
from neuronmodel_runtime.config.model import ConfigError, RuntimeConfig
from neuronmodel_runtime.config.settings import named, settings_table

#: Every RuntimeConfig field, with its env variable and flag (README's configuration table lists exactly these).
SETTINGS = settings_table(RuntimeConfig)

#: vLLM's framework variable, honoured for users coming from vLLM on Neuron.
VLLM_FRAMEWORK_VALUES = {"neuronx-distributed-inference": "nxdi", "transformers-neuronx": "tnx"}


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        data = data.setdefault(key, {})
        if not isinstance(data, dict):
            raise ConfigError(f"{key}: must be a JSON object (it holds {dotted})")
    data[leaf] = value


def env_overrides(env: Mapping[str, str]) -> dict[str, str]:
    """Dotted field -> raw string value from NEURONMODEL_* (and VLLM_NEURON_FRAMEWORK)."""
    out: dict[str, str] = {}
    vllm = env.get(env_names.VLLM_FRAMEWORK)
    if vllm:
        if vllm not in VLLM_FRAMEWORK_VALUES:
            raise ConfigError(
                f"{env_names.VLLM_FRAMEWORK}={vllm!r} is not a framework; use one of {sorted(VLLM_FRAMEWORK_VALUES)}"
            )
        out["framework"] = VLLM_FRAMEWORK_VALUES[vllm]
    for setting in SETTINGS.values():
        value = env.get(setting.env)
        if value:
            out[setting.path] = value
    return out


def load_config(
    path: Optional[str | os.PathLike] = None,
    overrides: Optional[Mapping[str, Any]] = None,
    env: Mapping[str, str] = os.environ,
) -> RuntimeConfig:
    """Build the RuntimeConfig: the JSON file, then NEURONMODEL_* variables, then explicit overrides (CLI flags).

    Raises:
        ConfigError: unreadable file, unknown key or invalid value; the message names the field.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = json.loads(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read --config {path}: {exc.strerror}") from exc
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--config {path} is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"--config {path} must hold a JSON object")
    for dotted, value in {**env_overrides(env), **dict(overrides or {})}.items():
        if value is not None:
            _set_dotted(data, dotted, value)
    try:
        return RuntimeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc)) from None


def _unknown_key_hint(loc: tuple) -> str:
    """" (did you mean server.port?)" for a misspelt key, else ""."""
    fields = RuntimeConfig.model_fields
    for key in loc[:-1]:
        fields = getattr(fields[key].annotation, "model_fields", {}) if key in fields else {}
    close = difflib.get_close_matches(str(loc[-1]), list(fields), n=1)
    return f" (did you mean {'.'.join([*map(str, loc[:-1]), close[0]])}?)" if close else ""


def describe_validation_error(exc: ValidationError) -> str:
    """Every problem on one line, `field.path (--flag, NEURONMODEL_VAR): message` (input values are not echoed,
    they may be secrets)."""
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "config"
        if err["type"] == "extra_forbidden":
            msg = "unknown key" + _unknown_key_hint(err["loc"])
        else:
            msg = err["msg"].removeprefix("Value error, ")
        problems.append(f"{named(loc) if loc in SETTINGS else loc}: {msg}")
    return "invalid runtime config: " + "; ".join(problems)
