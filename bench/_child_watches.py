"""The operator benchmark's watches (bench/operator.py): one raw watch per child kind a NeuronModel gets,
cluster-wide, recording the client time each object is first seen."""

from __future__ import annotations

import json
import threading
import time

from neuronmodel_operator import api

#: The kinds watched: (API path prefix, plural, kind); the operator makes exactly these for bench/operator.py's SPEC.
WATCHED = (("/api/v1", "configmaps", "ConfigMap"), ("/apis/apps/v1", "deployments", "Deployment"),
           ("/api/v1", "services", "Service"))


class Watches:
    """One raw watch per child kind, cluster-wide; `seen[(namespace, kind, name)]` = client time first seen."""

    def __init__(self, client):
        self.client = client
        self.seen: dict[tuple[str, str, str], float] = {}
        self.lock = threading.Condition()
        self.stopping = False
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=kind, daemon=True, name=f"watch-{kind[1]}")
                        for kind in WATCHED]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _request(self, path: str, query: str):
        headers = {"Accept": "application/json"}
        self.client.update_params_for_auth(headers, None, ["BearerToken"], path, "GET", None)
        return self.client.rest_client.pool_manager.request(
            "GET", self.client.configuration.host + path + "?" + query, headers=headers, preload_content=False,
            timeout=None)

    def _run(self, prefix: str, plural: str, kind: str) -> None:
        selector = f"labelSelector={api.LABEL_NAME}"
        path = f"{prefix}/{plural}"
        version = ""
        while not self.stopping:
            try:
                if not version:  # list (at the start, or after a 410) to learn a resourceVersion
                    response = self._request(path, selector)
                    body = json.loads(response.read())
                    now = time.perf_counter()
                    with self.lock:
                        for item in body["items"]:
                            self._saw(kind, item["metadata"], now)
                    version = body["metadata"]["resourceVersion"]
                response = self._request(path, f"{selector}&watch=1&resourceVersion={version}&timeoutSeconds=900"
                                         "&allowWatchBookmarks=true")
                buffer = b""
                for chunk in response.stream(65536, decode_content=True):
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    now = time.perf_counter()
                    for line in lines:
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        if event["type"] == "ERROR":  # 410 Gone: relist
                            version = ""
                            break
                        meta = event["object"]["metadata"]
                        version = meta.get("resourceVersion", version)
                        if event["type"] in ("ADDED", "MODIFIED"):
                            with self.lock:
                                self._saw(kind, meta, now)
                    if self.stopping or not version:
                        break
                response.release_conn()
            except Exception as exc:  # noqa: BLE001 - a dropped watch is re-opened; record why
                if not self.stopping:
                    self.errors.append(f"{kind}: {exc!r}")
                    time.sleep(0.5)

    def _saw(self, kind: str, meta: dict, now: float) -> None:
        key = (meta["namespace"], kind, meta["name"])
        if key not in self.seen:
            self.seen[key] = now
            self.lock.notify_all()

    def wait_for(self, keys: list[tuple[str, str, str]], timeout: float, what: str) -> float:
        """Block until every key has been seen; the latest first-seen time among them."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                missing = [key for key in keys if key not in self.seen]
                if not missing:
                    return max(self.seen[key] for key in keys)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{what}: {len(missing)} of {len(keys)} objects never appeared, e.g. "
                                       f"{missing[:3]}; watch errors: {self.errors[-3:]}")
                self.lock.wait(min(left, 1.0))
