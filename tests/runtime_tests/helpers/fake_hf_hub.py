"""A local Hugging Face Hub for the fetch tests: just what huggingface_hub 2.x's model_info and hf_hub_download call
(read from huggingface_hub/hf_api.py and file_download.py), over plain HTTP on 127.0.0.1, with a request log and
one-shot faults. Also `BodyFaults`, shared with the S3 proxy of test_fetch.py.

- `GET /api/models/{repo}/revision/{rev}?blobs=true`: `{"id", "sha", "siblings": [{"rfilename", "size", "blobId",
  "lfs"}]}`; an unknown revision is a 404 with `X-Error-Code: RevisionNotFound`.
- `HEAD|GET /{repo}/resolve/{rev}/{path}`: `ETag`, `X-Repo-Commit`, `Content-Length`, `Accept-Ranges`, and a `Range:
  bytes=N-` answered with 206. No `X-Xet-*` header, so hf_xet is never used.
- With a token, every request needs `Authorization: Bearer <token>`: none is a 401 (which huggingface_hub reports as
  "repository not found"), a wrong one a 401 with the Hub's "Invalid credentials in Authorization header".
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional


@dataclass
class Request:
    method: str
    path: str
    range: Optional[str]
    authorization: Optional[str]


class BodyFaults:
    """One-shot faults on response bodies, by name, applied in the order given (one per response): `cut` closes the
    connection after `at` bytes; `stall` stops after `at` bytes until `release()` (or `seconds`) and then sends the
    rest; `corrupt` flips the byte at `at`."""

    def __init__(self) -> None:
        self._faults: dict[str, list[tuple[str, int, Optional[float]]]] = {}
        self.stalled = threading.Event()
        self._release = threading.Event()
        self._lock = threading.Lock()

    def cut(self, name: str, at: int) -> None:
        self._faults.setdefault(name, []).append(("cut", at, None))

    def stall(self, name: str, at: int, seconds: Optional[float] = None) -> None:
        self._faults.setdefault(name, []).append(("stall", at, seconds))

    def corrupt(self, name: str, at: int) -> None:
        self._faults.setdefault(name, []).append(("corrupt", at, None))

    def release(self) -> None:
        self._release.set()

    def send(self, handler: BaseHTTPRequestHandler, name: str, body: bytes) -> None:
        """Write `body` (its headers already sent), applying and then forgetting the fault on `name`."""
        with self._lock:
            queued = self._faults.get(name)
            kind, at, seconds = queued.pop(0) if queued else (None, len(body), None)
        if kind == "corrupt":
            body, kind, at = body[:at] + bytes([body[at] ^ 0xFF]) + body[at + 1:], None, len(body)
        try:
            handler.wfile.write(body[:at])
            handler.wfile.flush()
            if kind == "cut":
                handler.close_connection = True
                return
            if kind == "stall":
                self.stalled.set()
                self._release.wait(seconds)
            handler.wfile.write(body[at:])
        except (BrokenPipeError, ConnectionResetError):  # the client went away (killed by a test)
            handler.close_connection = True


class FakeHub:
    """Serve `files` as the repository `repo` at commit `commit` (also reachable as revision "main")."""

    def __init__(self, repo: str, files: dict[str, bytes], token: Optional[str] = None,
                 commit: str = "c0ffee" * 6 + "0123") -> None:
        self.repo, self.files, self.token, self.commit = repo, files, token, commit
        self.requests: list[Request] = []
        self.faults = BodyFaults()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._handle(self, body=False)

            def do_GET(self) -> None:
                hub._handle(self, body=True)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.faults.release()
        self._server.shutdown()
        self._server.server_close()

    def gets(self, name: str) -> list[Request]:
        """The GET requests for the file `name`."""
        return [r for r in self.requests if r.method == "GET" and r.path.endswith(f"/resolve/{self.commit}/{name}")]

    def _etag(self, name: str) -> str:
        return hashlib.sha256(self.files[name]).hexdigest()

    def _reply(self, handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        handler.send_response(status)
        for key, value in {"Content-Length": str(len(body)), **headers}.items():
            handler.send_header(key, value)
        handler.end_headers()
        if handler.command == "GET":
            handler.wfile.write(body)

    def _handle(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        path = handler.path.split("?")[0]
        auth = handler.headers.get("Authorization")
        self.requests.append(Request(handler.command, path, handler.headers.get("Range"), auth))
        if self.token and auth != f"Bearer {self.token}":
            headers = {"X-Error-Message": "Invalid credentials in Authorization header"} if auth else {}
            return self._reply(handler, 401, headers, b'{"error": "unauthorized"}')
        info, resolve = f"/api/models/{self.repo}/revision/", f"/{self.repo}/resolve/"
        if path.startswith(info):
            return self._info(handler, path[len(info):])
        if path.startswith(resolve):
            revision, _, name = path[len(resolve):].partition("/")
            if revision in ("main", self.commit) and name in self.files:
                return self._file(handler, name, body)
        self._reply(handler, 404, {"X-Error-Code": "EntryNotFound" if path.startswith(resolve) else "RepoNotFound"})

    def _info(self, handler: BaseHTTPRequestHandler, revision: str) -> None:
        if revision not in ("main", self.commit):
            return self._reply(handler, 404, {"X-Error-Code": "RevisionNotFound"})
        siblings = [{"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest(),
                     "lfs": {"size": len(data), "sha256": self._etag(name), "pointerSize": 134}}
                    for name, data in self.files.items()]
        payload = json.dumps({"id": self.repo, "sha": self.commit, "siblings": siblings}).encode()
        self._reply(handler, 200, {"Content-Type": "application/json"}, payload)

    def _file(self, handler: BaseHTTPRequestHandler, name: str, body: bool) -> None:
        data, start = self.files[name], 0
        ranged = handler.headers.get("Range")
        if ranged and ranged.startswith("bytes=") and ranged.endswith("-"):
            start = int(ranged[len("bytes="):-1])
        status = 206 if start else 200
        handler.send_response(status)
        headers = {"ETag": f'"{self._etag(name)}"', "X-Repo-Commit": self.commit, "Accept-Ranges": "bytes",
                   "Content-Length": str(len(data) - start), "Content-Type": "application/octet-stream"}
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.end_headers()
        if body:
            self.faults.send(handler, name, data[start:])
