"""The RuntimeConfig the pods read (`/etc/neuronmodel/config.json`), and its ConfigMaps.

The operator builds the runtime's own typed RuntimeConfig from the spec (`runtime_config_for`: the runtime
validates it, with the rules the CRD's CEL checks too) and writes the fields it sets, as JSON. It never holds the
API key: that reaches the pod as env NEURONMODEL_API_KEY from a secretKeyRef.

ConfigMaps are immutable and named by their content (`<name>-runtime-<sha10>`, as Kustomize's hashed ConfigMaps):
a new config is a new ConfigMap and a new pod template, so it rolls the pods, and a pod of an older revision that
restarts mid-rollout still reads its own config (a rewrite in place would hand it the new TP and model with its old
cores and volumes). The reconcile removes the ones no ReplicaSet or pod uses any more. A new RuntimeConfig field
(with its default) changes no ConfigMap: only the fields set here are written.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Optional

from pydantic import BaseModel, ValidationError

from neuronmodel_operator import api
from neuronmodel_operator.api import NeuronModelSpec, SpecError
from neuronmodel_operator.builders import sources
from neuronmodel_operator.builders.common import COMPONENT_SERVER, Target, metadata
from neuronmodel_runtime.config import (CompileCacheConfig, ParallelismConfig, RuntimeConfig, SamplingConfig,
                                        ServerConfig, SpeculationConfig)
from neuronmodel_runtime.config.rules import RuleViolation

CONFIG_KEY = "config.json"
#: Hex characters of the content hash in a ConfigMap's (or compile Job's) name.
CONTENT_CHARS = 10
#: Seconds SIGTERM waits for in-flight requests (server.drain_timeout_s); the pod's grace period adds a margin.
DRAIN_TIMEOUT_S = 30
#: RuntimeConfig's sections by their model's name: where a section's validation error is.
_SECTIONS = {info.annotation.__name__: f"{key}." for key, info in RuntimeConfig.model_fields.items()
             if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)}


def serving_cache_policy(spec: NeuronModelSpec) -> str:
    """The compile-cache policy serving pods run with.

    Never stays Never. Always and IfNotCached become IfNotCached: the compile Job has already (re)compiled, and a
    serving pod that recompiled on every start would pay the compile at each restart and scale-up.
    """
    return "Never" if spec.compile_cache.policy == "Never" else "IfNotCached"


def compiles(spec: NeuronModelSpec) -> bool:
    """RuntimeConfig `compile`: on exactly when the spec has a compile cache.

    The Neuron runners compile whatever it says; the reference runner (framework torch, or auto on the CPU image)
    compiles its fixed-shape graphs, as Neuron does, only when asked. A compile cache asks: without compiled graphs
    the compile Job would have nothing to store, and every replica would start as the first one did.
    """
    return sources.compile_cache_mount(spec) is not None


def _spec_error(exc: ValidationError) -> SpecError:
    """The runtime's refusal of the RuntimeConfig built from a spec, naming the spec's fields (api.RUNTIME_FIELDS)."""
    problems = []
    for err in exc.errors():
        violation = (err.get("ctx") or {}).get("error")
        if isinstance(violation, RuleViolation):
            path = violation.field
        else:
            path = _SECTIONS.get(exc.title, "") + ".".join(str(p) for p in err["loc"])
        field = api.RUNTIME_FIELDS.get(path)
        message = err["msg"].removeprefix("Value error, ")
        where = "" if path in message else f" (RuntimeConfig {path})"
        problems.append(f"spec.{field}: {message}{where}" if field else f"spec: {message}")
    return SpecError("; ".join(problems))


def runtime_config_for(spec: NeuronModelSpec, name: str, for_compile: bool = False) -> RuntimeConfig:
    """The RuntimeConfig of the serving pods of NeuronModel `name`, or of its compile Job (`for_compile`: the
    spec's own cache policy).

    Raises:
        SpecError: a source the pod cannot hold, or a config the runtime refuses (a spec past the CRD's rules);
            the message names the spec's field.
    """
    draft = sources.draft_mount(spec)
    cache = sources.compile_cache_mount(spec)
    overrides = {"neuron_config_overrides": dict(spec.neuron_config_overrides)} if spec.neuron_config_overrides else {}
    try:
        return RuntimeConfig(
            model=sources.model_mount(spec).path,
            framework=spec.framework,
            compile=compiles(spec),
            dtype=spec.model.dtype,
            max_num_seqs=spec.batching.max_batch_size,
            max_model_len=spec.batching.max_seq_len,
            max_context_length=spec.batching.max_context_length,
            sampling=SamplingConfig(on_device=spec.sampling.on_device, global_top_k=spec.sampling.global_top_k),
            speculation=SpeculationConfig(
                mode=spec.speculation.mode,
                draft_model=draft.path if draft else None,
                num_speculative_tokens=spec.speculation.num_speculative_tokens,
                prompt_lookup_min=spec.speculation.prompt_lookup_min,
                prompt_lookup_max=spec.speculation.prompt_lookup_max,
            ),
            parallelism=ParallelismConfig(tensor_parallel_degree=spec.parallelism.tensor_parallel_degree,
                                          nodes=spec.parallelism.nodes),
            compile_cache=CompileCacheConfig(
                url=cache.path if cache else None,
                policy=spec.compile_cache.policy if for_compile else serving_cache_policy(spec),
                sharded_weights=spec.compile_cache.sharded_weights,
            ),
            server=ServerConfig(host="0.0.0.0", port=spec.server.port,
                                served_model_name=spec.model.served_model_name or name,
                                drain_timeout_s=DRAIN_TIMEOUT_S),
            **overrides,
        )
    except ValidationError as exc:
        raise _spec_error(exc) from None


def runtime_config(target: Target, for_compile: bool = False) -> dict[str, Any]:
    """The RuntimeConfig document of the serving pods (or of the compile Job): the fields `runtime_config_for` sets,
    as JSON data.

    Only the fields set are written (`exclude_unset`): the ConfigMap is named by its content, so a key written for
    every model would rename every ConfigMap, and roll every model's pods, on the operator's upgrade. That is also
    why `neuron_config_overrides` is set only when the spec has some.
    """
    config = runtime_config_for(target.spec, target.name, for_compile)
    return config.model_dump(mode="json", exclude_unset=True)


def runtime_config_json(target: Target, for_compile: bool = False) -> str:
    """The ConfigMap's config.json: sorted keys, indent 2 (stable bytes, so a stable hash)."""
    return json.dumps(runtime_config(target, for_compile), sort_keys=True, indent=2)


def config_hash(target: Target) -> str:
    """sha256 of the serving config.json (the runtime ConfigMap's name carries its first CONTENT_CHARS)."""
    return hashlib.sha256(runtime_config_json(target).encode()).hexdigest()


def runtime_configmap_name(target: Target) -> str:
    """`<name>-runtime-<sha10>`: the serving pods' config, named by its content."""
    return f"{target.name}-runtime-{config_hash(target)[:CONTENT_CHARS]}"


def serving_configmap_name(target: Target) -> Optional[str]:
    """The serving pods' ConfigMap (`runtime_configmap_name`); None for engine vllm, whose pods read none: vLLM
    takes the spec as flags."""
    return None if target.spec.engine == "vllm" else runtime_configmap_name(target)


def config_map(target: Target, name: str, component: str, for_compile: bool = False) -> dict[str, Any]:
    """An immutable ConfigMap `name` holding the RuntimeConfig (of the compile Job with `for_compile`)."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(target, name, component),
            "immutable": True, "data": {CONFIG_KEY: runtime_config_json(target, for_compile)}}


def configmap(target: Target) -> Optional[dict[str, Any]]:
    """The config of the spec being served (`runtime_configmap_name`); None for engine vllm."""
    name = serving_configmap_name(target)
    return None if name is None else config_map(target, name, COMPONENT_SERVER)
