"""Where `neuronmodel-runtime fetch` downloads a model's files from: a Hugging Face Hub repository (or a mirror at
HF_ENDPOINT) through huggingface_hub, or an S3 prefix through boto3, behind one small interface (`Remote`: list the
files, download one completely, explain a known failure in one line), with retries of what the clients do not retry
themselves. Neither client library is imported until used; errors never carry a credential.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import importlib
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Protocol, TypeVar

from neuronmodel_runtime.artifacts.folder import FETCH_MARKER, stays_inside
from neuronmodel_runtime.config import env
from neuronmodel_runtime.config.sources import ModelSource

log = logging.getLogger("neuronmodel_runtime.fetch")  # one logger for the whole fetch (what an operator greps)

#: The record of a fetch in progress, in its staging folder (fetch.py).
PROGRESS = ".neuronmodel-fetch.progress.json"

#: Top-level Hub files serving reads: config, generation config, tokenizer (json, SentencePiece `.model`, BPE
#: merges/vocab `.txt`, tiktoken), chat templates, safetensors weights and their index. Everything else (other weight
#: formats, `original/` checkpoints, ONNX/TF/Flax/GGUF exports, images, code) is left on the Hub.
HF_SERVING_FILES = ("*.json", "*.safetensors", "*.jinja", "*.model", "*.txt", "*.tiktoken")
#: Weights taken only from a repository without safetensors.
HF_FALLBACK_WEIGHTS = ("pytorch_model*.bin",)

_PLAIN_MD5 = re.compile(r'"?[0-9a-f]{32}"?')
_SECRET_VARS = (env.HF_TOKEN, "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
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


@dataclass(frozen=True)
class RemoteFile:
    """One file to fetch. etag identifies its content: S3's ETag, the Hub's LFS sha256 or git blob id."""

    path: str
    size: int
    etag: str


class Remote(Protocol):
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


class Hub:
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

        url, token = self.source.url, os.environ.get(env.HF_TOKEN) or os.environ.get("HUGGING_FACE_HUB_TOKEN")
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


class S3:
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
                if name.endswith("/") or name in (FETCH_MARKER, PROGRESS):  # folder placeholders; a fetch's records
                    continue
                if not stays_inside(name):
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
