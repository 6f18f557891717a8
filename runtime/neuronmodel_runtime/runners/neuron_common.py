"""What the NxDI and TNx runners share: the installed library's version, where compiled artifacts live and when to
compile them, the model's config.json, the tokens of a fused speculative step, and the capabilities of on-device
versus host sampling.

Nothing here imports a Neuron library; the runners import theirs lazily, in `load()`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, Mapping, Sequence

from neuronmodel_runtime.config import RuntimeConfig, cache_root
from neuronmodel_runtime.frameworks import NEURON_INSTALL_HINT
from neuronmodel_runtime.releases import known, release_of
from neuronmodel_runtime.runners.base import RunnerError
from neuronmodel_runtime.sampling.params import SamplingCapabilities

#: vLLM's variable for a compiled-artifacts folder; honoured so that artifacts compiled for vLLM Neuron load here.
COMPILED_ARTIFACTS_ENV = "NEURON_COMPILED_ARTIFACTS"
#: Written last into an artifacts folder, with what was compiled: a folder without it is a partial compile.
COMPILED_MARKER = ".neuronmodel-compiled.json"


def import_library(framework: str, module: str, dist: str) -> tuple[ModuleType, str]:
    """Import a Neuron library and return it with its distribution version (the package's `__version__` when the
    distribution metadata is missing).

    Raises:
        RunnerError: not installed (with the install hint).
    """
    try:
        library = importlib.import_module(module)
    except ImportError as exc:
        raise RunnerError(f"framework {framework!r}: cannot import {module} ({exc}): {NEURON_INSTALL_HINT}") from exc
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        version = str(getattr(library, "__version__", "unknown"))
    return library, version


def release_warning(framework: str, version: str) -> str | None:
    """A warning when the installed release is not one the runner was written against (it may still work)."""
    if release_of(framework, version) is not None:
        return None
    return (f"{framework} {version} is not a release this runner was written against ({known(framework)}); "
            "it may work, but only those were checked against the library's source")


def artifacts_dir(config: RuntimeConfig, framework: str, version: str, compiled: Mapping[str, Any],
                  env: Mapping[str, str] = os.environ) -> Path:
    """Where this configuration's compiled model lives: `$NEURON_COMPILED_ARTIFACTS` if set, else a folder in the
    machine cache named by a digest of everything that shapes the compiled graphs (`compiled`) and the library
    version, so a changed config never loads stale artifacts."""
    if env.get(COMPILED_ARTIFACTS_ENV):
        return Path(env[COMPILED_ARTIFACTS_ENV])
    canonical = json.dumps({"framework": framework, "version": version, "model": str(config.model),
                            "compiled": compiled}, sort_keys=True, default=str)
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:16]
    return cache_root(env) / "compiled" / f"{framework}-{version}" / digest


def must_compile(artifacts: Path, policy: str, library: str) -> bool:
    """Whether to compile into `artifacts` (True) or load what is there (False), by compile_cache.policy: Always
    compiles, IfNotCached compiles unless a complete compile is there, Never loads or fails.

    Raises:
        RunnerError: policy Never and no complete compile in `artifacts`.
    """
    complete = (artifacts / COMPILED_MARKER).is_file()
    if policy == "Never" and not complete:
        raise RunnerError(f"no compiled {library} artifacts at {artifacts} and compile_cache.policy is Never; compile "
                          f"them first (policy IfNotCached) or point {COMPILED_ARTIFACTS_ENV} at them")
    return policy == "Always" or not complete


def begin_compile(artifacts: Path) -> None:
    """The folder exists and is marked incomplete until `end_compile`."""
    artifacts.mkdir(parents=True, exist_ok=True)
    (artifacts / COMPILED_MARKER).unlink(missing_ok=True)


def end_compile(artifacts: Path, record: Mapping[str, Any]) -> None:
    (artifacts / COMPILED_MARKER).write_text(json.dumps(record, sort_keys=True, default=str))


def compiled_record(artifacts: Path) -> Any:
    """What `end_compile` recorded, as JSON data (None when unreadable)."""
    try:
        return json.loads((artifacts / COMPILED_MARKER).read_text())
    except (OSError, ValueError):
        return None


def read_model_config(path: Path, what: str) -> dict[str, Any]:
    """A model folder's config.json as a dict; `what` names the setting in the error ("model")."""
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise RunnerError(f"{what}: cannot read {path / 'config.json'} ({exc}); it must be a Hugging Face model "
                          "folder") from exc
    if not isinstance(raw, dict):
        raise RunnerError(f"{what}: {path / 'config.json'} must hold a JSON object")
    return raw


def first_tokens(rows: Sequence[Sequence[int]], counts: Sequence[int], wanted: Sequence[int]) -> list[list[int]]:
    """Per row of a fused speculative step, its first `counts[i]` tokens (clamped to 1..width), at most wanted[i]:
    the libraries pad the rest, and the padding is never read."""
    return [list(row[: min(max(1, n), len(row), w)]) for row, n, w in zip(rows, counts, wanted)]


def sampling_capabilities(framework: str, on_device: bool, global_top_k: int,
                          top_p_rule: Literal["keep", "drop"], sampled: bool = True) -> SamplingCapabilities:
    """On the device a Neuron runner honours top_k / top_p / temperature only (Neuron's sampler: no generators to
    seed, token ids out, its own top-p boundary rule `top_p_rule`), or greedy decoding only (`sampled` False: fused
    speculation that verifies by argmax); sampling on the host from its logits, it honours everything the reference
    runner does."""
    if not on_device:
        return SamplingCapabilities(framework, max_top_k=global_top_k, top_p_rule="keep", seeds=True, logprobs=True,
                                    penalties=True, logit_bias=True, stop_token_masking=True)
    fix = "start it with sampling.on_device=false (the host samples, from the logits the device returns)"
    if not sampled:
        fix = "send temperature 0, or serve sampled requests from a model without speculation"
    return SamplingCapabilities(
        framework, max_top_k=global_top_k, top_p_rule=top_p_rule, sampled=sampled, seeds=False, logprobs=False,
        penalties=False, logit_bias=False, stop_token_masking=False,
        fixes={name: fix for name in ("sampled", "logprobs", "seeds", "penalties", "logit_bias", "min_tokens")},
    )


__all__ = ["COMPILED_ARTIFACTS_ENV", "COMPILED_MARKER", "artifacts_dir", "begin_compile", "compiled_record",
           "end_compile", "first_tokens", "import_library", "must_compile", "read_model_config", "release_warning",
           "sampling_capabilities"]
