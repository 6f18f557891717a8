"""The S3 artifact store (`s3://bucket/prefix`), through boto3 (imported only here, when such a store is opened).

boto3 finds the credentials (IRSA, EKS Pod Identity, AWS_* variables, ...) and AWS_ENDPOINT_URL itself; the region is
AWS_REGION, else boto3's (AWS_DEFAULT_REGION, the config file), else us-east-1. Requests are retried in boto3's
"standard" mode (5 attempts in all); files go up and down with upload_file / download_file, multipart above
`multipart_threshold` (64 MiB), parts in parallel.

The compile lock is a lease object `<prefix>/<digest>.lock` holding its owner and expiry, created with a conditional
put (If-None-Match: *, which S3 honours since 2024, as do MinIO and moto 5). An expired lease is taken over, and a
held one renewed, with a conditional overwrite (If-Match its ETag: of two writers, one wins); it is released with a
conditional delete (If-Match the holder's ETag, so a holder whose lease was taken over never deletes the new one).
After every successful write the lease is read back and must hold what was written. A store that answers
NotImplemented to conditional writes gets the fallback: write only when a read finds what the condition wants, wait
SETTLE_S, read back; it is best effort (two writers within a round trip may both win), and logged as such.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator, Optional

from neuronmodel_runtime.artifacts.store import ArtifactStore, CacheError, LockState, lease_fields

log = logging.getLogger(__name__)

MiB = 1 << 20
SETTLE_S = 2.0  # the fallback lock's wait between its create and its read back
_MISSING = ("NoSuchKey", "404", "NotFound")
_BUSY = ("PreconditionFailed", "412", "ConditionalRequestConflict", "409")
_session: Any = None
_session_lock = threading.Lock()


def _code(exc: Exception) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


class S3Store(ArtifactStore):
    def __init__(self, url: str, bucket: str, prefix: str = "", *, multipart_threshold: int = 64 * MiB,
                 multipart_chunksize: int = 64 * MiB, workers: int = 4) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        global _session
        self.url, self.bucket, self.prefix, self.workers = url, bucket, prefix.strip("/"), workers
        with _session_lock:  # one session per process (it loads the service models); clients are thread-safe
            _session = _session or boto3.session.Session()
            region = os.environ.get("AWS_REGION") or _session.region_name or "us-east-1"
            self.client = _session.client("s3", region_name=region, config=Config(
                retries={"mode": "standard", "total_max_attempts": 5}, connect_timeout=10, read_timeout=120,
                max_pool_connections=4 * workers + 4))
        self.transfer = TransferConfig(multipart_threshold=multipart_threshold, multipart_chunksize=multipart_chunksize,
                                       max_concurrency=4)
        self._conditional = True

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """botocore's errors as one CacheError naming the store and what was being done."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except ClientError as exc:
            error = exc.response.get("Error", {})
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            hint = (" (the pod's AWS credentials need s3:GetObject, s3:PutObject, s3:DeleteObject and s3:ListBucket "
                    "on it)" if status in (401, 403) else "")
            raise CacheError(f"{self.url}: {what}: S3 answered {error.get('Code', '?')} (HTTP {status}): "
                             f"{error.get('Message', '')}{hint}") from exc
        except BotoCoreError as exc:
            raise CacheError(f"{self.url}: {what}: {exc} (check the network, the credentials, AWS_REGION or "
                             "AWS_ENDPOINT_URL)") from exc

    # --- object primitives -------------------------------------------------------------------------------------------

    def _get(self, name: str) -> Optional[tuple[bytes, str, datetime]]:
        """(body, ETag, LastModified), or None when there is no such object."""
        from botocore.exceptions import ClientError

        with self._errors(f"reading {name}"):
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=self._key(name))
            except ClientError as exc:
                if _code(exc) in _MISSING:
                    return None
                raise
            with contextlib.closing(response["Body"]) as body:
                return body.read(), response["ETag"], response["LastModified"]

    def _read(self, name: str) -> Optional[bytes]:
        got = self._get(name)
        return None if got is None else got[0]

    def _write(self, name: str, data: bytes) -> None:
        with self._errors(f"writing {name}"):
            self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data)

    def _upload(self, path: Path, name: str) -> None:
        with self._errors(f"uploading {name}"):
            self.client.upload_file(str(path), self.bucket, self._key(name), Config=self.transfer)

    def _download(self, name: str, path: Path) -> bool:
        from botocore.exceptions import ClientError

        with self._errors(f"downloading {name}"):
            try:
                self.client.download_file(self.bucket, self._key(name), str(path), Config=self.transfer)
            except ClientError as exc:
                if _code(exc) in _MISSING:
                    return False
                raise
        return True

    def _delete(self, name: str) -> None:
        with self._errors(f"deleting {name}"):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(name))

    def _list(self, folder: str) -> list[str]:
        start = self._key(folder) + "/"
        with self._errors(f"listing {folder}/"):
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start)
            return [obj["Key"][len(start):] for page in pages for obj in page.get("Contents", [])]

    # --- the lease ---------------------------------------------------------------------------------------------------

    def _put_lease(self, name: str, body: bytes, **condition: str) -> Optional[str]:
        """The new lease's ETag, or None when the condition failed (someone else holds or took the lease)."""
        from botocore.exceptions import ClientError

        if condition and not self._conditional:  # the fallback: write when a read finds what the condition wants
            got = self._get(name)
            wanted = got is None if "IfNoneMatch" in condition else got is not None and got[1] == condition["IfMatch"]
            return self._put_lease(name, body) if wanted else None
        with self._errors(f"writing the lease {name}"):
            try:
                return self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=body,
                                              **condition)["ETag"]
            except ClientError as exc:
                if _code(exc) in _BUSY or ("IfMatch" in condition and _code(exc) in _MISSING):
                    return None
                if _code(exc) != "NotImplemented" or not condition:
                    raise
        log.warning("%s: the store does not support conditional writes; its compile lock is best effort (two pods "
                    "starting within %.0f s may both compile)", self.url, SETTLE_S)
        self._conditional = False
        return self._put_lease(name, body, **condition)

    def _ours(self, name: str, etag: Optional[str], body: bytes) -> Optional[str]:
        """`etag` if the lease just written is there with this body (read back after SETTLE_S without conditional
        writes), else None."""
        if etag is None:
            return None
        if not self._conditional:
            time.sleep(SETTLE_S)
        got = self._get(name)
        return got[1] if got is not None and got[0] == body else None

    def _lock_create(self, name: str, body: bytes) -> Optional[str]:
        return self._ours(name, self._put_lease(name, body, IfNoneMatch="*"), body)

    def _lock_read(self, name: str) -> Optional[LockState]:
        got = self._get(name)
        return None if got is None else LockState(*lease_fields(got[0]), got[2].timestamp(), got[1])

    def _lock_replace(self, name: str, seen: LockState, body: bytes) -> Optional[str]:
        return self._ours(name, self._put_lease(name, body, IfMatch=seen.token), body)

    def _lock_delete(self, name: str, token: str) -> bool:
        from botocore.exceptions import ClientError

        with self._errors(f"releasing the lease {name}"):
            try:
                if self._conditional:
                    self.client.delete_object(Bucket=self.bucket, Key=self._key(name), IfMatch=token)
                    return True
            except ClientError as exc:
                if _code(exc) in _MISSING:
                    return True
                if _code(exc) in _BUSY:
                    return False
                if _code(exc) != "NotImplemented":
                    raise
            got = self._get(name)  # no conditional delete: delete it if it is still ours
            if got is not None and got[1] != token:
                return False
            self.client.delete_object(Bucket=self.bucket, Key=self._key(name))
            return True

    def _lock_where(self, name: str) -> str:
        return f"s3://{self.bucket}/{self._key(name)}"
