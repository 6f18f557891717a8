"""What a compiled artifact's cache key is made of: everything that changes the compiled graph.

The runner supplies its compiled shape (batch, lengths, buckets, dtype, sampling and speculation as it compiles
them); this module adds what the runner does not know or should not have to: which model (the source and revision
`fetch` recorded, or a digest of the weights), the framework, compiler, runtime and torch versions found on this
host, the instance family and target (set by the operator), the logical NeuronCore config, and the tensor-parallel
degree and ranks. Upstream caches leave the compiler, the SDK and the LNC out of their keys, so artifacts compiled
for one silently fail or mislead on another; this key keeps them in. Pure data out; no torch import.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping, Optional

from neuronmodel_runtime.config import RuntimeConfig, cache_root
from neuronmodel_runtime.fetch import MARKER as FETCH_MARKER
from neuronmodel_runtime.frameworks import INSTANCE_FAMILY_ENV, FrameworkDetection, detect_frameworks
#: The node's logical NeuronCore config (trn2), which the compiler targets.
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
#: The files whose bytes are the model's weights (and what turns them into a graph: config and tokenizer aside).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def model_identity(model_dir: Path, memo_dir: Optional[Path] = None) -> dict[str, Any]:
    """The model: the source, revision and commit `neuronmodel-runtime fetch` recorded in the folder, else a sha256
    of config.json and of every weight file (remembered per folder, file sizes and mtimes, in `memo_dir`, so a
    large model is hashed once)."""
    marker = _read_json(model_dir / FETCH_MARKER)
    if marker and marker.get("source"):
        return {"source": marker["source"], "revision": marker.get("revision"), "commit": marker.get("commit")}
    files = sorted(p for p in model_dir.iterdir() if p.name == "config.json" or p.suffix in WEIGHT_SUFFIXES)
    stamp = [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]
    memo = (memo_dir or cache_root() / "digests") / (hashlib.sha256(str(model_dir.resolve()).encode()).hexdigest()
                                                     + ".json")
    known = _read_json(memo)
    if known and known.get("stamp") == stamp:
        return {"weights_sha256": known["digest"]}
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                digest.update(chunk)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        memo.write_text(json.dumps({"stamp": stamp, "digest": digest.hexdigest()}))
    except OSError:
        pass  # a read-only cache: hash again next time
    return {"weights_sha256": digest.hexdigest()}


def key_inputs(config: RuntimeConfig, model_dir: Path, framework: str, framework_version: str,
               shape: Mapping[str, Any], env: Mapping[str, str] = os.environ,
               detection: Optional[FrameworkDetection] = None, memo_dir: Optional[Path] = None) -> dict[str, Any]:
    """The cache-key inputs of a runner's compiled artifacts (see the module docstring); `shape` is the runner's
    compiled shape, `model_dir` the model folder it serves."""
    found = detection or detect_frameworks()
    draft = config.speculation.draft_model if config.speculation.mode in ("draft", "eagle") else None
    return {
        "model": model_identity(model_dir, memo_dir),
        "draft_model": model_identity(Path(draft), memo_dir) if draft else None,
        "framework": framework,
        "framework_version": framework_version,
        "versions": {**{name: v for name, v in found.related.items() if v}, "torch": found.installed.get("torch"),
                     "neuron_runtime": found.neuron_runtime},
        "instance_family": env.get(INSTANCE_FAMILY_ENV) or None,
        "logical_nc_config": env.get(LNC_ENV) or None,
        "tensor_parallel_degree": config.parallelism.tensor_parallel_degree,
        "nodes": config.parallelism.nodes,
        "shape": dict(shape),
    }


def _read_json(path: Path) -> Optional[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


__all__ = ["INSTANCE_FAMILY_ENV", "LNC_ENV", "key_inputs", "model_identity"]
