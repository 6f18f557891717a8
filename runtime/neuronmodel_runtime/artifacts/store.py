"""The store of compiled artifacts: content-addressed entries, each with its manifest written last; the compile lease.

- An entry is `<url>/<digest>/<files...>` and `<url>/<digest>/manifest.json` (the artifact key's inputs, each file's
  path, size and sha256, timings), written LAST: files without a manifest are never a hit, a file whose size or
  sha256 differs from the manifest makes the entry a miss (with a warning), never a crash. `fetch` downloads an entry
  into a local folder through folder.py (complete or absent); `put` stores a folder.
- `ArtifactStore.lock(key)`: one compile per key at a time, a lease `<url>/<digest>.lock` naming its holder and its
  expiry. The holder renews it every ttl/3 while it compiles (for hours if need be), so a compiler that crashed,
  was killed (OOM) or froze blocks the others for at most one ttl (DEFAULT_LOCK_TTL_S, 10 minutes); an expired lease
  is taken over with a conditional overwrite, and a holder that finds its lease taken over says so and never
  deletes the new one. The stores provide four primitives (create, read, replace-if-unchanged, delete-if-ours).
- FileStore (file_store.py): a folder (a PVC shared by the pods); S3Store (s3.py): a bucket; both build on the ABC.

Nothing here imports torch or boto3.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from neuronmodel_runtime.artifacts.folder import (ARTIFACTS_MARKER, install, no_space_as, scan_files, staging,
                                                  stays_inside)
from neuronmodel_runtime.artifacts.key import ArtifactKey, write_marker

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
#: A compile lease's lifetime without a renewal: how long a crashed compiler blocks the others (renewed every ttl/3).
DEFAULT_LOCK_TTL_S = 600.0
#: How long a pod waits for another's compile of the same key: Neuron compiles take minutes to hours.
DEFAULT_LOCK_WAIT_S = 6 * 3600.0
#: A lock object that cannot be read (its writer died while writing it) expires this long after it was written.
UNREADABLE_LOCK_TTL_S = 60.0
DEFAULT_POLL_S = 5.0
CHUNK_BYTES = 1 << 20


class CacheError(Exception):
    """The cache cannot work as configured (one line naming the store and the fix)."""


class CacheLockTimeout(CacheError):
    """Waited `wait_s` for another compile of the same key to finish."""

    def __init__(self, message: str, key: str, holder: str) -> None:
        super().__init__(message)
        self.key, self.holder = key, holder


# --- manifests --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FileEntry:
    path: str  # relative, "/"-separated
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    key: str
    inputs: Mapping[str, Any] = field(repr=False)
    files: tuple[FileEntry, ...]
    timings: Mapping[str, float]
    created: str
    writer: str

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> bytes:
        data = {"key": self.key, "inputs": self.inputs, "timings": dict(self.timings), "created": self.created,
                "writer": self.writer, "files": [{"path": f.path, "size": f.size, "sha256": f.sha256}
                                                 for f in self.files]}
        return json.dumps(data, sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "Manifest":
        """Raises ValueError for anything but a well-formed manifest (file paths that stay inside the entry)."""
        try:
            raw = json.loads(data)
            files = tuple(FileEntry(str(f["path"]), int(f["size"]), str(f["sha256"])) for f in raw["files"])
            manifest = cls(str(raw["key"]), dict(raw["inputs"]), files,
                           {str(k): float(v) for k, v in raw.get("timings", {}).items()},
                           str(raw.get("created", "")), str(raw.get("writer", "")))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"not a manifest ({type(exc).__name__}: {exc})") from exc
        paths = [f.path for f in files]
        bad = [p for p in paths if not stays_inside(p) or p == MANIFEST]
        if bad or len(set(paths)) != len(paths):
            raise ValueError(f"bad or repeated file paths {bad or paths}")
        return manifest


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _owner() -> str:
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


def _sha256(path: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(CHUNK_BYTES), b""):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _parallel(work: Callable[[Any], Any], items: Sequence[Any], workers: int) -> list[Any]:
    if workers <= 1 or len(items) <= 1:
        return [work(item) for item in items]
    with ThreadPoolExecutor(min(workers, len(items))) as pool:
        return list(pool.map(work, items))


# --- stores ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Lease:
    """A held compile lock."""

    key: str
    owner: str
    expires: float  # epoch seconds, as first taken (renewed while held)
    broke: Optional[str] = None  # the expired holder it replaced


@dataclass(frozen=True)
class LockState:
    """A lock object as read from a store."""

    owner: Optional[str]  # None: unreadable
    expires: Optional[float]  # epoch seconds; None: unreadable
    modified: float  # epoch seconds of its last write
    token: Any  # what a conditional replace or delete of exactly this object needs (an ETag, the file's bytes)

    @property
    def holder(self) -> str:
        if self.owner is None or self.expires is None:
            return "an unreadable lock"
        expires = datetime.fromtimestamp(self.expires, timezone.utc).isoformat(timespec="seconds")
        return f"{self.owner} (expires {expires})"

    def expired(self) -> bool:
        return time.time() > (self.modified + UNREADABLE_LOCK_TTL_S if self.expires is None else self.expires)


def lease_body(owner: str, expires: float) -> bytes:
    return json.dumps({"owner": owner, "expires": expires, "created": _now_iso()}).encode()


def lease_fields(body: bytes) -> tuple[Optional[str], Optional[float]]:
    """(owner, expires) of a lock object's body; (None, None) when it is not one."""
    try:
        info = json.loads(body)
        return str(info["owner"]), float(info["expires"])
    except (ValueError, TypeError, KeyError):
        return None, None


class _Renewal:
    """Renews a held lease every ttl/3 in a daemon thread until stopped; a store error is retried at the next tick,
    a lease found taken over (it lapsed: the process was frozen or the store unreachable for a whole ttl) is
    logged and given up."""

    def __init__(self, store: "ArtifactStore", name: str, owner: str, token: Any, ttl_s: float) -> None:
        self.store, self.name, self.owner, self.token, self.ttl_s = store, name, owner, token, ttl_s
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{name[:12]}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                seen = self.store._lock_read(self.name)
                token = None
                if seen is not None and seen.owner == self.owner:
                    token = self.store._lock_replace(self.name, seen, lease_body(self.owner, time.time() + self.ttl_s))
            except CacheError as exc:
                log.warning("%s: could not renew the compile lease %s (%s); retrying in %.0f s", self.store.url,
                            self.name, exc, self.ttl_s / 3)
                continue
            if token is None:
                self.lost = True
                log.warning("%s: the compile lease %s of %s lapsed and was taken over (now %s); another compile of "
                            "this key may run", self.store.url, self.name, self.owner,
                            seen.holder if seen else "nobody")
                return
            self.token = token

    def stop(self) -> Any:
        """The lease's current token, once no renewal is under way."""
        self._stop.set()
        self._thread.join()
        return self.token


class ArtifactStore(abc.ABC):
    """Entries `<url>/<digest>/...` with their manifest written last. Subclasses provide the object primitives (names
    are "/"-separated, relative to the store's root) and `lock`."""

    url: str
    workers: int = 4  # files transferred at once

    @abc.abstractmethod
    def _read(self, name: str) -> Optional[bytes]: """The object's bytes; None when there is none."""

    @abc.abstractmethod
    def _write(self, name: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def _upload(self, path: Path, name: str) -> None: ...

    @abc.abstractmethod
    def _download(self, name: str, path: Path) -> bool: """False when there is no such object."""

    @abc.abstractmethod
    def _delete(self, name: str) -> None: """No error when there is none."""

    @abc.abstractmethod
    def _list(self, folder: str) -> list[str]: """Names under `folder`/, relative to it."""

    # The lock's primitives: one object `name` ("<digest>.lock") holding lease_body(owner, expires).

    @abc.abstractmethod
    def _lock_create(self, name: str, body: bytes) -> Optional[Any]:
        """Create the lock object if there is none, and check it is this body; its token, or None (someone holds it)."""

    @abc.abstractmethod
    def _lock_read(self, name: str) -> Optional[LockState]: """None when there is no lock object."""

    @abc.abstractmethod
    def _lock_replace(self, name: str, seen: LockState, body: bytes) -> Optional[Any]:
        """Overwrite the lock object with `body` if it is still `seen` (a take-over, a renewal); its new token, or
        None (it changed or went meanwhile)."""

    @abc.abstractmethod
    def _lock_delete(self, name: str, token: Any) -> bool:
        """Delete the lock object if it is still `token`'s; False when it was taken over (nothing deleted)."""

    @abc.abstractmethod
    def _lock_where(self, name: str) -> str: """What to delete by hand to free a stuck lock."""

    @contextlib.contextmanager
    def lock(self, key: ArtifactKey, ttl_s: float = DEFAULT_LOCK_TTL_S, wait_s: Optional[float] = None,
             poll_s: float = DEFAULT_POLL_S) -> Iterator[Lease]:
        """Single flight per key: held by one caller at a time, across processes and hosts, renewed every ttl_s/3
        while held. A lease whose expiry passed (its holder stopped renewing it) is taken over. Waits at most
        `wait_s` (default DEFAULT_LOCK_WAIT_S) for a live holder, then raises CacheLockTimeout naming the key and
        the holder."""
        name, owner = f"{key.digest}.lock", _owner()
        wait_s = DEFAULT_LOCK_WAIT_S if wait_s is None else wait_s
        deadline, broke = time.monotonic() + wait_s, None
        while True:
            expires = time.time() + ttl_s
            token = self._lock_create(name, lease_body(owner, expires))
            if token is not None:
                break
            seen = self._lock_read(name)
            if seen is None:
                continue  # released meanwhile: try again at once
            if seen.expired():
                token = self._lock_replace(name, seen, lease_body(owner, expires))
                if token is not None:
                    broke = seen.holder
                    log.warning("%s: took over the expired compile lock %s held by %s", self.url, name, broke)
                    break
                continue
            if time.monotonic() >= deadline:
                raise CacheLockTimeout(f"{self.url}: waited {wait_s:.0f} s for the compile lock of artifact key "
                                       f"{key.digest}, held by {seen.holder}; if no compile is running, delete "
                                       f"{self._lock_where(name)}", key.digest, seen.holder)
            time.sleep(poll_s)
        renewal = _Renewal(self, name, owner, token, ttl_s)
        try:
            yield Lease(key.digest, owner, expires, broke)
        finally:
            token = renewal.stop()
            if not renewal.lost and not self._lock_delete(name, token):
                log.warning("%s: the compile lock %s of %s was taken over before its holder released it", self.url,
                            name, owner)

    def lookup(self, key: ArtifactKey) -> Optional[Manifest]:
        """The entry's manifest if it is complete (present, parseable, its key the digest), else None."""
        data = self._read(f"{key.digest}/{MANIFEST}")
        if data is None:
            return None
        try:
            manifest = Manifest.from_json(data)
        except ValueError as exc:
            log.warning("%s: the manifest of entry %s is unreadable (%s); a miss", self.url, key.digest, exc)
            return None
        if manifest.key != key.digest:
            log.warning("%s: the manifest of entry %s names key %s; a miss", self.url, key.digest, manifest.key)
            return None
        return manifest

    def unfinished(self, key: ArtifactKey) -> list[str]:
        """The files of the key's entry when it has no manifest: what a `put` that never finished left (its writer
        died, or the store ran out of space and could not remove them); empty when there is a manifest."""
        if self._read(f"{key.digest}/{MANIFEST}") is not None:
            return []
        return self._list(key.digest)

    def fetch(self, key: ArtifactKey, dest: Path) -> bool:
        """Download the entry into `dest` (replacing it), each file checked against the manifest's size and sha256.
        False (a miss; a WARNING names the file) when there is no complete entry or a file is missing or differs."""
        manifest, dest = self.lookup(key), Path(dest)
        if manifest is None:
            return False
        with no_space_as(CacheError, dest, f"{self.url}: fetching entry {key.digest}: ",
                         " (nothing was installed; the next start fetches it again)"):
            return self._fetch_into(key, manifest, dest)

    def _fetch_into(self, key: ArtifactKey, manifest: Manifest, dest: Path) -> bool:
        with staging(dest) as building:
            def get(entry: FileEntry) -> Optional[str]:
                target = building / entry.path
                target.parent.mkdir(parents=True, exist_ok=True)
                if not self._download(f"{key.digest}/{entry.path}", target):
                    return f"{entry.path} is missing"
                size, sha = _sha256(target)
                if size != entry.size:
                    return f"{entry.path} has {size} bytes where the manifest says {entry.size}"
                if sha != entry.sha256:
                    return f"{entry.path} has sha256 {sha} where the manifest says {entry.sha256}"
                return None

            problems = [p for p in _parallel(get, manifest.files, self.workers) if p]
            if problems:
                log.warning("%s: entry %s is corrupt (%s); a miss", self.url, key.digest, "; ".join(problems))
                return False
            write_marker(building, key, "store")
            install(building, dest, ARTIFACTS_MARKER)
        log.info("%s: fetched entry %s (%d files, %d bytes) into %s", self.url, key.digest, len(manifest.files),
                 manifest.total_bytes, dest)
        return True

    def put(self, key: ArtifactKey, src: Path, timings: Mapping[str, float]) -> Manifest:
        """Store every file under `src` as `key`'s entry (replacing one that is there), the manifest last."""
        if not Path(src).is_dir():
            raise CacheError(f"{self.url}: cannot store {src}: not a folder")
        files = scan_files(Path(src))
        if not files:
            raise CacheError(f"{self.url}: {src} holds no files to store as entry {key.digest} (did the compile write "
                             "its artifacts into the folder it was given?)")
        if any(rel == MANIFEST for rel, _ in files):
            raise CacheError(f"{src}: a top-level file named {MANIFEST} cannot be stored (the entry's manifest has "
                             "that name)")
        entries = tuple(FileEntry(rel, *_sha256(path)) for rel, path in files)
        self._delete(f"{key.digest}/{MANIFEST}")  # an entry being replaced stops being a hit first
        manifest = Manifest(key.digest, key.inputs, entries, dict(timings), _now_iso(),
                            f"{socket.gethostname()}/{os.getpid()}")
        with no_space_as(CacheError, self.url, f"{self.url}: storing entry {key.digest}: ",
                         " (the partial entry was removed)"):
            try:
                _parallel(lambda item: self._upload(item[1], f"{key.digest}/{item[0]}"), files, self.workers)
                kept = {e.path for e in entries} | {MANIFEST}
                for stale in self._list(key.digest):
                    if stale not in kept:
                        self._delete(f"{key.digest}/{stale}")
                self._write(f"{key.digest}/{MANIFEST}", manifest.to_json())
            except Exception:
                self._discard(key.digest)
                raise
        log.info("%s: stored entry %s (%d files, %d bytes)", self.url, key.digest, len(entries), manifest.total_bytes)
        return manifest

    def _discard(self, digest: str) -> None:
        """Remove what a failed `put` wrote of the entry (never a hit without its manifest; this gives the space
        back), as far as the store lets it."""
        with contextlib.suppress(CacheError, OSError):
            for name in self._list(digest):
                self._delete(f"{digest}/{name}")

