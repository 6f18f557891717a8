"""The ConfigMap's config.json, now serialised from the runtime's typed RuntimeConfig, keeps the exact bytes the
operator wrote when it built the document as a dict (operator 0.1.0 to the contract of issue 22).

A runtime ConfigMap is named by the sha256 of those bytes and the compile Job by a digest over the same document:
one changed byte renames every ConfigMap and rolls every model's pods on the operator's upgrade. So every spec the
repository shows a user (the CRD samples, the README, docs/, the chart's NOTES, the golden cases) and variations of
each field the document carries are written by both, and the two must be equal. `old_runtime_config` is a frozen
copy of the dict-based writer, its source-to-path rule included.
"""

from __future__ import annotations

import copy
import hashlib
import json
import posixpath
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from neuronmodel_operator import api, builders
from neuronmodel_operator.builders.configmap import CONTENT_CHARS
from operator_tests import golden

ROOT = Path(__file__).resolve().parents[2]


# --- the writer as it was ------------------------------------------------------------------------------------------

def _old_path(source: str, role: str) -> str:
    """What the RuntimeConfig named for a source (builders/sources.py before the shared grammar)."""
    if source.startswith(("hf://", "s3://")):
        return source if role == "compile-cache" else f"/models/{role}"
    if source.startswith("pvc://"):
        _, _, sub = source.removeprefix("pvc://").partition("/")
        root = f"/mnt/{role}"
        return posixpath.normpath(posixpath.join(root, sub)) if sub.strip("/") else root
    return posixpath.normpath(source)


def old_runtime_config(target: builders.Target, for_compile: bool = False) -> dict[str, Any]:
    spec = target.spec
    draft = spec.speculation.draft_model
    draft_path = _old_path(draft.source, "draft") if draft and spec.speculation.mode in ("draft", "eagle") else None
    cache = _old_path(spec.compile_cache.url, "compile-cache") if spec.compile_cache.url else None
    overrides = {"neuron_config_overrides": dict(spec.neuron_config_overrides)} if spec.neuron_config_overrides else {}
    serving_policy = "Never" if spec.compile_cache.policy == "Never" else "IfNotCached"
    return {
        "model": _old_path(spec.model.source, "model"),
        "framework": spec.framework,
        "compile": cache is not None,
        "dtype": spec.model.dtype,
        "max_num_seqs": spec.batching.max_batch_size,
        "max_model_len": spec.batching.max_seq_len,
        "max_context_length": spec.batching.max_context_length,
        "sampling": {"on_device": spec.sampling.on_device, "global_top_k": spec.sampling.global_top_k},
        "speculation": {
            "mode": spec.speculation.mode,
            "draft_model": draft_path,
            "num_speculative_tokens": spec.speculation.num_speculative_tokens,
            "prompt_lookup_min": spec.speculation.prompt_lookup_min,
            "prompt_lookup_max": spec.speculation.prompt_lookup_max,
        },
        "parallelism": {"tensor_parallel_degree": spec.parallelism.tensor_parallel_degree,
                        "nodes": spec.parallelism.nodes},
        "compile_cache": {"url": cache,
                          "policy": spec.compile_cache.policy if for_compile else serving_policy,
                          "sharded_weights": spec.compile_cache.sharded_weights},
        "server": {"host": "0.0.0.0", "port": spec.server.port,
                   "served_model_name": spec.model.served_model_name or target.name,
                   "drain_timeout_s": 30},
        **overrides,
    }


def old_json(target: builders.Target, for_compile: bool = False) -> str:
    return json.dumps(old_runtime_config(target, for_compile), sort_keys=True, indent=2)


# --- every spec the repository shows -------------------------------------------------------------------------------

def _yaml_blocks(text: str) -> list[dict]:
    blocks = re.findall(r"```ya?ml\n(.*?)```", text, re.S)
    return [doc for block in blocks for doc in yaml.safe_load_all(block) if isinstance(doc, dict)]


def _notes_samples() -> list[dict]:
    notes = (ROOT / "charts" / "neuronmodel-operator" / "templates" / "NOTES.txt").read_text()
    return [yaml.safe_load(textwrap.dedent(body)) for body in re.findall(r"<<'EOF'\n(.*?)\n\s*EOF", notes, re.S)]


def shown_specs() -> dict[str, dict]:
    """name -> a NeuronModel body, for every one the repository shows."""
    samples = sorted((ROOT / "crds" / "samples").glob("*.yaml"))
    bodies = {f"sample/{p.stem}": yaml.safe_load(p.read_text()) for p in samples}
    for doc in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        for i, body in enumerate(_yaml_blocks(doc.read_text())):
            bodies[f"{doc.name}/{i}"] = body
    for i, body in enumerate(_notes_samples()):
        bodies[f"NOTES/{i}"] = body
    bodies.update({f"golden/{case}": body for case, body in golden.CASES.items()})
    return {name: body for name, body in bodies.items() if body.get("kind") == api.KIND}


#: Changes to each base spec: every field the document carries, at values other than the samples' own.
VARIATIONS: dict[str, dict[str, Any]] = {
    "as-is": {},
    "served-name-and-port": {"model": {"servedModelName": "served"}, "server": {"port": 9000}},
    "dtype": {"model": {"dtype": "bfloat16"}},
    "batching": {"batching": {"maxBatchSize": 1, "maxContextLength": 2, "maxSeqLen": 2}},
    "host-sampling": {"sampling": {"onDevice": False, "globalTopK": 50}},
    "prompt-lookup": {"speculation": {"mode": "promptLookup", "draftModel": None, "numSpeculativeTokens": 7,
                                      "promptLookupMin": 1, "promptLookupMax": 64}},
    "draft-pvc": {"speculation": {"mode": "draft", "draftModel": {"source": "pvc://drafts/small/"}}},
    "eagle-s3": {"speculation": {"mode": "eagle", "draftModel": {"source": "s3://my.drafts-1/eagle"}}},
    "draft-path": {"speculation": {"mode": "draft", "draftModel": {"source": "/opt/drafts//small/"}}},
    "cache-s3-always": {"compileCache": {"url": "s3://cache-bucket/a/b/", "policy": "Always"}},
    "cache-pvc-sharded": {"compileCache": {"url": "pvc://cache", "shardedWeights": True}},
    "cache-path-never": {"compileCache": {"url": "/var/lib/cache/./neuron", "policy": "Never"}},
    "overrides": {"neuronConfigOverrides": {"fused_qkv": True, "factor": 1.0, "ratio": 0.25, "big": 10 ** 12,
                                            "buckets": [128, 512], "nested": {"a": None, "b": "x"}}},
    "model-pvc": {"model": {"source": "pvc://models.v1/llama/8b/"}},
    "model-s3": {"model": {"source": "s3://acme-models/prefix"}},
    "model-hf-trailing-slash": {"model": {"source": "hf://org/name/"}},
}


def _merge(base: dict, change: dict) -> dict:
    """`base` with `change` merged in, block by block (neuronConfigOverrides replaced whole)."""
    merged = copy.deepcopy(base)
    for key, value in change.items():
        nested = isinstance(value, dict) and key != "neuronConfigOverrides"
        merged[key] = _merge(merged.get(key) or {}, value) if nested else copy.deepcopy(value)
    return merged


def _target(body: dict) -> builders.Target:
    body = copy.deepcopy(body)
    body.setdefault("metadata", {}).setdefault("namespace", "models")
    body["metadata"].setdefault("uid", "uid-1")
    return builders.target_from_body(body, golden.DEFAULTS)


def _cases() -> list[Any]:
    cases = []
    for name, body in shown_specs().items():
        for variation, change in VARIATIONS.items():
            spec = _merge(body["spec"], change)
            if spec.get("framework") == "torch" and "neuronConfigOverrides" in spec:
                continue  # refused by the CRD
            if spec.get("engine") == "vllm":
                continue  # its pods read no ConfigMap: vLLM takes the spec as flags (test_vllm_args.py)
            nodes = spec.get("parallelism", {}).get("nodes", 1)
            if nodes > 1 and spec.get("compileCache", {}).get("shardedWeights") and spec.get("framework") != "torch":
                continue  # refused: NxDI pre-shards the compiling host's ranks only
            cases.append(pytest.param({**body, "spec": spec}, id=f"{name}:{variation}"))
    return cases


CASES = _cases()


def test_the_repository_shows_specs_to_compare():
    assert len(shown_specs()) >= 7 + 1 + 3 + 1 + len(golden.CASES)


@pytest.mark.parametrize("body", CASES)
def test_config_json_bytes_are_unchanged(body):
    target = _target(body)
    for for_compile in (False, True):
        assert builders.runtime_config_json(target, for_compile) == old_json(target, for_compile)
    old_hash = hashlib.sha256(old_json(target).encode()).hexdigest()
    assert builders.runtime_configmap_name(target) == f"{target.name}-runtime-{old_hash[:CONTENT_CHARS]}"
