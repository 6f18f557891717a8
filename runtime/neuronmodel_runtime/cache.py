"""The compile-artifact cache: compiled artifacts as content-addressed entries of a shared store.

- `cache_key(inputs)`: the sha256 of the canonical JSON of everything that changes the compiled graphs.
- `open_store(url)`: a filesystem path (a PVC mount; `file://` too) or `s3://bucket/prefix` (see cache_s3).
- An entry is `<url>/<digest>/<files...>` and `<url>/<digest>/manifest.json` (the key's inputs, each file's path, size
  and sha256, timings), written LAST: files without a manifest are never a hit, a file whose size or sha256 differs
  from the manifest makes the entry a miss (with a warning), never a crash.
- `ArtifactStore.lock(key)`: one compile per key at a time, `<url>/<digest>.lock` with an expiry, so a crashed
  compiler blocks the others for at most its ttl (the holder never refreshes it: the ttl must exceed the longest
  compile, DEFAULT_LOCK_TTL_S is 4 hours).
- `prepare(store, key, local, policy, compile)`: the serve / compile flow, by `compile_cache.policy`.

A local folder (what a runner loads) is complete when it holds LOCAL_MARKER naming the key, written last: `fetch` and
the compile of `prepare` build the folder beside it (`<local>.partial-<pid>-<token>`) and rename it into place, so a
crash never leaves a half folder that looks complete. When `local` is itself a mount point (it cannot be renamed),
the folder is built inside it and its files moved into place, the marker last.

Nothing here imports torch; boto3 only for an s3:// store.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import socket
import stat
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
#: In a local artifacts folder: which key it holds and its files' sizes, written last (a folder without it is partial).
LOCAL_MARKER = ".neuronmodel-cache.json"
POLICIES = ("IfNotCached", "Always", "Never")
#: A compile lock's default lifetime: longer than a compile should ever take (Neuron compiles take minutes to hours).
DEFAULT_LOCK_TTL_S = 4 * 3600.0
DEFAULT_POLL_S = 5.0
_CHUNK = 1 << 20


class CacheError(Exception):
    """The cache cannot work as configured (one line naming the store and the fix)."""


class CacheMiss(CacheError):
    """Policy Never and no complete entry for the key."""


class CacheLockTimeout(CacheError):
    """Waited `wait_s` for another compile of the same key to finish."""

    def __init__(self, message: str, key: str, holder: str) -> None:
        super().__init__(message)
        self.key, self.holder = key, holder


# --- keys and manifests ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CacheKey:
    """`digest`: sha256 hex of the canonical JSON of `inputs` (kept in canonical form: tuples as lists)."""

    digest: str
    inputs: Mapping[str, Any] = field(compare=False, repr=False)


def _check_json(value: Any, where: str) -> None:
    if isinstance(value, Mapping):
        for name, item in value.items():
            if not isinstance(name, str):
                raise ValueError(f"cache key input {where}: key {name!r} must be a string")
            _check_json(item, f"{where}.{name}" if where else name)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cache key input {where}: {value} is not a finite number (JSON has no NaN/Infinity)")
    elif not (value is None or isinstance(value, (str, int))):
        raise ValueError(f"cache key input {where}: a {type(value).__name__} is not JSON data (use str, int, float, "
                         "bool, None, lists and string-keyed mappings)")


def canonical_json(inputs: Mapping[str, Any]) -> str:
    """Sorted keys, compact separators, ASCII only, tuples as lists; NaN/Infinity and non-JSON values refused."""
    if not isinstance(inputs, Mapping):
        raise ValueError(f"cache key inputs must be a mapping, not {type(inputs).__name__}")
    _check_json(inputs, "")
    return json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def cache_key(inputs: Mapping[str, Any]) -> CacheKey:
    """The key of `inputs` (pure: dict order never changes it, any value change does)."""
    text = canonical_json(inputs)
    return CacheKey(hashlib.sha256(text.encode("ascii")).hexdigest(), json.loads(text))


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
        bad = [p for p in paths if not _is_relative(p) or p == MANIFEST]
        if bad or len(set(paths)) != len(paths):
            raise ValueError(f"bad or repeated file paths {bad or paths}")
        return manifest


def _is_relative(path: str) -> bool:
    return not path.startswith("/") and all(part not in ("", ".", "..") for part in path.split("/"))


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _owner() -> str:
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


def _sha256(path: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def scan_files(src: Path) -> list[tuple[str, Path]]:
    """Every regular file under `src` as (relative path, path), sorted; a symlink counts when it resolves to a file
    inside `src`. Skipped (with a warning): sockets, pipes, devices, symlinks leading out of `src`, and LOCAL_MARKER."""
    root, found = src.resolve(), []
    for folder, dirs, names in os.walk(src):
        for name in sorted(dirs):
            if os.path.islink(os.path.join(folder, name)):
                log.warning("%s: the symlinked folder %s is not stored", src, os.path.join(folder, name))
        for name in names:
            path = Path(folder) / name
            rel = path.relative_to(src).as_posix()
            if rel == LOCAL_MARKER:
                continue
            if path.is_symlink():
                target = path.resolve()
                if not (target.is_relative_to(root) and target.is_file()):
                    log.warning("%s: %s links outside the folder (or to no file); not stored", src, rel)
                    continue
            elif not stat.S_ISREG(path.lstat().st_mode):
                log.warning("%s: %s is not a regular file (socket, pipe or device); not stored", src, rel)
                continue
            found.append((rel, path))
    return sorted(found)


# --- local folders ---------------------------------------------------------------------------------------------------

def is_prepared(local: Path, key: CacheKey) -> bool:
    """`local` holds a complete copy of `key`'s artifacts: its marker names the key and every file has its size."""
    try:
        marker = json.loads((Path(local) / LOCAL_MARKER).read_text())
        if marker["key"] != key.digest:
            return False
        return all((Path(local) / path).stat().st_size == size for path, size in marker["files"])
    except (OSError, ValueError, TypeError, KeyError):
        return False


def _write_marker(folder: Path, key: CacheKey, origin: str) -> None:
    files = [[rel, path.stat().st_size] for rel, path in scan_files(folder)]
    record = {"key": key.digest, "inputs": key.inputs, "origin": origin, "created": _now_iso(), "files": files}
    (folder / LOCAL_MARKER).write_text(json.dumps(record, sort_keys=True))


def _staging(dest: Path) -> Path:
    """A fresh folder to build `dest` in: beside it, or inside it when `dest` is a mount point."""
    token = f"partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging = dest / f".{token}" if os.path.ismount(dest) else dest.with_name(f"{dest.name}.{token}")
    staging.mkdir(parents=True)
    return staging


def _install(staging: Path, dest: Path) -> None:
    """Put the complete folder `staging` (its marker included) in place of `dest`."""
    if staging.parent != dest:
        old = dest.with_name(f"{dest.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        if os.path.lexists(dest):
            os.rename(dest, old)
        os.rename(staging, dest)
        shutil.rmtree(old, ignore_errors=True)
        return
    (dest / LOCAL_MARKER).unlink(missing_ok=True)  # a mount point: the old content stops being complete first
    for child in dest.iterdir():
        if child == staging or child.name == "lost+found":  # a volume's own, not ours to remove
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    for child in staging.iterdir():
        if child.name != LOCAL_MARKER:
            os.rename(child, dest / child.name)
    os.rename(staging / LOCAL_MARKER, dest / LOCAL_MARKER)
    staging.rmdir()


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
    expires: float  # epoch seconds
    broke: Optional[str] = None  # the expired holder it replaced


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

    @abc.abstractmethod
    def lock(self, key: CacheKey, ttl_s: float = DEFAULT_LOCK_TTL_S, wait_s: Optional[float] = None,
             poll_s: float = DEFAULT_POLL_S) -> contextlib.AbstractContextManager[Lease]:
        """Single flight per key: held by one caller at a time, across processes and hosts. A lock whose expiry
        (ttl_s after it was taken) passed is broken and retaken. Waits at most `wait_s` (default: ttl_s), then raises
        CacheLockTimeout naming the key and the holder."""

    def lookup(self, key: CacheKey) -> Optional[Manifest]:
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

    def fetch(self, key: CacheKey, dest: Path) -> bool:
        """Download the entry into `dest` (replacing it), each file checked against the manifest's size and sha256.
        False (a miss; a WARNING names the file) when there is no complete entry or a file is missing or differs."""
        manifest, dest = self.lookup(key), Path(dest)
        if manifest is None:
            return False
        staging = _staging(dest)
        try:
            def get(entry: FileEntry) -> Optional[str]:
                target = staging / entry.path
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
            _write_marker(staging, key, "store")
            _install(staging, dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        log.info("%s: fetched entry %s (%d files, %d bytes) into %s", self.url, key.digest, len(manifest.files),
                 manifest.total_bytes, dest)
        return True

    def put(self, key: CacheKey, src: Path, timings: Mapping[str, float]) -> Manifest:
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
        _parallel(lambda item: self._upload(item[1], f"{key.digest}/{item[0]}"), files, self.workers)
        kept = {e.path for e in entries} | {MANIFEST}
        for stale in self._list(key.digest):
            if stale not in kept:
                self._delete(f"{key.digest}/{stale}")
        manifest = Manifest(key.digest, key.inputs, entries, dict(timings), _now_iso(),
                            f"{socket.gethostname()}/{os.getpid()}")
        self._write(f"{key.digest}/{MANIFEST}", manifest.to_json())
        log.info("%s: stored entry %s (%d files, %d bytes)", self.url, key.digest, len(entries), manifest.total_bytes)
        return manifest


class FileStore(ArtifactStore):
    """A folder (a PVC shared by the pods). Files are written under a temporary name and renamed; the lock is an
    exclusive create (O_CREAT|O_EXCL) of `<root>/<digest>.lock` holding its owner and expiry."""

    def __init__(self, root: Path, url: Optional[str] = None) -> None:
        self.root, self.url = Path(root).absolute(), url or str(root)

    def _path(self, name: str) -> Path:
        return self.root / name

    def _read(self, name: str) -> Optional[bytes]:
        try:
            return self._path(name).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def _replace_with(self, name: str, fill: Callable[[Any], None]) -> None:
        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            with tmp.open("wb") as out:
                fill(out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def _write(self, name: str, data: bytes) -> None:
        self._replace_with(name, lambda out: out.write(data))

    def _upload(self, path: Path, name: str) -> None:
        def copy(out: Any) -> None:
            with path.open("rb") as f:
                shutil.copyfileobj(f, out, _CHUNK)
        self._replace_with(name, copy)

    def _download(self, name: str, path: Path) -> bool:
        try:
            shutil.copyfile(self._path(name), path)
            return True
        except (FileNotFoundError, NotADirectoryError):
            return False

    def _delete(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)

    def _list(self, folder: str) -> list[str]:
        base = self._path(folder)
        return [p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file() or p.is_symlink()]

    @contextlib.contextmanager
    def lock(self, key: CacheKey, ttl_s: float = DEFAULT_LOCK_TTL_S, wait_s: Optional[float] = None,
             poll_s: float = DEFAULT_POLL_S) -> Iterator[Lease]:
        path, owner = self._path(f"{key.digest}.lock"), _owner()
        deadline, broke = time.monotonic() + (ttl_s if wait_s is None else wait_s), None
        self.root.mkdir(parents=True, exist_ok=True)
        while True:
            lease = Lease(key.digest, owner, time.time() + ttl_s, broke)
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "w") as f:
                    json.dump({"owner": owner, "expires": lease.expires, "created": _now_iso()}, f)
                    f.flush()
                    os.fsync(f.fileno())
                break
            holder, expired = self._holder(path)
            if holder == "nobody":
                continue  # released meanwhile: try again at once
            if expired and self._break(path, holder):
                broke = holder
                continue
            if time.monotonic() >= deadline:
                raise CacheLockTimeout(f"{self.url}: waited {ttl_s if wait_s is None else wait_s:.0f} s for the "
                                       f"compile lock of key {key.digest}, held by {holder}; if no compile is "
                                       f"running, remove {path}", key.digest, holder)
            time.sleep(poll_s)
        try:
            yield lease
        finally:
            current, _ = self._holder(path)
            if current.startswith(owner):
                path.unlink(missing_ok=True)
            else:
                log.warning("%s: the compile lock of key %s was taken over (now %s) before its holder %s released "
                            "it; its ttl was too short", self.url, key.digest, current, owner)

    @staticmethod
    def _holder(path: Path) -> tuple[str, bool]:
        """(who holds the lock at `path`, whether its expiry passed); an unreadable lock expires 60 s after it was
        written (its owner died while writing it)."""
        try:
            info = json.loads(path.read_text())
            expires = float(info["expires"])
            return f"{info['owner']} (expires {datetime.fromtimestamp(expires, timezone.utc).isoformat()})", \
                time.time() > expires
        except FileNotFoundError:
            return "nobody", False
        except (OSError, ValueError, TypeError, KeyError):
            try:
                return "an unreadable lock file", time.time() > path.stat().st_mtime + 60
            except FileNotFoundError:
                return "nobody", False

    def _break(self, path: Path, seen: str) -> bool:
        """Remove the expired lock `seen`, unless another breaker is at it or it changed meanwhile."""
        guard = path.with_name(path.name + ".break")
        try:
            os.close(os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            with contextlib.suppress(FileNotFoundError):
                if time.time() > guard.stat().st_mtime + 60:  # a breaker died while breaking
                    guard.unlink()
            return False
        try:
            holder, expired = self._holder(path)
            if holder != seen or not expired:
                return False
            path.unlink(missing_ok=True)
            log.warning("%s: broke the expired compile lock %s held by %s", self.url, path.name, seen)
            return True
        finally:
            guard.unlink(missing_ok=True)


def open_store(url: str) -> ArtifactStore:
    """The store at `url`: a filesystem path (a PVC mount), file:///PATH, or s3://BUCKET[/PREFIX] (boto3: credentials,
    AWS_ENDPOINT_URL and the region from the environment; region default us-east-1)."""
    forms = "a filesystem path (a PVC mount), file:///PATH or s3://BUCKET[/PREFIX]"
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"compile_cache.url must be {forms}, not {url!r}")
    if url.startswith("s3://"):
        from neuronmodel_runtime.cache_s3 import S3Store

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
    """What `prepare` did. source: "local" (already in the folder), "store" (fetched) or "compiled"."""

    key: str
    hit: bool
    compiled: bool
    source: str
    fetch_s: float = 0.0
    compile_s: float = 0.0
    store_s: float = 0.0
    lock_wait_s: float = 0.0


def _compile_into(local: Path, key: CacheKey, compile: Callable[[Path], None]) -> float:
    staging = _staging(local)
    try:
        start = time.monotonic()
        compile(staging)
        took = time.monotonic() - start
        _write_marker(staging, key, "compiled")
        _install(staging, local)
        return took
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def prepare(store: Optional[ArtifactStore], key: CacheKey, local: Path, policy: str,
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
        log.info("compiled artifacts of key %s already in %s", key.digest, local)
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
                log.info("key %s was compiled by another while this one waited %.1f s", key.digest, waited)
                return Outcome(key.digest, True, False, "store", fetch_s=fetch_s, lock_wait_s=waited)
        compile_s = _compile_into(local, key, compile)
        start = time.monotonic()
        store.put(key, local, {"compile_s": compile_s})
        store_s = time.monotonic() - start
    return Outcome(key.digest, False, True, "compiled", fetch_s, compile_s, store_s, waited)
