"""What the NxDI and TNx runners share: the installed library's version, the model's config.json, the tokens of a
fused speculative step, and the capabilities of on-device versus host sampling (compiled artifacts:
compiled_artifacts.py).

Nothing here imports a Neuron library; the runners import theirs lazily, in `load()`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, Mapping, Optional, Sequence

from neuronmodel_runtime.config import RuntimeConfig, named
from neuronmodel_runtime.frameworks import INSTANCE_FAMILY_ENV, NEURON_INSTALL_HINT
from neuronmodel_runtime.releases import known, release_of, support_facts
from neuronmodel_runtime.runners.base import RunnerError
from neuronmodel_runtime.sampling.params import SamplingCapabilities

#: The largest global top-k a Neuron runner compiles into its on-device sampler. vllm-neuron caps it at 256
#: (`_MAX_NEURON_SAMPLING_TOP_K`, "NEURON has an upper limit on the top_k"), as vLLM's TNx speculation runner does;
#: neuronx-distributed's `nxd_topk` (operators/topk.py, Release 2.29 fbac349) states no limit of its own, so the
#: limit is the one vLLM found on the device.
MAX_DEVICE_TOP_K = 256


def check_device_top_k(config: RuntimeConfig) -> None:
    """Refuse a global top-k above the device's limit when sampling on the device (the host sampler has none).

    Raises:
        RunnerError: naming sampling.global_top_k and both fixes.
    """
    top_k = config.sampling.global_top_k
    if config.sampling.on_device and top_k > MAX_DEVICE_TOP_K:
        raise RunnerError(
            f"sampling.global_top_k {top_k} is above {MAX_DEVICE_TOP_K}, the most a Neuron runner's on-device sampler "
            f"takes: set {named('sampling.global_top_k')} to {MAX_DEVICE_TOP_K} or less, or sample on the host "
            f"({named('sampling.on_device')} false)")


def refuse_managed_overrides(overrides: Mapping[str, Any], managed: Mapping[str, str]) -> None:
    """Refuse neuron_config_overrides keys the runner derives from RuntimeConfig fields (`managed`: key -> the
    field that sets it): the runner depends on their values, so they are set through the field.

    Raises:
        RunnerError: naming each such key and its field.
    """
    clash = sorted(set(overrides) & set(managed))
    if clash:
        raise RunnerError("neuron_config_overrides: " + "; ".join(f"{key} is set by {managed[key]}" for key in clash)
                          + ": set the field instead of overriding the key")


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


def aws_support(framework: str, version: str, env: Mapping[str, str] = os.environ) -> Optional[dict[str, Any]]:
    """Whether AWS still patches this release line on this pod's instance family (the operator sets
    $NEURONMODEL_INSTANCE_FAMILY), for runner.info(); None for a version the runner was not written against."""
    return support_facts(framework, version, env.get(INSTANCE_FAMILY_ENV) or None)


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


__all__ = ["MAX_DEVICE_TOP_K", "aws_support", "check_device_top_k", "first_tokens", "import_library",
           "read_model_config", "refuse_managed_overrides", "release_warning", "sampling_capabilities"]
