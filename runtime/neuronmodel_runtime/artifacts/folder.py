"""Folders that are complete or absent: a reader never sees a half-built one, a crash never leaves one that looks whole.

One way to build such a folder, used by the compiled-artifacts folder (prepare, a store's fetch), `fetch`'s model
folders and the image scripts' caches:

1. build it beside its place: `staging(dest)` gives `<dest>.partial-<host>-<pid>-<token>` (the same filesystem, so
   the final rename is atomic); when `dest` is a mount point (it cannot be renamed), the folder is built inside it;
2. write its marker last (`write_json`; key.py's `write_marker` for compiled artifacts): a folder without its marker
   is never complete;
3. `install(staging, dest, marker)`: rename it into place, then remove what `dest` held (renamed aside first to
   `<dest>.old-<host>-<pid>-<token>`); into a mount point, the old content stops being complete first (its marker
   goes), then the files are moved in, the marker last.

Work folders a crashed process left (a killed compile can leave gigabytes) are removed by the next process on the
host that builds the same folder (`sweep`); those of live processes and of other hosts (a shared volume) are left
alone. `locked(path)` serialises builders of one folder across processes (an flock). Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import stat
import threading
import uuid
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

log = logging.getLogger(__name__)

#: In a local compiled-artifacts folder: which key it holds and its files' sizes, written last.
ARTIFACTS_MARKER = ".neuronmodel-cache.json"
#: In a fetched model folder: the source, revision, commit and files (`neuronmodel-runtime fetch`), written last.
FETCH_MARKER = ".neuronmodel-fetch.json"


# --- records ---------------------------------------------------------------------------------------------------------

def read_json(path: Path) -> Optional[dict[str, Any]]:
    """The JSON object in `path`; None when there is none (absent, unreadable, or not an object)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write `data` durably under its final name in one step (a temporary file, fsync, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def stays_inside(path: str) -> bool:
    """`path` is a relative POSIX path with no empty, `.` or `..` part: as a name under a folder, it cannot leave it
    (an absolute path starts with an empty part)."""
    return all(part not in ("", ".", "..") for part in path.split("/"))


def has_files(folder: Path, sizes: Iterable[tuple[str, int]]) -> bool:
    """Every (relative path, size) is a file in `folder` of that size; False for a malformed record too."""
    try:
        return all((Path(folder) / name).stat().st_size == size for name, size in sizes)
    except (OSError, AttributeError, KeyError, TypeError, ValueError):
        return False


def scan_files(src: Path) -> list[tuple[str, Path]]:
    """Every regular file under `src` as (relative path, path), sorted; a symlink counts when it resolves to a file
    inside `src`. Skipped (with a warning): sockets, pipes, devices, symlinks leading out of `src`; and
    ARTIFACTS_MARKER."""
    root, found = src.resolve(), []
    for folder, dirs, names in os.walk(src):
        for name in sorted(dirs):
            if os.path.islink(os.path.join(folder, name)):
                log.warning("%s: the symlinked folder %s is not stored", src, os.path.join(folder, name))
        for name in names:
            path = Path(folder) / name
            rel = path.relative_to(src).as_posix()
            if rel == ARTIFACTS_MARKER:
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


def _full_volume(exc: BaseException) -> Optional[OSError]:
    """The OSError of a full volume (ENOSPC) or a reached quota (EDQUOT) that `exc` is or was raised from, else None."""
    seen: Optional[BaseException] = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


@contextlib.contextmanager
def no_space_as(error: type[Exception], folder: str | Path, before: str, after: str) -> Iterator[None]:
    """A full volume met inside (raised, or the cause of what was raised) becomes one `error`: `before`, 'no space
    left ...' naming `folder` (a write's OSError names no file; a copy's names its source first, the file written
    second, shown when there is one) and the fix, then `after`. Any other error passes unchanged."""
    try:
        yield
    except Exception as exc:
        full = _full_volume(exc)
        if full is None:
            raise
        written = full.filename2 or full.filename
        where = f"{folder} ({written})" if written else str(folder)
        raise error(f"{before}no space left on device writing {where}: free space on that volume or make it "
                    f"larger{after}") from exc


# --- work folders ----------------------------------------------------------------------------------------------------

#: This process's staging folders in use (a sweep in this process must not remove them).
_in_flight: set[str] = set()
_in_flight_lock = threading.Lock()


def _work_name(dest: Path, kind: str) -> str:
    """`<dest>.<kind>-<host>-<pid>-<token>`: a staging ("partial") or replaced ("old") folder of `dest`, named so that
    a later process on the same host can tell whether its maker is still alive."""
    return f"{dest.name}.{kind}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _is_stale(name: str, prefix: str) -> bool:
    """A work folder `name` (under `prefix`, then "<kind>-<host>-<pid>-<token>") whose maker on this host is gone: its
    pid runs no process, or is this process and the folder is not one of its own in flight (a restarted container
    reuses pids). Folders of other hosts (a shared volume) are left alone."""
    rest = name[len(prefix):]
    kind, _, rest = rest.partition("-")
    host, pid, _ = (rest.rsplit("-", 2) + ["", ""])[:3]
    if kind not in ("partial", "old") or host != socket.gethostname() or not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        with _in_flight_lock:
            return name not in _in_flight
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # a live process of another user
    return False


def sweep(dest: Path) -> int:
    """Remove the work folders of `dest` left by crashed builders on this host (compiles, fetches); the number
    removed."""
    dest, removed = Path(dest), 0
    places = [(dest.parent, f"{dest.name}.")]
    if os.path.ismount(dest):
        places.append((dest, "."))
    for folder, prefix in places:
        with contextlib.suppress(FileNotFoundError):
            for child in folder.iterdir():
                if child.name.startswith(prefix) and child.is_dir() and not child.is_symlink() \
                        and _is_stale(child.name, prefix):
                    shutil.rmtree(child, ignore_errors=True)
                    removed += 1
    if removed:
        log.info("removed %d work folders of %s left by crashed compiles or fetches", removed, dest)
    return removed


@contextlib.contextmanager
def staging(dest: Path) -> Iterator[Path]:
    """A fresh folder to build `dest` in (beside it, or inside it when `dest` is a mount point), removed on exit
    unless it was installed; stale ones of dead processes are swept first."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    sweep(dest)
    name = _work_name(dest, "partial")
    folder = dest / f".{name[len(dest.name) + 1:]}" if os.path.ismount(dest) else dest.with_name(name)
    with _in_flight_lock:
        _in_flight.add(folder.name)
    try:
        folder.mkdir(parents=True)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        with _in_flight_lock:
            _in_flight.discard(folder.name)


def _remove(path: Path) -> None:
    """A folder (never followed through a symlink), a file or a link; nothing when there is none."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def install(staging: Path, dest: Path, marker: str) -> None:
    """Put the complete folder `staging` (its `marker` written) in place of `dest`; what `dest` held goes only once
    the new folder is in place."""
    if staging.parent != dest:
        old = dest.with_name(_work_name(dest, "old"))
        if os.path.lexists(dest):
            os.rename(dest, old)
        os.rename(staging, dest)
        _remove(old)
        return
    (dest / marker).unlink(missing_ok=True)  # a mount point: the old content stops being complete first
    for child in dest.iterdir():
        if child == staging or child.name == "lost+found":  # a volume's own, not ours to remove
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    for child in staging.iterdir():
        if child.name != marker:
            os.rename(child, dest / child.name)
    os.rename(staging / marker, dest / marker)
    staging.rmdir()


@contextlib.contextmanager
def locked(lock: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file `lock` (an flock): one builder of a folder at a time, across processes
    (pods sharing a volume)."""
    with lock.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process building the same folder (it holds %s)", lock)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


__all__ = ["ARTIFACTS_MARKER", "FETCH_MARKER", "has_files", "install", "locked", "no_space_as", "read_json",
           "scan_files", "staging", "stays_inside", "sweep", "write_json"]
