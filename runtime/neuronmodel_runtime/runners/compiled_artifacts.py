"""Where a runner's compiled artifacts come from: the local folder, the shared store, or a compile, by policy.

Every runner that compiles (NxDI, TNx, the reference runner with `compile: true`) calls `prepare_artifacts` with its
compiled shape and a function that compiles into a folder, then loads from the folder it gets back. The key
(`artifact_key.key_inputs` -> `cache.cache_key`) covers the model, the versions, the target and the shape; the
folder is `$NEURON_COMPILED_ARTIFACTS`, or `<NEURONMODEL_CACHE>/compiled/<framework>-<version>/<key>` on this host;
the store is `compile_cache.url` (a PVC path or s3://), shared by every pod and the compile Job.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from neuronmodel_runtime.artifact_key import key_inputs
from neuronmodel_runtime.cache import CacheError, CacheKey, Outcome, cache_key, open_store, prepare
from neuronmodel_runtime.config import RuntimeConfig, cache_root
from neuronmodel_runtime.runners.base import RunnerError

log = logging.getLogger(__name__)

#: vLLM's variable for a compiled-artifacts folder; when set, it is this host's folder for them.
COMPILED_ARTIFACTS_ENV = "NEURON_COMPILED_ARTIFACTS"
#: neuronx-cc's persistent cache (NEFFs by HLO hash; a path or s3://), read by libneuronxla at each compile.
NEURON_CACHE_ENV = "NEURON_COMPILE_CACHE_URL"


@dataclass(frozen=True)
class Artifacts:
    """A runner's compiled artifacts, ready in `folder`."""

    folder: Path  # what the runner loads from
    key: CacheKey  # their cache key (digest + inputs)
    outcome: Outcome  # hit or compiled, and the seconds each part took

    def info(self) -> dict[str, Any]:
        """For runner.info() and /v1/info."""
        return {"folder": str(self.folder), **asdict(self.outcome)}


def neuron_compile_cache(config: RuntimeConfig) -> dict[str, str]:
    """The environment that points neuronx-cc's own persistent cache into the store, `<compile_cache.url>/neuronx-cc`,
    so that graphs compiled by any pod or Job (the NEFFs NxDI and TNx compile) are shared too; empty without a
    store. Set before a Neuron library is imported (the CLI does)."""
    url = config.compile_cache.url
    return {NEURON_CACHE_ENV: url.rstrip("/") + "/neuronx-cc"} if url else {}


def local_folder(key: CacheKey, framework: str, version: str, env: Mapping[str, str] = os.environ) -> Path:
    if env.get(COMPILED_ARTIFACTS_ENV):
        return Path(env[COMPILED_ARTIFACTS_ENV])
    return cache_root(env) / "compiled" / f"{framework}-{version}" / key.digest[:16]


def prepare_artifacts(config: RuntimeConfig, model_dir: Path, framework: str, version: str,
                      shape: Mapping[str, Any], compile: Callable[[Path], None],
                      env: Mapping[str, str] = os.environ) -> Artifacts:
    """The runner's compiled artifacts in a local folder, by `compile_cache.policy`: there already, fetched from
    `compile_cache.url`, or compiled by `compile(folder)` (and stored).

    Raises:
        RunnerError: policy Never and no artifacts (the message says to run the compile Job), or a store error
            (naming the url).
    """
    key = cache_key(key_inputs(config, model_dir, framework, version, shape, env))
    folder = local_folder(key, framework, version, env)
    url = config.compile_cache.url
    try:
        store = open_store(url) if url else None
        outcome = prepare(store, key, folder, config.compile_cache.policy, compile)
    except (CacheError, ValueError) as exc:
        raise RunnerError(f"compile_cache: {exc}") from exc
    log.info("compiled artifacts %s (key %s): %s", folder, key.digest[:16],
             "compiled" if outcome.compiled else f"hit ({outcome.source})")
    return Artifacts(folder, key, outcome)


__all__ = ["COMPILED_ARTIFACTS_ENV", "NEURON_CACHE_ENV", "Artifacts", "local_folder", "neuron_compile_cache",
           "prepare_artifacts"]
