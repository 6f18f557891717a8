"""The artifact store on a folder (`FileStore`): a PVC shared by the pods, or any local path.

Files are written under a temporary name, fsynced and renamed; the compile lease is an exclusive create
(O_CREAT|O_EXCL) of `<root>/<digest>.lock`, changed under a guard file so that a replace or delete reads what it
changes (store.py has the lease's rules)."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from neuronmodel_runtime.artifacts.store import (CHUNK_BYTES, UNREADABLE_LOCK_TTL_S, ArtifactStore, LockState,
                                                 lease_fields)


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
                shutil.copyfileobj(f, out, CHUNK_BYTES)
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

    def _lock_read(self, name: str) -> Optional[LockState]:
        path = self._path(name)
        try:
            body, modified = path.read_bytes(), path.stat().st_mtime
        except FileNotFoundError:
            return None
        return LockState(*lease_fields(body), modified, body)

    def _lock_create(self, name: str, body: bytes) -> Optional[Any]:
        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return None
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        return body

    @contextlib.contextmanager
    def _guard(self, name: str) -> Iterator[bool]:
        """Whether this caller may change the lock object now: one changer at a time, by the exclusive create of
        `<name>.guard`, waited for up to 5 s (a guard older than UNREADABLE_LOCK_TTL_S is a dead changer's and is
        removed)."""
        guard, deadline = self._path(name + ".guard"), time.monotonic() + 5.0
        while True:
            try:
                os.close(os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                break
            except FileExistsError:
                with contextlib.suppress(FileNotFoundError):
                    if time.time() > guard.stat().st_mtime + UNREADABLE_LOCK_TTL_S:
                        guard.unlink()
                if time.monotonic() > deadline:
                    yield False
                    return
                time.sleep(0.01)
        try:
            yield True
        finally:
            guard.unlink(missing_ok=True)

    def _lock_replace(self, name: str, seen: LockState, body: bytes) -> Optional[Any]:
        with self._guard(name) as mine:
            now = self._lock_read(name)
            if not mine or now is None or now.token != seen.token:
                return None
            self._write(name, body)
            return body

    def _lock_delete(self, name: str, token: Any) -> bool:
        with self._guard(name) as mine:
            now = self._lock_read(name)
            if now is None:
                return True
            if not mine or now.token != token:
                return False
            self._path(name).unlink(missing_ok=True)
            return True

    def _lock_where(self, name: str) -> str:
        return str(self._path(name))
