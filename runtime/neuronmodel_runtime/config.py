"""RuntimeConfig: the one JSON document that configures a runtime process.

The operator writes it into a ConfigMap; `neuronmodel-runtime serve --config FILE` reads it. CLI flags and
`NEURONMODEL_*` environment variables override single fields: every leaf field has both, from one table
(`SETTINGS`) generated from the fields themselves, whose `description`s are also the flags' help. It is parsed
once, at the edge, and every component receives the typed object (or the slice it needs). This module never
imports torch.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

#: The embedded default model, converted by scripts/fetch_default_model.py.
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"

Framework = Literal["auto", "nxdi", "tnx", "torch"]


class _Strict(BaseModel):
    """Unknown keys are an error naming the key; values are validated on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SamplingConfig(_Strict):
    on_device: bool = Field(
        True, description="Sample on the device inside the runner; the host receives token ids only (no logprobs)."
    )
    global_top_k: int = Field(
        256,
        ge=1,
        le=65536,
        description="Candidates kept per row before the per-request top-k/top-p (NxDI's global_topk); "
        "a request's top_k may not exceed it.",
    )


class SpeculationConfig(_Strict):
    mode: Literal["none", "draft", "promptLookup", "eagle"] = Field(
        "none",
        description="none | draft (a smaller draft model) | promptLookup (n-grams of the request itself) "
        "| eagle (Neuron runners only).",
    )
    draft_model: Optional[str] = Field(
        None, description="Draft model folder (Hugging Face, same tokenizer as the target); required by draft and eagle."
    )
    num_speculative_tokens: int = Field(
        4, ge=1, le=16, description="k: tokens proposed per step; a step returns 1..k+1 tokens per sequence."
    )
    prompt_lookup_min: int = Field(2, ge=1, description="Smallest n-gram that prompt lookup matches.")
    prompt_lookup_max: int = Field(4, ge=1, description="Largest n-gram that prompt lookup matches (tried first).")

    @model_validator(mode="after")
    def _check(self) -> "SpeculationConfig":
        if self.mode in ("draft", "eagle") and not self.draft_model:
            raise ValueError(
                f"speculation.draft_model is required when speculation.mode is {self.mode!r}: "
                f"set {named('speculation.draft_model')} or choose another speculation.mode"
            )
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"speculation.prompt_lookup_min must be <= speculation.prompt_lookup_max "
                f"({self.prompt_lookup_min} > {self.prompt_lookup_max}): lower the first or raise the second"
            )
        return self


class ParallelismConfig(_Strict):
    tensor_parallel_degree: int = Field(
        1, ge=1, description="NeuronCores (or reference-runner processes) the model is sharded over."
    )
    nodes: int = Field(
        1, ge=1, description="Nodes in one serving group (multi-node tensor parallelism through LeaderWorkerSet)."
    )


class CompileCacheConfig(_Strict):
    url: Optional[str] = Field(
        None,
        description="Where compiled artifacts live: a filesystem path (PVC) or s3://bucket/prefix; "
        "null disables the cache.",
    )
    policy: Literal["IfNotCached", "Always", "Never"] = Field(
        "IfNotCached",
        description="IfNotCached: compile on a miss; Always: recompile and overwrite; Never: a miss is an error.",
    )
    sharded_weights: bool = Field(
        False,
        description="Store the weights pre-sharded per TP rank with the compiled artifacts (NxDI's "
        "save_sharded_checkpoint): a load then reads its rank's shard instead of sharding the checkpoint; the entry "
        "grows by the model's size. framework nxdi (the reference runner always stores its converted weights).",
    )


class ServerConfig(_Strict):
    host: str = Field("127.0.0.1", description="Address to bind; 0.0.0.0 inside a pod.")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port.")
    api_key: Optional[SecretStr] = Field(None, description="Bearer token required on /v1/* (never logged).")
    max_queue: int = Field(
        256, ge=0, description="Requests allowed to wait for a slot; beyond it the server answers 429 with Retry-After."
    )
    request_timeout_s: float = Field(
        600.0, gt=0, description='A request still unfinished after this many seconds is aborted (finish_reason "abort").'
    )
    drain_timeout_s: float = Field(
        30.0, ge=0, description="Seconds SIGTERM waits for in-flight requests before exiting anyway."
    )
    liveness_timeout_s: float = Field(
        120.0,
        gt=0,
        description="/health fails when there is work and the engine step loop has made no progress for this many "
        "seconds (a hung runner call, a known failure mode of Neuron runtimes); the kubelet then restarts the pod.",
    )
    served_model_name: Optional[str] = Field(
        None, description="Name served in /v1/models and required in requests; null = the model folder's name."
    )


class RuntimeConfig(_Strict):
    model: Optional[str] = Field(
        None,
        description="Hugging Face folder (config.json, *.safetensors, tokenizer); null = the embedded default model.",
    )
    framework: Framework = Field(
        "auto",
        description="auto | nxdi | tnx | torch (the PyTorch reference runner); VLLM_NEURON_FRAMEWORK "
        "(neuronx-distributed-inference | transformers-neuronx) is honoured too.",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto | float32 | bfloat16 | float16; auto is float32 on CPU and bfloat16 on accelerators."
    )
    compile: bool = Field(
        False,
        description="Run the reference model as fixed-shape compiled graphs (torch.compile) as Neuron does: full-batch "
        "decode, prefill length buckets; off by default for the CPU quickstart.",
    )
    max_num_seqs: int = Field(
        8, ge=1, le=1024, description="Batch slots, each owning one KV-cache line (Neuron's compiled batch size)."
    )
    max_model_len: int = Field(
        2048,
        ge=2,
        description="Longest sequence (prompt + output) a slot holds; unset: this default, capped at the model's "
        "limit (max_position_embeddings or the like in its config.json).",
    )
    max_context_length: int = Field(
        1024,
        ge=1,
        description="Longest prompt accepted (Neuron's context-encoding bucket limit); unset: this default, "
        "capped at max_model_len.",
    )
    max_num_batched_tokens: int = Field(
        2048,
        ge=1,
        description="Prompt tokens prefilled per engine step at most, so decodes of running requests are never starved.",
    )
    device: str = Field("cpu", description="Torch device of the reference runner: cpu, cuda, cuda:1 ...")
    neuron_config_overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="NxDI / TNx NeuronConfig keywords merged last, as vLLM's override_neuron_config (a JSON object: "
        "fused QKV, kernels, quantization, sequence parallelism ...); a key the installed release does not know is "
        "a start-up error, and the overrides are part of the compiled artifacts' key.",
    )
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    speculation: SpeculationConfig = Field(default_factory=SpeculationConfig)
    parallelism: ParallelismConfig = Field(default_factory=ParallelismConfig)
    compile_cache: CompileCacheConfig = Field(default_factory=CompileCacheConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)

    @field_validator("neuron_config_overrides", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        """A JSON object given as text (an environment variable or a flag) is parsed; anything else is validated
        as it is."""
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"must be a JSON object, e.g. '{{\"fused_qkv\": true}}' ({exc})") from None
        return value

    @model_validator(mode="after")
    def _check(self) -> "RuntimeConfig":
        if "max_context_length" not in self.model_fields_set:
            # An unset max_context_length follows a shorter max_model_len (vLLM's rule). Written past pydantic so
            # that it still counts as unset: resolve_model_limits asks.
            default = type(self).model_fields["max_context_length"].default
            self.__dict__["max_context_length"] = min(default, self.max_model_len)
        elif self.max_context_length > self.max_model_len:
            raise ValueError(
                f"max_context_length must be <= max_model_len ({self.max_context_length} > {self.max_model_len}): "
                "lower max_context_length or raise max_model_len"
            )
        return self

    def public_dict(self) -> dict[str, Any]:
        """The config as JSON-ready data with secrets masked (for /v1/info and logs)."""
        data = self.model_dump(mode="json")
        if self.server.api_key is not None:
            data["server"]["api_key"] = "********"
        return data


def cache_root(env: Mapping[str, str] = os.environ) -> Path:
    """Machine-wide cache for converted models and other heavy artifacts (never the repo)."""
    return Path(env.get("NEURONMODEL_CACHE") or Path.home() / ".cache" / "neuronmodel")


def default_model_path(env: Mapping[str, str] = os.environ) -> Path:
    return cache_root(env) / "models" / DEFAULT_MODEL_NAME


ENV_PREFIX = "NEURONMODEL_"

#: Settings whose name is not their own key: a key that says too little outside its section gets the section's
#: name (`speculation.mode` -> `speculation_mode`); `on_device_sampling` predates this rule and is documented.
QUALIFIED_NAMES = {
    "sampling.on_device": "on_device_sampling",
    "speculation.mode": "speculation_mode",
    "compile_cache.url": "compile_cache_url",
    "compile_cache.policy": "compile_cache_policy",
}


@dataclass(frozen=True)
class Setting:
    """One leaf field of RuntimeConfig, settable as NEURONMODEL_<NAME> and as --<name> (underscores as dashes)."""

    path: str  # dotted field path, e.g. "server.port"
    name: str  # the field's key, or its QUALIFIED_NAMES entry: "port"
    field: FieldInfo

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _leaf_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """(dotted path, field) of every leaf field, recursing into nested config models."""
    for key, info in model.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            yield from _leaf_fields(info.annotation, f"{prefix}{key}.")
        else:
            yield prefix + key, info


def settings_table(model: type[BaseModel]) -> dict[str, Setting]:
    """Dotted path -> Setting for every leaf field of `model`: the one table behind env variables and flags.

    Raises:
        TypeError: two fields would share a name; the fix is a QUALIFIED_NAMES entry.
    """
    table: dict[str, Setting] = {}
    owners: dict[str, str] = {}
    for path, info in _leaf_fields(model):
        name = QUALIFIED_NAMES.get(path, path.rsplit(".", 1)[-1])
        if name in owners:
            raise TypeError(f"{path} and {owners[name]} would both be {ENV_PREFIX}{name.upper()}; "
                            "give one of them a QUALIFIED_NAMES entry")
        owners[name] = path
        table[path] = Setting(path, name, info)
    return table


#: Every RuntimeConfig field, with its env variable and flag (README's configuration table lists exactly these).
SETTINGS = settings_table(RuntimeConfig)


def named(path: str) -> str:
    """A field as error messages name it: `server.port (--port, NEURONMODEL_PORT)`."""
    setting = SETTINGS[path]
    return f"{path} ({setting.flag}, {setting.env})"

#: vLLM's framework variable, honoured for users coming from vLLM on Neuron.
VLLM_FRAMEWORK_VALUES = {"neuronx-distributed-inference": "nxdi", "transformers-neuronx": "tnx"}


class ConfigError(ValueError):
    """A config that cannot be used; the message names the field and the fix."""


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
    vllm = env.get("VLLM_NEURON_FRAMEWORK")
    if vllm:
        if vllm not in VLLM_FRAMEWORK_VALUES:
            raise ConfigError(
                f"VLLM_NEURON_FRAMEWORK={vllm!r} is not a framework; use one of {sorted(VLLM_FRAMEWORK_VALUES)}"
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


def read_model_config(model_dir: Path) -> dict[str, Any]:
    """A model folder's config.json as a dict.

    Raises:
        ConfigError: unreadable or not a JSON object; the message names `model` and the file.
    """
    path = model_dir / "config.json"
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"model: cannot read {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"model: {path} is not valid JSON ({exc}); re-download or re-convert the model") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"model: {path} must hold a JSON object")
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
