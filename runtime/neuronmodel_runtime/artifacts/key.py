"""The artifact key: the one sha256 that names a runner's compiled artifacts, and what it is made of.

`artifact_key(inputs)` is the sha256 of the canonical JSON of `inputs`; `key_inputs` gathers them: everything that
changes the compiled graph. The runner supplies its compiled shape (batch, lengths, buckets, dtype, sampling and
speculation as it compiles them); this module adds what the runner does not know or should not have to: which model
(the source and revision `fetch` recorded, or a digest of the weights), the framework, compiler, runtime and torch
versions found on this host, the instance family and target (set by the operator), the logical NeuronCore config,
and the tensor-parallel degree and ranks. Upstream caches leave the compiler, the SDK and the LNC out of their keys,
so artifacts compiled for one silently fail or mislead on another; this key keeps them in.

(The operator's `status.resolved.compileKey` is another sha256, of the spec: it decides when a compile Job runs.)
Pure data out; no torch import.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Optional

from neuronmodel_runtime.artifacts.folder import (ARTIFACTS_MARKER, FETCH_MARKER, has_files, read_json, scan_files,
                                                  write_json)
from neuronmodel_runtime.config import RuntimeConfig, cache_root
from neuronmodel_runtime.config import env as env_names
from neuronmodel_runtime.config import keys
from neuronmodel_runtime.config.keys import canonical_json
from neuronmodel_runtime.frameworks import FrameworkDetection, detect_frameworks

#: The files whose bytes are the model's weights (and what turns them into a graph: config and tokenizer aside).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


# --- the digest ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ArtifactKey:
    """`digest`: sha256 hex of the canonical JSON of `inputs` (kept in canonical form: tuples as lists)."""

    digest: str
    inputs: Mapping[str, Any] = field(compare=False, repr=False)


def artifact_key(inputs: Mapping[str, Any]) -> ArtifactKey:
    """The key of `inputs` (pure: dict order never changes it, any value change does)."""
    return ArtifactKey(keys.digest(inputs), json.loads(canonical_json(inputs)))


# --- the inputs ------------------------------------------------------------------------------------------------------

def model_identity(model_dir: Path, memo_dir: Optional[Path] = None) -> dict[str, Any]:
    """The model: the source, revision and commit `neuronmodel-runtime fetch` recorded in the folder, else a sha256
    of config.json and of every weight file (remembered per folder, file sizes and mtimes, in `memo_dir`, so a
    large model is hashed once)."""
    marker = read_json(model_dir / FETCH_MARKER)
    if marker and marker.get("source"):
        return {"source": marker["source"], "revision": marker.get("revision"), "commit": marker.get("commit")}
    files = sorted(p for p in model_dir.iterdir() if p.name == "config.json" or p.suffix in WEIGHT_SUFFIXES)
    stamp = [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]
    memo = (memo_dir or cache_root() / "digests") / (hashlib.sha256(str(model_dir.resolve()).encode()).hexdigest()
                                                     + ".json")
    known = read_json(memo)
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
    """The artifact-key inputs of a runner's compiled artifacts (see the module docstring); `shape` is the runner's
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
        "instance_family": env.get(env_names.INSTANCE_FAMILY) or None,
        "logical_nc_config": env.get(env_names.LOGICAL_NC_CONFIG) or None,  # the compiler's target (trn2)
        "tensor_parallel_degree": config.parallelism.tensor_parallel_degree,
        "nodes": config.parallelism.nodes,
        "shape": dict(shape),
    }


# --- the compiled-artifacts marker -----------------------------------------------------------------------------------

def is_prepared(local: Path, key: ArtifactKey) -> bool:
    """`local` holds a complete copy of `key`'s artifacts: its marker names the key and every file has its size."""
    marker = read_json(Path(local) / ARTIFACTS_MARKER)
    return marker is not None and marker.get("key") == key.digest and has_files(local, marker.get("files"))


def write_marker(folder: Path, key: ArtifactKey, origin: str) -> None:
    """The marker of a compiled-artifacts folder whose files are all there: the key, its inputs, each file's size."""
    files = [[rel, path.stat().st_size] for rel, path in scan_files(folder)]
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    record = {"key": key.digest, "inputs": key.inputs, "origin": origin, "created": created, "files": files}
    write_json(folder / ARTIFACTS_MARKER, record)


__all__ = ["ArtifactKey", "artifact_key", "canonical_json", "is_prepared",
           "key_inputs", "model_identity", "write_marker"]
