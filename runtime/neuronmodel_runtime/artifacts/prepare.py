"""Where a runner's compiled artifacts come from: the local folder, the shared store, or a compile, by policy.

Every runner that compiles (NxDI, TNx, the reference runner with `compile: true`) calls `prepare_artifacts` with its
compiled shape and a function that compiles into a folder, then loads from the folder it gets back. The artifact key
(`key.key_inputs` -> `key.artifact_key`) covers the model, the versions, the target and the shape; the folder is
`$NEURON_COMPILED_ARTIFACTS`, or `<NEURONMODEL_CACHE>/compiled/<framework>-<version>/<key>` on this host; the store
is `compile_cache.url` (`open_store`: a PVC path or s3://), shared by every pod and the compile Job.

`prepare(store, key, local, policy, compile)` is the serve / compile flow, by `compile_cache.policy`; a compile
writes into a staging folder that becomes `local` complete or not at all (folder.py).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from neuronmodel_runtime.artifacts.file_store import FileStore
from neuronmodel_runtime.artifacts.folder import ARTIFACTS_MARKER, install, no_space_as, staging
from neuronmodel_runtime.artifacts.key import ArtifactKey, artifact_key, is_prepared, key_inputs, write_marker
from neuronmodel_runtime.artifacts.store import DEFAULT_LOCK_TTL_S, DEFAULT_POLL_S, ArtifactStore, CacheError
from neuronmodel_runtime.config import RuntimeConfig, cache_root
from neuronmodel_runtime.config import env as env_names

log = logging.getLogger(__name__)

POLICIES = ("IfNotCached", "Always", "Never")
#: vLLM's variable for a compiled-artifacts folder; when set, it is this host's folder for them.
COMPILED_ARTIFACTS_ENV = env_names.COMPILED_ARTIFACTS
#: neuronx-cc's persistent cache (NEFFs by HLO hash; a path or s3://), read by libneuronxla at each compile.
NEURON_CACHE_ENV = env_names.NEURON_COMPILE_CACHE_URL


class CacheMiss(CacheError):
    """Policy Never and no complete entry for the key."""


class ArtifactsError(CacheError):
    """A runner's compiled artifacts cannot be had as configured (`compile_cache: ...`, one line naming the setting or
    the store); the runners raise it on as their RunnerError."""


def open_store(url: str) -> ArtifactStore:
    """The store at `url`: a filesystem path (a PVC mount), file:///PATH, or s3://BUCKET[/PREFIX] (boto3: credentials,
    AWS_ENDPOINT_URL and the region from the environment; region default us-east-1)."""
    forms = "a filesystem path (a PVC mount), file:///PATH or s3://BUCKET[/PREFIX]"
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"compile_cache.url must be {forms}, not {url!r}")
    if url.startswith("s3://"):
        from neuronmodel_runtime.artifacts.s3 import S3Store

        bucket, _, prefix = url[len("s3://"):].partition("/")
        if not bucket:
            raise ValueError(f"compile_cache.url {url!r} names no bucket: use {forms}")
        return S3Store(url, bucket, prefix.strip("/"))
    if url.startswith("file://"):
        path = url[len("file://"):]
        if not path.startswith("/"):
            raise ValueError(f"compile_cache.url {url!r}: a file:// URL needs an absolute path (file:///PATH)")
        return FileStore(Path(path), url)
    if "://" in url:
        raise ValueError(f"compile_cache.url {url!r}: unsupported scheme; use {forms}")
    return FileStore(Path(url), url)


# --- the serve / compile flow ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Outcome:
    """What `prepare` did. key: the artifact key's digest; source: "local" (already in the folder), "store" (fetched)
    or "compiled"."""

    key: str
    hit: bool
    compiled: bool
    source: str
    fetch_s: float = 0.0
    compile_s: float = 0.0
    store_s: float = 0.0
    lock_wait_s: float = 0.0


def _compile_into(local: Path, key: ArtifactKey, compile: Callable[[Path], None]) -> float:
    """Compile into a staging folder that becomes `local`; the seconds the compile took. A full volume is a
    CacheError naming `local` (the staging folder is removed)."""
    with no_space_as(CacheError, local, f"compiling artifact key {key.digest}: ",
                     f", or point ${COMPILED_ARTIFACTS_ENV} (or NEURONMODEL_CACHE) at a larger one"), \
            staging(local) as building:
        start = time.monotonic()
        compile(building)
        took = time.monotonic() - start
        write_marker(building, key, "compiled")
        install(building, local, ARTIFACTS_MARKER)
        return took


def prepare(store: Optional[ArtifactStore], key: ArtifactKey, local: Path, policy: str,
            compile: Callable[[Path], None], *, lock_ttl_s: float = DEFAULT_LOCK_TTL_S,
            lock_wait_s: Optional[float] = None, poll_s: float = DEFAULT_POLL_S) -> Outcome:
    """Make `local` hold `key`'s compiled artifacts, by `policy`:

    - a `local` folder already holding them is used as is (except with Always);
    - Never: fetch from the store, or raise CacheMiss;
    - IfNotCached: fetch; else, under the key's lock, fetch again (compiled meanwhile) or compile and store;
    - Always: under the key's lock, compile and store (replacing the entry).

    `compile(folder)` writes the artifacts into `folder` (a fresh folder that becomes `local` when it returns; its
    exceptions propagate, and the lock is always released). With no store (`compile_cache.url` unset) a miss compiles
    into `local`, and Never raises CacheMiss.
    """
    if policy not in POLICIES:
        raise ValueError(f"compile_cache.policy must be one of {', '.join(POLICIES)}, not {policy!r}")
    local = Path(local)
    if policy != "Always" and is_prepared(local, key):
        log.info("compiled artifacts of artifact key %s already in %s", key.digest, local)
        return Outcome(key.digest, hit=True, compiled=False, source="local")
    fetch_s = 0.0
    if store is not None and policy != "Always":
        start = time.monotonic()
        hit = store.fetch(key, local)
        fetch_s = time.monotonic() - start
        if hit:
            return Outcome(key.digest, hit=True, compiled=False, source="store", fetch_s=fetch_s)
    if policy == "Never":
        where = f"{store.url} holds no complete entry for it" if store else "compile_cache.url is unset"
        raise CacheMiss(f"no compiled artifacts for key {key.digest}: {where}, nor is it in {local}, and "
                        "compile_cache.policy is Never (a serving pod never compiles): run the model's compile Job "
                        "(`neuronmodel-runtime compile --config FILE`) first, or set compile_cache.policy to "
                        "IfNotCached")
    if store is None:
        compile_s = _compile_into(local, key, compile)
        return Outcome(key.digest, hit=False, compiled=True, source="compiled", compile_s=compile_s)
    waited = time.monotonic()
    with store.lock(key, ttl_s=lock_ttl_s, wait_s=lock_wait_s, poll_s=poll_s):
        waited = time.monotonic() - waited
        if policy == "IfNotCached":
            start = time.monotonic()
            hit = store.fetch(key, local)
            fetch_s += time.monotonic() - start
            if hit:
                log.info("artifact key %s was compiled by another while this one waited %.1f s", key.digest, waited)
                return Outcome(key.digest, True, False, "store", fetch_s=fetch_s, lock_wait_s=waited)
            unfinished = store.unfinished(key)  # under the lock: no live writer; it died before its manifest
            if unfinished:
                log.warning("%s: entry %s holds %d files but no manifest (a store that never finished); a miss: "
                            "compiling it again", store.url, key.digest, len(unfinished))
        compile_s = _compile_into(local, key, compile)
        start = time.monotonic()
        store.put(key, local, {"compile_s": compile_s})
        store_s = time.monotonic() - start
    return Outcome(key.digest, False, True, "compiled", fetch_s, compile_s, store_s, waited)


# --- the runners' entry ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Artifacts:
    """A runner's compiled artifacts, ready in `folder`."""

    folder: Path  # what the runner loads from
    key: ArtifactKey  # their artifact key (digest + inputs)
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


def local_folder(key: ArtifactKey, framework: str, version: str, env: Mapping[str, str] = os.environ) -> Path:
    if env.get(COMPILED_ARTIFACTS_ENV):
        return Path(env[COMPILED_ARTIFACTS_ENV])
    return cache_root(env) / "compiled" / f"{framework}-{version}" / key.digest[:16]


def prepare_artifacts(config: RuntimeConfig, model_dir: Path, framework: str, version: str,
                      shape: Mapping[str, Any], compile: Callable[[Path], None],
                      env: Mapping[str, str] = os.environ) -> Artifacts:
    """The runner's compiled artifacts in a local folder, by `compile_cache.policy`: there already, fetched from
    `compile_cache.url`, or compiled by `compile(folder)` (and stored).

    Raises:
        ArtifactsError: policy Never and no artifacts (the message says to run the compile Job), or a store error
            (naming the url); the runner raises it on as a RunnerError with the same message.
    """
    key = artifact_key(key_inputs(config, model_dir, framework, version, shape, env))
    folder = local_folder(key, framework, version, env)
    url = config.compile_cache.url
    try:
        store = open_store(url) if url else None
        outcome = prepare(store, key, folder, config.compile_cache.policy, compile)
    except (CacheError, ValueError) as exc:
        raise ArtifactsError(f"compile_cache: {exc}") from exc
    log.info("compiled artifacts %s (artifact key %s): %s", folder, key.digest[:16],
             "compiled" if outcome.compiled else f"hit ({outcome.source})")
    return Artifacts(folder, key, outcome)


__all__ = ["COMPILED_ARTIFACTS_ENV", "NEURON_CACHE_ENV", "POLICIES", "Artifacts", "ArtifactsError", "CacheMiss",
           "Outcome", "local_folder", "neuron_compile_cache", "open_store", "prepare", "prepare_artifacts"]
