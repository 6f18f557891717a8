"""`neuronmodel-runtime fetch`: download an hf:// or s3:// model source into a folder, atomically.

The operator's init container runs `neuronmodel-runtime fetch SOURCE DEST [--revision REV]`; the serving container
then reads DEST as its model folder. So that a pod never serves a half-downloaded model, and a restarted pod does not
download it again:

- Files go into a staging folder beside DEST, `DEST.partial/` (the same filesystem, so the final rename is atomic:
  mount the volume at DEST's parent, e.g. `/models`, and fetch into `/models/model`).
- Each file is written under a temporary name and renamed when complete and verified (its size; for S3 also its MD5
  when the ETag is one). `DEST.partial/.neuronmodel-fetch.progress.json` records the completed files, so a re-run
  after an interruption downloads only the rest; an S3 object resumes from its partial bytes (a ranged GET).
- When every file is there, the marker `.neuronmodel-fetch.json` (source, revision, commit, files with sizes) is
  written, and the staging folder is renamed onto DEST, replacing what was there.
- A DEST whose marker names the same source and revision, with every file at its size, is "already fetched": no
  request is made. A DEST without one is never taken as complete.
- `DEST.lock` serialises fetches into one DEST (pods sharing a ReadWriteMany volume).

The source grammar (`parse_source`, ModelSource) is config/sources.py's, shared with the operator.

The marker, the install by rename and the lock are artifacts/folder.py's (complete-or-absent folders, one
implementation for model folders and compiled artifacts); the resumable staging folder and its record are fetch's.

What is downloaded: from an S3 prefix, every object under it (relative paths kept); from a Hub repository, the
top-level files serving needs (see remotes.select_hf_files). Credentials come from the environment: HF_TOKEN (and HF_ENDPOINT
for a mirror) for the Hub, read by huggingface_hub; the default AWS credential chain (IRSA, EKS Pod Identity,
AWS_ACCESS_KEY_ID, ...) and AWS_ENDPOINT_URL for S3, read by boto3. Neither package is imported until used.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable, Iterator, Optional

from neuronmodel_runtime.artifacts.folder import (FETCH_MARKER, has_files, install, locked, no_space_as, read_json,
                                                  sweep, write_json)
from neuronmodel_runtime.config.sources import ModelSource, SourceError, parse_source
from neuronmodel_runtime.remotes import PROGRESS, S3, FetchError, Hub, Remote, RemoteFile

log = logging.getLogger(__name__)

MARKER = FETCH_MARKER
DEFAULT_REVISION = "main"


# --- the fetch -------------------------------------------------------------------------------------------------------

def _sizes(files: dict) -> Iterator[tuple[str, int]]:
    """(path, size) of each file of a fetch record (`{path: {"size": ..., "etag": ...}}`)."""
    for name, entry in files.items():
        yield name, entry["size"]


def _is_fetched(dest: Path, url: str, revision: Optional[str]) -> bool:
    marker = read_json(dest / MARKER)
    return (marker is not None and marker.get("source") == url and marker.get("revision") == revision
            and has_files(dest, _sizes(marker.get("files") or {})))


class _Staging:
    """DEST.partial/ and its record of completed files (`PROGRESS`), shared by the download threads."""

    def __init__(self, folder: Path, url: str) -> None:
        self.folder, self.url, self._lock = folder, url, threading.Lock()
        record = read_json(folder / PROGRESS) or read_json(folder / MARKER)  # the marker: renamed away unfinished
        if record is None or record.get("source") != url:
            if folder.exists():
                log.info("removing %s (not a fetch of %s)", folder, url)
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
            record = {"source": url, "files": {}}
            write_json(folder / PROGRESS, record)  # from the start: partial bytes of a first file are resumed too
        self.files: dict = record.get("files") or {}

    def has(self, file: RemoteFile) -> bool:
        entry = self.files.get(file.path)
        return entry == {"size": file.size, "etag": file.etag} and has_files(self.folder, [(file.path, file.size)])

    def record(self, file: RemoteFile) -> None:
        with self._lock:
            self.files[file.path] = {"size": file.size, "etag": file.etag}
            write_json(self.folder / PROGRESS, {"source": self.url, "files": self.files})

    def keep_only(self, names: set[str]) -> None:
        """Remove everything but `names` (leftover parts, huggingface_hub's .cache/, files no longer listed)."""
        for root, dirs, files in os.walk(self.folder, topdown=False):
            for name in files:
                path = Path(root, name)
                if path.relative_to(self.folder).as_posix() not in names:
                    path.unlink()
            for name in dirs:
                with contextlib.suppress(OSError):  # not empty: it holds kept files
                    Path(root, name).rmdir()


class _Progress:
    """Log lines: one per file started and finished, one every `every_s` seconds while files are in flight (bytes in
    the staging folder, whichever remote writes them), and a summary."""

    def __init__(self, staging: Path, total: int, every_s: float) -> None:
        self.staging, self.total, self.every_s = staging, total, every_s
        self.in_flight, self._stop, self._lock = 0, threading.Event(), threading.Lock()
        self._thread = threading.Thread(target=self._report, name="fetch-progress", daemon=True)

    def __enter__(self) -> _Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _bytes_here(self) -> int:
        """Bytes of the files (complete or partial) under the staging folder, but fetch's own records."""
        total = 0
        for path in self.staging.rglob("*"):
            with contextlib.suppress(OSError):  # renamed or removed meanwhile (a temporary file completed)
                if path.is_file() and not path.name.startswith(".neuronmodel-fetch."):
                    total += path.stat().st_size
        return total

    def _report(self) -> None:
        before, then = self._bytes_here(), time.monotonic()
        while not self._stop.wait(self.every_s):
            now, here = time.monotonic(), self._bytes_here()
            if self.in_flight:
                log.info("progress: %d of %d bytes (%.0f%%), %.1f MB/s, %d files in flight", here, self.total,
                         100 * here / max(self.total, 1), (here - before) / 1e6 / (now - then), self.in_flight)
            before, then = here, now

    @contextlib.contextmanager
    def file(self, file: RemoteFile) -> Iterator[Callable[[int], None]]:
        """Log the start of `file`; the caller reports the bytes it transferred, logged with the time taken."""
        log.info("downloading %s (%d bytes)", file.path, file.size)
        with self._lock:
            self.in_flight += 1
        started = time.monotonic()

        def done(transferred: int) -> None:
            seconds = time.monotonic() - started
            log.info("downloaded %s: %d bytes in %.1f s (%.1f MB/s)", file.path, transferred, seconds,
                     transferred / 1e6 / max(seconds, 1e-6))

        try:
            yield done
        finally:
            with self._lock:
                self.in_flight -= 1


def _download(remote: Remote, files: list[RemoteFile], staging: _Staging, progress: _Progress, workers: int) -> int:
    """Download `files` in parallel and return the bytes transferred; on the first failure, stop starting (and, where
    the remote can, stop downloading) files, and raise it."""
    stop = threading.Event()

    def one(file: RemoteFile) -> int:
        (staging.folder / file.path).parent.mkdir(parents=True, exist_ok=True)
        with progress.file(file) as done:
            transferred = remote.download(file, staging.folder, stop)
            if stop.is_set():
                return transferred
            target = staging.folder / file.path
            size = target.stat().st_size if target.is_file() else None
            if size != file.size:
                raise FetchError(f"{file.path} arrived with {size} bytes where the source lists {file.size}: "
                                 "run fetch again")
            with target.open("rb") as f:
                os.fsync(f.fileno())
            staging.record(file)
            done(transferred)
            return transferred

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fetch") as pool:
        futures = [pool.submit(one, f) for f in sorted(files, key=lambda f: f.size)]  # config and tokenizer first
        wait(futures, return_when=FIRST_EXCEPTION)
        failed = [f.exception() for f in futures if f.done() and not f.cancelled() and f.exception()]
        if failed:
            stop.set()
            for future in futures:
                future.cancel()
            raise failed[0]
        return sum(f.result() for f in futures)


def _check_revision(source: ModelSource, revision: Optional[str]) -> Optional[str]:
    """The revision to fetch: DEFAULT_REVISION for the Hub; none for S3, which refuses any but the default."""
    if source.scheme == "hf":
        return revision or DEFAULT_REVISION
    if revision not in (None, DEFAULT_REVISION):
        raise FetchError(f"--revision {revision}: {source.url} has no revisions (only hf:// sources do); put each "
                         "version of a model under its own S3 prefix instead")
    return None


def fetch(source: str, dest: str | os.PathLike, revision: Optional[str] = None, *, workers: int = 8,
          progress_every_s: float = 15.0) -> dict:
    """Download `source` (hf:// or s3://) into the folder `dest`, atomically and resumably (see the module docstring).

    revision: a branch, tag or commit of an hf:// source (default "main"); an s3:// source has none.
    Returns the marker written into `dest` (or found there: "already fetched").

    Raises:
        FetchError: one line naming the source and the fix (a source that needs no fetch, no such repository or
            bucket, missing credentials, the network down after retries, ...).
    """
    try:
        parsed = parse_source(source)
    except SourceError as exc:
        raise FetchError(str(exc)) from None
    if not parsed.needs_fetch:
        raise FetchError(f"{parsed.url}: a {'PersistentVolumeClaim' if parsed.scheme == 'pvc' else 'local path'} "
                         "needs no fetch: the operator mounts it into the pod; fetch downloads hf:// and s3:// sources")
    revision = _check_revision(parsed, revision)
    dest = Path(dest).absolute()
    shown = parsed.url + (f" (revision {revision})" if revision else "")
    if _is_fetched(dest, parsed.url, revision):
        log.info("%s already fetched into %s", shown, dest)
        return read_json(dest / MARKER) or {}
    if os.path.ismount(dest):
        raise FetchError(f"{dest} is a mount point, which cannot be replaced atomically: mount the volume at its "
                         f"parent ({dest.parent}) and fetch into {dest}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with locked(dest.with_name(dest.name + ".lock")):
        if _is_fetched(dest, parsed.url, revision):  # by the fetch we waited for
            log.info("%s already fetched into %s", shown, dest)
            return read_json(dest / MARKER) or {}
        with no_space_as(FetchError, dest, f"{shown}: ", f", then run fetch again (the files it finished stay in "
                         f"{dest}.partial and are not downloaded again)"):
            return _fetch_locked(parsed, revision, dest, workers, progress_every_s, shown)


def _fetch_locked(source: ModelSource, revision: Optional[str], dest: Path, workers: int, progress_every_s: float,
                  shown: str) -> dict:
    started = time.monotonic()
    if dest.exists():
        log.info("%s holds no complete fetch of %s: fetching again; it is replaced when done", dest, shown)
    remote: Remote = Hub(source, revision) if source.scheme == "hf" else S3(source, workers)
    try:
        files = remote.list_files()
        log.info("fetching %s%s into %s: %d files, %d bytes", shown,
                 f" = commit {remote.commit}" if remote.commit else "", dest, len(files), sum(f.size for f in files))
        staging = _Staging(dest.with_name(dest.name + ".partial"), source.url)
        todo = [f for f in files if not staging.has(f)]
        if len(todo) < len(files):
            log.info("%d files already downloaded by an earlier run", len(files) - len(todo))
        with _Progress(staging.folder, sum(f.size for f in files), progress_every_s) as progress:
            transferred = _download(remote, todo, staging, progress, workers)
    except FetchError:
        raise
    except Exception as exc:
        error = remote.explain(exc)
        if error is None:
            raise
        raise error from exc
    seconds = time.monotonic() - started
    marker = {"source": source.url, "revision": revision, "commit": remote.commit, "seconds": round(seconds, 1),
              "files": {f.path: {"size": f.size, "etag": f.etag} for f in files}}
    write_json(staging.folder / MARKER, marker)  # last: the folder is complete
    (staging.folder / PROGRESS).unlink(missing_ok=True)
    staging.keep_only({f.path for f in files} | {MARKER})
    sweep(dest)  # what crashed fetches left beside DEST
    install(staging.folder, dest, MARKER)
    log.info("fetched %s into %s: %d files, %d bytes in %.1f s (%d files, %d bytes downloaded by this run: "
             "%.1f MB/s)", shown, dest, len(files), sum(f.size for f in files), seconds, len(todo), transferred,
             transferred / 1e6 / max(seconds, 1e-6))
    return marker
