"""RuntimeConfig: the one JSON document that configures a runtime process, and its sections.

snake_case, every field optional with a documented default, unknown keys an error naming the key. The cross-field
rules the CRD checks too are rules.py's; a field's bounds and choices here are also the spec's (the operator's tests
compare them). This module never imports torch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, SecretStr, field_validator, model_validator

from neuronmodel_runtime.config import env as env_names
from neuronmodel_runtime.config.rules import CONTEXT_LENGTH, DRAFT_MODEL, NODES, PROMPT_LOOKUP, SpeculationMode

#: The embedded default model, converted by scripts/fetch_default_model.py.
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"

Framework = Literal["auto", "nxdi", "tnx", "torch"]
Dtype = Literal["auto", "bfloat16", "float16", "float32"]
CachePolicy = Literal["IfNotCached", "Always", "Never"]
#: Seconds; a whole number is written as a JSON integer (30, not 30.0), as the operator has always written
#: server.drain_timeout_s into its content-named ConfigMaps.
Seconds = Annotated[float, PlainSerializer(lambda s: int(s) if s.is_integer() else s, when_used="json")]
#: The longest sequence either side accepts, in tokens.
MAX_TOKENS = 1048576


class ConfigError(ValueError):
    """A config that cannot be used; the message names the field and the fix."""


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
    mode: SpeculationMode = Field(
        "none",
        description="none | draft (a smaller draft model) | promptLookup (n-grams of the request itself) "
        "| eagle (Neuron runners only).",
    )
    draft_model: Optional[str] = Field(
        None,
        description="Draft model folder (Hugging Face, same tokenizer as the target); set exactly when "
        "speculation.mode is draft or eagle.",
    )
    num_speculative_tokens: int = Field(
        4, ge=1, le=16, description="k: tokens proposed per step; a step returns 1..k+1 tokens per sequence."
    )
    prompt_lookup_min: int = Field(2, ge=1, le=64, description="Smallest n-gram that prompt lookup matches.")
    prompt_lookup_max: int = Field(
        4, ge=1, le=64, description="Largest n-gram that prompt lookup matches (tried first)."
    )

    @model_validator(mode="after")
    def _check(self) -> "SpeculationConfig":
        DRAFT_MODEL.check(self)
        PROMPT_LOOKUP.check(self)
        return self


class ParallelismConfig(_Strict):
    tensor_parallel_degree: int = Field(
        1, ge=1, le=1024, description="NeuronCores (or reference-runner processes) the model is sharded over."
    )
    nodes: int = Field(
        1,
        ge=1,
        le=64,
        description="Nodes in one serving group (multi-node tensor parallelism through LeaderWorkerSet).",
    )

    @model_validator(mode="after")
    def _check(self) -> "ParallelismConfig":
        NODES.check(self)
        return self


class CompileCacheConfig(_Strict):
    url: Optional[str] = Field(
        None,
        description="Where compiled artifacts live: a filesystem path (PVC) or s3://bucket/prefix; "
        "null disables the cache.",
    )
    policy: CachePolicy = Field(
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
    request_timeout_s: Seconds = Field(
        600.0, gt=0, description='A request still unfinished after this many seconds is aborted (finish_reason "abort").'
    )
    drain_timeout_s: Seconds = Field(
        30.0, ge=0, description="Seconds SIGTERM waits for in-flight requests before exiting anyway."
    )
    liveness_timeout_s: Seconds = Field(
        120.0,
        gt=0,
        description="/health fails when there is work and the engine step loop has made no progress for this many "
        "seconds (a hung runner call, a known failure mode of Neuron runtimes); the kubelet then restarts the pod.",
    )
    served_model_name: Optional[str] = Field(
        None, description="Name served in /v1/models and required in requests; null = the model folder's name."
    )
    max_request_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="Largest request body accepted, in bytes (its Content-Length, or what a chunked body has sent so "
        "far); a larger one is answered 413 before it is parsed.",
    )
    max_stop_sequences: int = Field(16, ge=1, le=1024, description="Most strings a request's `stop` may hold.")
    max_stop_length: int = Field(
        256, ge=1, le=65536, description="Longest string in a request's `stop`, in characters."
    )
    max_logit_bias: int = Field(
        1024, ge=1, le=MAX_TOKENS, description="Most entries a request's `logit_bias` may hold."
    )
    engine_process: bool = Field(
        False,
        description="Run the engine core (scheduler, runner, detokenizer) in a child process, so that the step loop "
        "and the HTTP event loop never wait for each other's GIL; if that process dies, in-flight requests end with "
        "an error and the server exits with code 1.",
    )
    async_scheduling: bool = Field(
        False,
        description="Detokenize and send each step's tokens while the runner runs the next step, instead of between "
        "the two (the runner is still called from one thread, in order); a stop string then ends its request one "
        "step late, and that step's token is dropped.",
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
    dtype: Dtype = Field(
        "auto", description="auto | float32 | bfloat16 | float16; auto is float32 on CPU and bfloat16 on accelerators."
    )
    compile: bool = Field(
        False,
        description="Run the reference model as fixed-shape compiled graphs (torch.compile) as Neuron does: decode "
        "batch buckets, prefill length buckets; off by default for the CPU quickstart.",
    )
    max_num_seqs: int = Field(
        8, ge=1, le=1024, description="Batch slots, each owning one KV-cache line (Neuron's compiled batch size)."
    )
    max_model_len: int = Field(
        2048,
        ge=2,
        le=MAX_TOKENS,
        description="Longest sequence (prompt + output) a slot holds; unset: this default, capped at the model's "
        "limit (max_position_embeddings or the like in its config.json).",
    )
    max_context_length: int = Field(
        1024,
        ge=1,
        le=MAX_TOKENS,
        description="Longest prompt accepted (Neuron's context-encoding bucket limit); unset: this default, "
        "capped at max_model_len.",
    )
    max_num_batched_tokens: int = Field(
        2048,
        ge=1,
        description="Prompt tokens prefilled per engine step at most, so decodes of running requests are never starved.",
    )
    device: str = Field("cpu", description="Torch device of the reference runner: cpu, cuda, cuda:1 ...")
    cpu_threads: Optional[int] = Field(
        None,
        ge=1,
        description="Intra-op threads of the torch reference runner; null: every CPU this process may use (its "
        "affinity, at most its cgroup's CPU quota, so a pod's CPU limit). SmolLM2 on 2 cores with the engine core "
        "process beside the server made 1.6-1.7x the tokens/s with 2 threads as with 1. Where other processes "
        "hold the cores, fewer threads than cores avoid OpenMP threads spinning while descheduled.",
    )
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
        else:
            CONTEXT_LENGTH.check(self)
        return self

    def public_dict(self) -> dict[str, Any]:
        """The config as JSON-ready data with secrets masked (for /v1/info and logs)."""
        data = self.model_dump(mode="json")
        if self.server.api_key is not None:
            data["server"]["api_key"] = "********"
        return data


def cache_root(env: Mapping[str, str] = os.environ) -> Path:
    """Machine-wide cache for converted models and other heavy artifacts (never the repo)."""
    return Path(env.get(env_names.CACHE) or Path.home() / ".cache" / "neuronmodel")


def default_model_path(env: Mapping[str, str] = os.environ) -> Path:
    return cache_root(env) / "models" / DEFAULT_MODEL_NAME
