"""Model sources and `neuronmodel-runtime fetch`: download an hf:// or s3:// source into a folder, atomically.

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

What is downloaded: from an S3 prefix, every object under it (relative paths kept); from a Hub repository, the
top-level files serving needs (see select_hf_files). Credentials come from the environment: HF_TOKEN (and HF_ENDPOINT
for a mirror) for the Hub, read by huggingface_hub; the default AWS credential chain (IRSA, EKS Pod Identity,
AWS_ACCESS_KEY_ID, ...) and AWS_ENDPOINT_URL for S3, read by boto3. Neither package is imported until used.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import importlib
import json
import logging
import os
import re
import shutil
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable, Iterator, Optional, Protocol, TypeVar

log = logging.getLogger(__name__)

MARKER = ".neuronmodel-fetch.json"
PROGRESS = ".neuronmodel-fetch.progress.json"
DEFAULT_REVISION = "main"
ACCEPTED_FORMS = "hf://ORG/NAME, s3://BUCKET[/PREFIX], pvc://CLAIM[/PATH] or an absolute path /PATH"

#: Top-level Hub files serving reads: config, generation config, tokenizer (json, SentencePiece `.model`, BPE
#: merges/vocab `.txt`, tiktoken), chat templates, safetensors weights and their index. Everything else (other weight
#: formats, `original/` checkpoints, ONNX/TF/Flax/GGUF exports, images, code) is left on the Hub.
HF_SERVING_FILES = ("*.json", "*.safetensors", "*.jinja", "*.model", "*.txt", "*.tiktoken")
#: Weights taken only from a repository without safetensors.
HF_FALLBACK_WEIGHTS = ("pytorch_model*.bin",)

_HUB_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
_S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_CLAIM = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_PLAIN_MD5 = re.compile(r'"?[0-9a-f]{32}"?')
_SECRET_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
_CHUNK = 1 << 20
_RETRY_DELAYS_S = (1.0, 2.0, 4.0)  # requests huggingface_hub does not retry itself, and S3 bodies cut midway


def _redact(text: str) -> str:
    for name in _SECRET_VARS:
        secret = os.environ.get(name, "")
        if len(secret) >= 8:
            text = text.replace(secret, "***")
    return text


class FetchError(Exception):
    """A fetch that cannot succeed as configured: one line naming the source and the fix (never a credential)."""

    def __init__(self, message: str) -> None:
        super().__init__(_redact(message))


class SourceError(FetchError, ValueError):
    """A model source URL none of the accepted forms."""


# --- model sources ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelSource:
    """A parsed model source.

    scheme: "hf" (location = ORG/NAME), "s3" (location = bucket, path = key prefix), "pvc" (location = claim name,
    path = folder inside the claim) or "path" (location = an absolute path in the pod).
    """

    scheme: str
    location: str
    path: str = ""

    @property
    def url(self) -> str:
        """The canonical URL (no trailing slash); equal sources have equal URLs."""
        if self.scheme == "path":
            return self.location
        return f"{self.scheme}://{self.location}" + (f"/{self.path}" if self.path else "")

    @property
    def needs_fetch(self) -> bool:
        """hf:// and s3:// are downloaded; a claim or a path is mounted by the operator."""
        return self.scheme in ("hf", "s3")


def _is_relative(path: str) -> bool:
    """`path` is a relative POSIX path with no empty, `.` or `..` part: it cannot leave its folder."""
    return all(part not in ("", ".", "..") for part in path.split("/"))


def parse_source(url: str) -> ModelSource:
    """Parse a model source: hf://ORG/NAME, s3://BUCKET[/PREFIX], pvc://CLAIM[/PATH] or an absolute path.

    Raises:
        SourceError: the URL is none of these; the message names the accepted forms.
    """
    scheme, sep, rest = url.partition("://")
    rest = rest.rstrip("/")
    if not sep:
        if url.startswith("/"):
            return ModelSource("path", str(PurePosixPath(url)))
        raise SourceError(f"model source {url!r}: not a URL or an absolute path; accepted: {ACCEPTED_FORMS}")
    if scheme == "hf":
        if not _HUB_REPO.fullmatch(rest):
            raise SourceError(f"model source {url!r}: hf:// needs a Hugging Face repository id ORG/NAME "
                              f"(e.g. hf://HuggingFaceTB/SmolLM2-135M-Instruct); accepted: {ACCEPTED_FORMS}")
        return ModelSource("hf", rest)
    if scheme in ("s3", "pvc"):
        name, _, path = rest.partition("/")
        pattern, noun = (_S3_BUCKET, "an S3 bucket") if scheme == "s3" else (_CLAIM, "a PersistentVolumeClaim")
        if not pattern.fullmatch(name):
            raise SourceError(f"model source {url!r}: {scheme}:// needs {noun} name first; accepted: {ACCEPTED_FORMS}")
        if path and not _is_relative(path):
            raise SourceError(f"model source {url!r}: the path {path!r} has an empty, '.' or '..' part; "
                              f"accepted: {ACCEPTED_FORMS}")
        return ModelSource(scheme, name, path)
    raise SourceError(f"model source {url!r}: unknown scheme {scheme}://; accepted: {ACCEPTED_FORMS}")


def select_hf_files(paths: Iterable[str]) -> list[str]:
    """The files of a Hub repository that serving needs, sorted: top-level HF_SERVING_FILES, with one weight format.

    Safetensors weights win: `consolidated*.safetensors` (Mistral's own format, a second copy of the weights) and
    `*.bin.index.json` are dropped when other safetensors exist; without any safetensors, `pytorch_model*.bin` is
    taken instead. Sub-folders (`original/`, `onnx/`, ...) are never downloaded.

    Raises:
        FetchError: no config.json, or no weights, at the top level.
    """
    top = [p for p in paths if "/" not in p]
    chosen = [p for p in top if any(fnmatch.fnmatchcase(p, pattern) for pattern in HF_SERVING_FILES)]
    safetensors = [p for p in chosen if p.endswith(".safetensors")]
    if safetensors:
        if any(not p.startswith("consolidated") for p in safetensors):
            chosen = [p for p in chosen if not (p.startswith("consolidated") and p.endswith(".safetensors"))]
        chosen = [p for p in chosen if not p.endswith(".bin.index.json")]
    else:
        chosen += [p for p in top if any(fnmatch.fnmatchcase(p, pattern) for pattern in HF_FALLBACK_WEIGHTS)]
    if "config.json" not in chosen:
        raise FetchError("no config.json at the repository's top level: not a Hugging Face transformers checkpoint")
    if not any(p.endswith((".safetensors", ".bin")) for p in chosen):
        raise FetchError("no weights (*.safetensors, or pytorch_model*.bin) at the repository's top level")
    return sorted(chosen)


# --- remotes ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RemoteFile:
    """One file to fetch. etag identifies its content: S3's ETag, the Hub's LFS sha256 or git blob id."""

    path: str
    size: int
    etag: str


class _Remote(Protocol):
    commit: Optional[str]

    def list_files(self) -> list[RemoteFile]: ...

    def download(self, file: RemoteFile, staging: Path, stop: threading.Event) -> int:
        """Write `file` complete at staging/file.path (a temporary name first, then a rename); return the bytes
        transferred by this call."""

    def explain(self, exc: Exception) -> Optional[FetchError]:
        """The one-line error for a known failure of this remote, or None (a bug: it propagates)."""


T = TypeVar("T")


def _with_retries(call: Callable[[], T], transient: Callable[[Exception], bool], what: str) -> T:
    for delay in _RETRY_DELAYS_S:
        try:
            return call()
        except Exception as exc:
            if not transient(exc):
                raise
            log.warning("%s failed (%s: %s); retrying in %.0f s", what, type(exc).__name__, _redact(str(exc)), delay)
            time.sleep(delay)
    return call()


def _network_errors() -> tuple[type[Exception], ...]:
    """The transport errors of the HTTP client huggingface_hub uses: httpx2 (2.x), httpx (1.x) or requests (0.x)."""
    found = []
    for module, names in (("httpx2", ("TransportError",)), ("httpx", ("TransportError",)),
                          ("requests.exceptions", ("ConnectionError", "Timeout", "ChunkedEncodingError"))):
        with contextlib.suppress(ImportError):
            found += [getattr(importlib.import_module(module), name) for name in names]
    return tuple(found)


class _Hub:
    """A Hugging Face Hub repository (or a mirror at HF_ENDPOINT), through huggingface_hub.

    huggingface_hub reads HF_TOKEN and HF_ENDPOINT itself, when it is imported. A file is downloaded by
    hf_hub_download into the staging folder (`local_dir`), which renames it into place when complete. A dropped
    connection is resumed within the run with a Range request (by huggingface_hub, or by its `.incomplete` file when
    fetch retries the file); huggingface_hub 2.x keeps no partial file across runs, so after an interrupted run such
    a file starts again from its first byte.
    """

    def __init__(self, source: ModelSource, revision: str) -> None:
        from huggingface_hub.utils import disable_progress_bars
        from huggingface_hub.utils import logging as hf_logging

        # fetch logs its own progress: no tqdm bars (a flood in a pod log), no line per HTTP request below DEBUG,
        # and huggingface_hub's warnings through the root handler only (its own handler would print them twice)
        disable_progress_bars()
        for name in ("httpx2", "httpx"):
            logging.getLogger(name).setLevel(logging.DEBUG if log.isEnabledFor(logging.DEBUG) else logging.WARNING)
        if logging.getLogger().handlers:
            hf_logging.get_logger().handlers.clear()
        self.source, self.revision, self.commit = source, revision, None

    def list_files(self) -> list[RemoteFile]:
        from huggingface_hub import HfApi

        info = _with_retries(lambda: HfApi().model_info(self.source.location, revision=self.revision,
                                                         files_metadata=True),
                             self._transient, f"listing {self.source.url}")
        self.commit = info.sha
        siblings = {s.rfilename: s for s in info.siblings or []}
        try:
            names = select_hf_files(siblings)
        except FetchError as exc:
            raise FetchError(f"{self.source.url} (revision {self.revision}): {exc}") from None
        files = []
        for name in names:
            s = siblings[name]
            if s.size is None:
                raise FetchError(f"{self.source.url}: the Hub endpoint listed no file sizes; HF_ENDPOINT must be a "
                                 "Hub-compatible endpoint (model info with ?blobs=true)")
            files.append(RemoteFile(name, s.size, (s.lfs.sha256 if s.lfs else None) or s.blob_id or info.sha))
        return files

    def download(self, file: RemoteFile, staging: Path, stop: threading.Event) -> int:
        from huggingface_hub import hf_hub_download

        _with_retries(lambda: hf_hub_download(self.source.location, file.path, revision=self.commit,
                                              local_dir=staging),
                      self._transient, f"downloading {file.path}")
        return file.size

    @staticmethod
    def _transient(exc: Exception) -> bool:
        from huggingface_hub.utils import HfHubHTTPError

        if isinstance(exc, HfHubHTTPError):
            return getattr(exc.response, "status_code", None) in (429, 500, 502, 503, 504)
        return isinstance(exc, _network_errors())

    def explain(self, exc: Exception) -> Optional[FetchError]:
        from huggingface_hub import constants
        from huggingface_hub.utils import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                           RepositoryNotFoundError, RevisionNotFoundError)

        url, token = self.source.url, os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
        status = getattr(getattr(exc, "response", None), "status_code", None)
        fix = ("set HF_TOKEN (the model's token secret) to a token with access to it" if not token else
               "check that the HF_TOKEN secret is a token with access to it")
        if isinstance(exc, GatedRepoError):
            return FetchError(f"{url}: the repository is gated (HTTP {status}): accept its conditions on its Hub page "
                              "with the account of HF_TOKEN (the model's token secret)")
        if isinstance(exc, RepositoryNotFoundError):
            return FetchError(f"{url}: no such repository, or it is private or gated (HTTP {status}): check the name, "
                              f"or {fix}")
        if isinstance(exc, RevisionNotFoundError):
            return FetchError(f"{url}: no revision {self.revision!r} (HTTP {status}): check --revision "
                              "(a branch, tag or commit)")
        if isinstance(exc, HfHubHTTPError) and status in (401, 403):
            return FetchError(f"{url}: the Hub refused the request (HTTP {status}): {fix}")
        if isinstance(exc, HfHubHTTPError):
            return FetchError(f"{url}: the Hub answered HTTP {status} ({str(exc).strip().splitlines()[0]}): retry "
                              "later, or check HF_ENDPOINT")
        if isinstance(exc, (*_network_errors(), LocalEntryNotFoundError)):
            cause = exc.__cause__ or exc
            return FetchError(f"{url}: no connection to {constants.ENDPOINT} after retries ({type(cause).__name__}: "
                              f"{str(cause).splitlines()[0] if str(cause) else '-'}): check the pod's network, or "
                              "HF_ENDPOINT for a mirror")
        return None


class _S3:
    """An S3 prefix (or an S3-compatible store at AWS_ENDPOINT_URL), through boto3.

    boto3 finds the credentials (IRSA, EKS Pod Identity, AWS_* variables, ...), the region and AWS_ENDPOINT_URL, and
    retries failed requests ("standard" mode). A response body cut midway is resumed here with a ranged GET
    (If-Match the listed ETag, so a changed object is never spliced), also across runs: the partial bytes stay in
    `<name>.<etag digest>.part` beside the file.
    """

    def __init__(self, source: ModelSource, workers: int) -> None:
        import boto3
        from botocore.config import Config

        self.source, self.commit = source, None
        self.prefix = f"{source.path}/" if source.path else ""
        self.client = boto3.client("s3", config=Config(retries={"mode": "standard", "max_attempts": 6},
                                                       connect_timeout=10, read_timeout=60,
                                                       max_pool_connections=max(10, workers)))

    def list_files(self) -> list[RemoteFile]:
        files = []
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.source.location, Prefix=self.prefix)
        for page in pages:
            for obj in page.get("Contents", []):
                name = obj["Key"][len(self.prefix):]
                if name.endswith("/") or name in (MARKER, PROGRESS):  # folder placeholders; another fetch's records
                    continue
                if not _is_relative(name):
                    raise FetchError(f"{self.source.url}: the object key {obj['Key']!r} has an empty, '.' or '..' "
                                     "path part, which cannot be a file under DEST: rename it")
                files.append(RemoteFile(name, obj["Size"], obj["ETag"]))
        if not files:
            raise FetchError(f"{self.source.url}: no objects under s3://{self.source.location}/{self.prefix}: "
                             "check the prefix (a folder holding the model's files)")
        return files

    def download(self, file: RemoteFile, staging: Path, stop: threading.Event) -> int:
        from botocore.exceptions import ConnectionError, FlexibleChecksumError, HTTPClientError, IncompleteReadError

        target = staging / file.path
        part = target.with_name(f"{target.name}.{hashlib.sha256(file.etag.encode()).hexdigest()[:12]}.part")
        offset = part.stat().st_size if part.is_file() else 0
        if offset >= file.size:  # a stale or a complete but unverified part: start again
            part.unlink(missing_ok=True)
            offset = 0
        elif offset:
            log.info("%s: resuming at byte %d of %d", file.path, offset, file.size)
        start, md5, failures, problem = offset, None, 0, ""
        while True:
            ranged = {"Range": f"bytes={offset}-"} if offset else {}
            response = self.client.get_object(Bucket=self.source.location, Key=self.prefix + file.path,
                                              IfMatch=file.etag, **ranged)
            if md5 is None and _etag_is_md5(file.etag, response):
                md5 = _md5_of(part, offset)
            before = offset
            try:  # botocore checks the body against the object's checksum (FlexibleChecksumError), when not ranged
                with contextlib.closing(response["Body"]) as body, part.open("ab") as out:
                    for chunk in body.iter_chunks(_CHUNK):
                        if stop.is_set():
                            return offset - start  # another file failed; the part stays for the next run
                        out.write(chunk)
                        offset += len(chunk)
                        if md5 is not None:
                            md5.update(chunk)
                    out.flush()
                    os.fsync(out.fileno())
                break
            except FlexibleChecksumError as exc:
                problem = f"corrupted ({exc})"
                break
            except (HTTPClientError, ConnectionError, IncompleteReadError) as exc:
                failures = 0 if offset > before else failures + 1
                if failures > len(_RETRY_DELAYS_S):
                    raise
                log.warning("%s: connection lost at byte %d of %d (%s); resuming", file.path, offset, file.size,
                            type(exc).__name__)
                time.sleep(_RETRY_DELAYS_S[max(failures - 1, 0)])
        if not problem:
            if offset != file.size:
                problem = f"with {offset} bytes where S3 lists {file.size}"
            elif md5 is not None and md5.hexdigest() != file.etag.strip('"'):
                problem = f"corrupted (its MD5 is not its ETag {file.etag})"
            else:
                os.replace(part, target)
                return offset - start
        part.unlink()
        raise FetchError(f"{self.source.url}: {file.path} arrived {problem}; the partial file was removed: "
                         "run fetch again")

    def explain(self, exc: Exception) -> Optional[FetchError]:
        from botocore.exceptions import (ClientError, ConnectionError, CredentialRetrievalError, HTTPClientError,
                                         NoCredentialsError, PartialCredentialsError)

        url, bucket = self.source.url, self.source.location
        if isinstance(exc, (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError)):
            return FetchError(f"{url}: no usable AWS credentials ({exc}): give the pod an IAM role (IRSA or EKS Pod "
                              "Identity), or set the credentials secret (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)")
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            code, status = error.get("Code", "?"), exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "NoSuchBucket":
                return FetchError(f"{url}: no such bucket {bucket!r}: check the source")
            if code in ("PreconditionFailed", "412"):
                return FetchError(f"{url}: an object changed while it was downloaded: run fetch again")
            if status in (401, 403) or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                                                "ExpiredToken", "InvalidToken", "AllAccessDisabled"):
                return FetchError(f"{url}: access denied ({code}): the pod's AWS credentials need s3:ListBucket on "
                                  f"arn:aws:s3:::{bucket} and s3:GetObject on arn:aws:s3:::{bucket}/{self.prefix}*; "
                                  "check its IAM role (IRSA or EKS Pod Identity) or the credentials secret")
            return FetchError(f"{url}: S3 answered {code} (HTTP {status}): {error.get('Message', '')}")
        if isinstance(exc, (ConnectionError, HTTPClientError)):
            return FetchError(f"{url}: cannot reach S3 at {self.client.meta.endpoint_url} after retries ({exc}): "
                              "check the pod's network, AWS_REGION, or AWS_ENDPOINT_URL for an S3-compatible store")
        return None


def _etag_is_md5(etag: str, response: dict) -> bool:
    """S3's ETag is the MD5 of the content for a single-part upload that is not encrypted with KMS or SSE-C."""
    kms = response.get("ServerSideEncryption") in ("aws:kms", "aws:kms:dsse") or response.get("SSECustomerAlgorithm")
    return bool(_PLAIN_MD5.fullmatch(etag)) and not kms


def _md5_of(path: Path, size: int) -> Any:
    md5 = hashlib.md5(usedforsecurity=False)
    if size:
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                md5.update(chunk)
    return md5


# --- the fetch -------------------------------------------------------------------------------------------------------

def _read_json(path: Path) -> Optional[dict]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: dict) -> None:
    """Write `data` durably under its final name in one step (a temporary file, fsync, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _has_files(folder: Path, files: dict) -> bool:
    """Every recorded file is in `folder` at its recorded size."""
    try:
        return all((folder / name).stat().st_size == entry["size"] for name, entry in files.items())
    except (OSError, KeyError, TypeError):
        return False


def _is_fetched(dest: Path, url: str, revision: Optional[str]) -> bool:
    marker = _read_json(dest / MARKER)
    return (marker is not None and marker.get("source") == url and marker.get("revision") == revision
            and _has_files(dest, marker.get("files") or {}))


@contextlib.contextmanager
def _locked(lock: Path) -> Iterator[None]:
    """Hold an exclusive lock on `lock`: one fetch into a DEST at a time (pods sharing a volume)."""
    with lock.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another fetch into the same folder (it holds %s)", lock)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class _Staging:
    """DEST.partial/ and its record of completed files (`PROGRESS`), shared by the download threads."""

    def __init__(self, folder: Path, url: str) -> None:
        self.folder, self.url, self._lock = folder, url, threading.Lock()
        record = _read_json(folder / PROGRESS) or _read_json(folder / MARKER)  # the marker: renamed away unfinished
        if record is None or record.get("source") != url:
            if folder.exists():
                log.info("removing %s (not a fetch of %s)", folder, url)
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
            record = {"source": url, "files": {}}
            _write_json(folder / PROGRESS, record)  # from the start: partial bytes of a first file are resumed too
        self.files: dict = record.get("files") or {}

    def has(self, file: RemoteFile) -> bool:
        entry = self.files.get(file.path)
        return entry == {"size": file.size, "etag": file.etag} and _has_files(self.folder, {file.path: entry})

    def record(self, file: RemoteFile) -> None:
        with self._lock:
            self.files[file.path] = {"size": file.size, "etag": file.etag}
            _write_json(self.folder / PROGRESS, {"source": self.url, "files": self.files})

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


def _download(remote: _Remote, files: list[RemoteFile], staging: _Staging, progress: _Progress, workers: int) -> int:
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


def _replace(staging: Path, dest: Path) -> None:
    """Rename the complete staging folder onto DEST; what DEST held goes only once the new folder is in place."""
    old = dest.with_name(dest.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if dest.exists() or dest.is_symlink():
        os.replace(dest, old)
    os.replace(staging, dest)
    if old.is_dir() and not old.is_symlink():
        shutil.rmtree(old)
    elif old.exists() or old.is_symlink():
        old.unlink()


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
    parsed = parse_source(source)
    if not parsed.needs_fetch:
        raise FetchError(f"{parsed.url}: a {'PersistentVolumeClaim' if parsed.scheme == 'pvc' else 'local path'} "
                         "needs no fetch: the operator mounts it into the pod; fetch downloads hf:// and s3:// sources")
    revision = _check_revision(parsed, revision)
    dest = Path(dest).absolute()
    shown = parsed.url + (f" (revision {revision})" if revision else "")
    if _is_fetched(dest, parsed.url, revision):
        log.info("%s already fetched into %s", shown, dest)
        return _read_json(dest / MARKER) or {}
    if os.path.ismount(dest):
        raise FetchError(f"{dest} is a mount point, which cannot be replaced atomically: mount the volume at its "
                         f"parent ({dest.parent}) and fetch into {dest}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _locked(dest.with_name(dest.name + ".lock")):
        if _is_fetched(dest, parsed.url, revision):  # by the fetch we waited for
            log.info("%s already fetched into %s", shown, dest)
            return _read_json(dest / MARKER) or {}
        return _fetch_locked(parsed, revision, dest, workers, progress_every_s, shown)


def _fetch_locked(source: ModelSource, revision: Optional[str], dest: Path, workers: int, progress_every_s: float,
                  shown: str) -> dict:
    started = time.monotonic()
    if dest.exists():
        log.info("%s holds no complete fetch of %s: fetching again; it is replaced when done", dest, shown)
    remote: _Remote = _Hub(source, revision) if source.scheme == "hf" else _S3(source, workers)
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
    _write_json(staging.folder / MARKER, marker)
    (staging.folder / PROGRESS).unlink(missing_ok=True)
    staging.keep_only({f.path for f in files} | {MARKER})
    _replace(staging.folder, dest)
    log.info("fetched %s into %s: %d files, %d bytes in %.1f s (%d files, %d bytes downloaded by this run: "
             "%.1f MB/s)", shown, dest, len(files), sum(f.size for f in files), seconds, len(todo), transferred,
             transferred / 1e6 / max(seconds, 1e-6))
    return marker
