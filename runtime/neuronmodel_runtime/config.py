"""RuntimeConfig: the one JSON document that configures a runtime process.

The operator writes it into a ConfigMap; `neuronmodel-runtime serve --config FILE` reads it. CLI flags and
`NEURONMODEL_*` environment variables override single fields. It is parsed once, at the edge, and every
component receives the typed object (or the slice it needs). This module never imports torch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

#: The embedded default model, converted by scripts/fetch_default_model.py.
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"

Framework = Literal["auto", "nxdi", "tnx", "torch"]


class _Strict(BaseModel):
    """Unknown keys are an error naming the key; values are validated on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SamplingConfig(_Strict):
    #: Sample on the device inside the runner; the host receives token ids only (no logprobs).
    on_device: bool = True
    #: Candidates kept per row before the per-request top-k/top-p (NxDI's `global_topk`);
    #: a request's top_k may not exceed it.
    global_top_k: int = Field(256, ge=1, le=65536)


class SpeculationConfig(_Strict):
    #: none | draft (a smaller draft model) | promptLookup (n-grams of the request itself) | eagle (Neuron only).
    mode: Literal["none", "draft", "promptLookup", "eagle"] = "none"
    #: Path of the draft model (Hugging Face folder); required by `draft` and `eagle`.
    draft_model: Optional[str] = None
    #: k: tokens proposed per step; a step returns 1..k+1 tokens per sequence.
    num_speculative_tokens: int = Field(4, ge=1, le=16)
    #: Smallest n-gram that prompt lookup matches.
    prompt_lookup_min: int = Field(2, ge=1)
    #: Largest n-gram that prompt lookup matches (tried first).
    prompt_lookup_max: int = Field(4, ge=1)

    @model_validator(mode="after")
    def _check(self) -> "SpeculationConfig":
        if self.mode in ("draft", "eagle") and not self.draft_model:
            raise ValueError(f"speculation.draft_model is required when speculation.mode is {self.mode!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("speculation.prompt_lookup_min must be <= speculation.prompt_lookup_max")
        return self


class ParallelismConfig(_Strict):
    #: Tensor-parallel degree: NeuronCores (or reference-runner processes) the model is sharded over.
    tensor_parallel_degree: int = Field(1, ge=1)
    #: Nodes in one serving group (multi-node tensor parallelism through LeaderWorkerSet).
    nodes: int = Field(1, ge=1)


class CompileCacheConfig(_Strict):
    #: Where compiled artifacts live: a filesystem path (PVC) or s3://bucket/prefix; null disables the cache.
    url: Optional[str] = None
    #: IfNotCached: compile on a miss; Always: recompile and overwrite; Never: a miss is an error.
    policy: Literal["IfNotCached", "Always", "Never"] = "IfNotCached"


class ServerConfig(_Strict):
    #: Address to bind; 0.0.0.0 inside a pod.
    host: str = "127.0.0.1"
    #: HTTP port.
    port: int = Field(8000, ge=1, le=65535)
    #: Optional bearer token required on /v1/* (never logged).
    api_key: Optional[SecretStr] = None
    #: Requests allowed to wait for a slot; beyond it the server answers 429 with Retry-After.
    max_queue: int = Field(256, ge=0)
    #: A request still unfinished after this many seconds is aborted (finish_reason "abort").
    request_timeout_s: float = Field(600.0, gt=0)
    #: Seconds SIGTERM waits for in-flight requests before exiting anyway.
    drain_timeout_s: float = Field(30.0, ge=0)
    #: /health fails when there is work and the engine step loop has made no progress for this many seconds
    #: (a hung runner call: a known failure mode of Neuron runtimes); the kubelet then restarts the pod.
    liveness_timeout_s: float = Field(120.0, gt=0)
    #: Name served in /v1/models and required in requests; defaults to the model folder's name.
    served_model_name: Optional[str] = None


class RuntimeConfig(_Strict):
    #: Hugging Face folder (config.json, *.safetensors, tokenizer); null = the embedded default model.
    model: Optional[str] = None
    #: auto | nxdi | tnx | torch (the PyTorch reference runner).
    framework: Framework = "auto"
    #: auto | float32 | bfloat16 | float16; auto is float32 on CPU and bfloat16 on accelerators.
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    #: Batch slots, each owning one KV-cache line (Neuron's compiled batch size).
    max_num_seqs: int = Field(8, ge=1, le=1024)
    #: Longest sequence (prompt + output) a slot holds.
    max_model_len: int = Field(2048, ge=2)
    #: Longest prompt accepted (Neuron's context-encoding bucket limit).
    max_context_length: int = Field(1024, ge=1)
    #: Prompt tokens prefilled per engine step at most, so decodes of running requests are never starved.
    max_num_batched_tokens: int = Field(2048, ge=1)
    #: Torch device of the reference runner: cpu, cuda, cuda:1 ...
    device: str = "cpu"
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    speculation: SpeculationConfig = Field(default_factory=SpeculationConfig)
    parallelism: ParallelismConfig = Field(default_factory=ParallelismConfig)
    compile_cache: CompileCacheConfig = Field(default_factory=CompileCacheConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)

    @model_validator(mode="after")
    def _check(self) -> "RuntimeConfig":
        if self.max_context_length > self.max_model_len:
            raise ValueError("max_context_length must be <= max_model_len")
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


#: NEURONMODEL_<NAME> -> dotted field path. Documented in README's config reference.
ENV_FIELDS = {
    "MODEL": "model",
    "FRAMEWORK": "framework",
    "DTYPE": "dtype",
    "MAX_NUM_SEQS": "max_num_seqs",
    "MAX_MODEL_LEN": "max_model_len",
    "MAX_CONTEXT_LENGTH": "max_context_length",
    "DEVICE": "device",
    "ON_DEVICE_SAMPLING": "sampling.on_device",
    "GLOBAL_TOP_K": "sampling.global_top_k",
    "SPECULATION_MODE": "speculation.mode",
    "DRAFT_MODEL": "speculation.draft_model",
    "NUM_SPECULATIVE_TOKENS": "speculation.num_speculative_tokens",
    "TENSOR_PARALLEL_DEGREE": "parallelism.tensor_parallel_degree",
    "COMPILE_CACHE_URL": "compile_cache.url",
    "HOST": "server.host",
    "PORT": "server.port",
    "API_KEY": "server.api_key",
    "MAX_QUEUE": "server.max_queue",
    "REQUEST_TIMEOUT_S": "server.request_timeout_s",
    "SERVED_MODEL_NAME": "server.served_model_name",
}

#: vLLM's framework variable, honoured for users coming from vLLM on Neuron.
VLLM_FRAMEWORK_VALUES = {"neuronx-distributed-inference": "nxdi", "transformers-neuronx": "tnx"}


class ConfigError(ValueError):
    """A config that cannot be used; the message names the field and the fix."""


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        data = data.setdefault(key, {})
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
    for name, dotted in ENV_FIELDS.items():
        value = env.get(f"NEURONMODEL_{name}")
        if value is not None and value != "":
            out[dotted] = value
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


def describe_validation_error(exc: ValidationError) -> str:
    """One line per problem: `field.path: message` (input values are not echoed, they may be secrets)."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "config"
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        lines.append(f"{loc}: {msg}")
    return "invalid runtime config: " + "; ".join(lines)
