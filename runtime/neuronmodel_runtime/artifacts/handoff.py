"""An engine's own compiled-artifacts folder handed out of the store and back: `neuronmodel-runtime artifacts`.

For engine vllm the operator runs vLLM Neuron's `vllm serve`, which compiles into a folder of its own
(`$VLLM_CACHE_ROOT` on the native line, `$NEURON_COMPILED_ARTIFACTS` on the NxDI line) and knows nothing of our
store. Our runtime image brings the two together around it, in containers of the same pod:

- `fetch` (an init container, before vLLM starts): the store's entry into the folder, complete or not at all.
  Serving pods pass `required`: a miss is an `ArtifactsMissing` error naming the key and the store (the operator's
  status shows it), never a 40-minute compile in a serving pod. The compile Job fetches too, without `required`: a
  hit makes its vLLM start warm.
- `store` (the compile Job's container, beside vLLM, which runs under supervise.py): once vLLM answers on its health
  URL (it compiles before it serves), the folder becomes the entry of the key, under the key's lock. Policy
  IfNotCached stores nothing when the folder is the store's entry already (the Job's fetch was a hit); a folder vLLM
  compiled is stored, so an entry that was missing or corrupt at the Job's start is replaced. Always stores in any
  case. With the supervisor's folder (`engine_dir`), it stops waiting as soon as vLLM exits (a failed compile fails
  the Job's pod in seconds, not at the health wait's timeout), and when it is done, stored or not, it tells the
  supervisor to stop vLLM, so the pod ends. On vLLM Neuron's native line (`neff_in`), a folder that holds no compiled
  graph (no *.neff under those subfolders) is refused: serving pods would fail on every graph they miss.

The key's inputs come from the operator (env.ARTIFACT_KEY_INPUTS, its digest is the status' compileKey): the
versions the image pins, the target, LNC, TP and every flag that fixes the compiled shape. Nothing here imports
torch or boto3 (s3:// stores load boto3 on use).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from neuronmodel_runtime.artifacts.key import ArtifactKey, artifact_key, is_prepared
from neuronmodel_runtime.artifacts.prepare import POLICIES, open_store
from neuronmodel_runtime.artifacts.store import CacheError
from neuronmodel_runtime.artifacts.supervise import ENGINE, EXITED, STORED
from neuronmodel_runtime.config import env as env_names
from neuronmodel_runtime.config.keys import ARTIFACTS_MISSING

log = logging.getLogger(__name__)

#: How often `store` asks the engine whether it is up.
READY_POLL_S = 2.0


class HandoffError(CacheError):
    """The folder cannot be fetched or stored as asked (one line naming the setting, the key or the store)."""


def key_from_env(environ: Mapping[str, str]) -> ArtifactKey:
    """The artifact key of env.ARTIFACT_KEY_INPUTS (a JSON object).

    Raises:
        HandoffError: the variable is unset or not a JSON object.
    """
    name = env_names.ARTIFACT_KEY_INPUTS
    text = environ.get(name)
    if not text:
        raise HandoffError(f"{name} is unset: the operator sets the key inputs of the engine's artifacts there")
    try:
        inputs = json.loads(text)
        return artifact_key(inputs)
    except ValueError as exc:
        raise HandoffError(f"{name}: not a JSON object of key inputs ({exc})") from None


def fetch(url: str, key: ArtifactKey, dest: Path, required: bool) -> dict[str, Any]:
    """Fetch `key`'s entry of the store at `url` into `dest` (replacing it); returns a summary.

    Raises:
        HandoffError: `required` and the store holds no complete entry (its message starts with ARTIFACTS_MISSING).
    """
    started = time.monotonic()
    try:
        hit = open_store(url).fetch(key, Path(dest))
    except ValueError as exc:
        raise HandoffError(f"--store: {exc}") from None
    if not hit and required:
        raise HandoffError(
            f"{ARTIFACTS_MISSING}: no compiled artifacts for key {key.digest} in {url}, and a serving pod never "
            "compiles: let the model's compile Job store them (compileCache.policy IfNotCached or Always), or, with "
            "policy Never, compile this exact spec (same image, instance family and flags) into that cache first")
    summary = {"key": key.digest, "store": url, "hit": hit, "dest": str(dest),
               "seconds": round(time.monotonic() - started, 3)}
    log.info("artifacts fetch: %s", json.dumps(summary))
    return summary


def _exited(engine_dir: Optional[Path]) -> Optional[int]:
    """The engine's exit status as its supervisor recorded it (supervise.py), None while it runs."""
    if engine_dir is None or not (engine_dir / EXITED).is_file():
        return None
    return int(json.loads((engine_dir / EXITED).read_text())["status"])


def wait_ready(ready_url: str, timeout_s: float, sleep: Callable[[float], None] = time.sleep,
               engine_dir: Optional[Path] = None) -> float:
    """Poll `ready_url` until it answers 200; returns the seconds waited.

    Raises:
        HandoffError: the engine exited (its supervisor says so in `engine_dir`), or no 200 within `timeout_s` (the
            engine never came up: its own log says why).
    """
    started = time.monotonic()
    while True:
        try:
            with urllib.request.urlopen(ready_url, timeout=5) as reply:
                if reply.status == 200:
                    return time.monotonic() - started
        except (urllib.error.URLError, OSError):
            pass
        if (status := _exited(engine_dir)) is not None:
            raise HandoffError(f"the engine exited with status {status} before it answered on {ready_url}: nothing "
                               "was compiled; its container's termination message (its last log lines) says why")
        if time.monotonic() - started >= timeout_s:
            raise HandoffError(f"--ready-url: {ready_url} did not answer 200 within {timeout_s:.0f} s: the engine "
                               "never came up (its container's log says why)")
        sleep(READY_POLL_S)


def check_graphs(src: Path, neff_in: Sequence[str], engine_dir: Optional[Path]) -> Optional[bool]:
    """Whether the folder holds a compiled graph (a *.neff) under one of its subfolders `neff_in`; None: not
    checked (none named, or the supervisor found no vLLM Neuron plugin in the engine's image, whose graphs are then
    no NEFFs: vLLM's CPU build standing in for it in tests).

    Raises:
        HandoffError: none there, naming the folders looked in.
    """
    if not neff_in:
        return None
    if engine_dir is not None and (engine_dir / ENGINE).is_file() and \
            not json.loads((engine_dir / ENGINE).read_text()).get("neuron_plugin"):
        return None
    folders = [src / sub for sub in neff_in]
    if any(next(folder.rglob("*.neff"), None) is not None for folder in folders if folder.is_dir()):
        return True
    raise HandoffError(f"{src} holds no compiled graph (no *.neff under {', '.join(str(f) for f in folders)}): vLLM "
                       "Neuron wrote its graphs elsewhere, and serving pods, which never compile, would fail on each; "
                       "nothing was stored (see VLLM_CACHE_ROOT and NEURON_LIBTORCH_CACHE_ROOT in the Job's pod)")


def store(url: str, key: ArtifactKey, src: Path, policy: str, ready_url: Optional[str],
          ready_timeout_s: float, engine_dir: Optional[Path] = None, neff_in: Sequence[str] = ()) -> dict[str, Any]:
    """Once the engine is up (`ready_url` answers 200; None: it is), store `src` as `key`'s entry of the store at
    `url`, by `policy` (see the module); then, stored or not, tell the engine's supervisor in `engine_dir` (None: no
    supervisor) to stop it; returns a summary.

    Raises:
        HandoffError: a policy other than IfNotCached or Always (Never has no compile Job), the engine exited or
            never came up, `src` holds no compiled graph under `neff_in`, or `src` is not a folder of files.
    """
    try:
        return _store(url, key, src, policy, ready_url, ready_timeout_s, engine_dir, neff_in)
    finally:
        if engine_dir is not None:
            engine_dir.mkdir(parents=True, exist_ok=True)
            (engine_dir / STORED).touch()


def _store(url: str, key: ArtifactKey, src: Path, policy: str, ready_url: Optional[str], ready_timeout_s: float,
           engine_dir: Optional[Path], neff_in: Sequence[str]) -> dict[str, Any]:
    if policy not in POLICIES or policy == "Never":
        raise HandoffError(f"--policy: {policy!r} stores nothing; use IfNotCached or Always (policy Never has no "
                           "compile Job)")
    waited = wait_ready(ready_url, ready_timeout_s, engine_dir=engine_dir) if ready_url else 0.0
    try:
        target = open_store(url)
    except ValueError as exc:
        raise HandoffError(f"--store: {exc}") from None
    started = time.monotonic()
    stored = policy == "Always" or not is_prepared(Path(src), key)  # else: fetched from the entry, unchanged
    graphs = check_graphs(Path(src), neff_in, engine_dir) if stored else None
    if stored:
        with target.lock(key):
            target.put(key, Path(src), {"engine_ready_s": round(waited, 3)})
    summary = {"key": key.digest, "store": url, "stored": stored, "policy": policy,
               "engine_ready_s": round(waited, 3), "store_s": round(time.monotonic() - started, 3),
               "neff_checked": graphs is not None}
    log.info("artifacts store: %s", json.dumps(summary))
    return summary


__all__ = ["HandoffError", "READY_POLL_S", "check_graphs", "fetch", "key_from_env", "store", "wait_ready"]
