"""A Hugging Face Hub mirror for the operator on the local control plane: it answers the one request the operator
makes of the Hub (revisions.py: a repository's info at a revision) for any repository, as HF_ENDPOINT would
point at a real mirror.

Every repository is public and each revision has its own commit (a sha1 of "repo@revision", or the one `move` set),
except repositories whose name ends in "private": the Hub hides those without a token (401), as it hides private
repositories; and those whose name ends in "down" answer 503, as a Hub in an outage does.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<revision>[^/?]+)")


def commit_of(repo: str, revision: str) -> str:
    """The commit the mirror says `revision` of `repo` is at (until `HubMirror.move` moves it)."""
    return revision if re.fullmatch(r"[0-9a-f]{40}", revision) else \
        hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()


class HubMirror:
    def __init__(self) -> None:
        moved: dict[tuple[str, str], str] = {}
        self._moved = moved

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                found = _INFO.match(self.path)
                if found is None or found["repo"].endswith("private"):
                    status, body = (404 if found is None else 401), b'{"error": "Repository not found"}'
                elif found["repo"].endswith("down"):
                    status, body = 503, b'{"error": "Service Unavailable"}'
                else:
                    status = 200
                    commit = moved.get((found["repo"], found["revision"])) or \
                        commit_of(found["repo"], found["revision"])
                    body = json.dumps({"id": found["repo"], "sha": commit, "siblings": []}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def move(self, repo: str, revision: str) -> str:
        """`revision` of `repo` moves on to a new commit (a push to the branch); the new commit."""
        commit = hashlib.sha1(f"{repo}@{revision}+{len(self._moved)}".encode()).hexdigest()
        self._moved[repo, revision] = commit
        return commit

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
