"""A local OCI registry on 127.0.0.1: the CNCF distribution registry (Debian's build, `k8s.install`), for charts.

    PYTHONPATH=scripts python -m k8s.registry [DIR]   # serves until Ctrl-C; prints the address to push to

Plain HTTP, no auth, filesystem storage under `DIR` (default: a temporary folder, removed at the end), logs in
`DIR/registry.log`. Helm pushes and pulls with `--plain-http`:

    helm push neuronmodel-operator-0.1.0.tgz oci://127.0.0.1:PORT/charts --plain-http
    helm install neuronmodel oci://127.0.0.1:PORT/charts/neuronmodel-operator --version 0.1.0 --plain-http
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import children
from k8s import install
from k8s.cluster import _free_port, _get

START_TIMEOUT_S = 30


class Registry:
    """One registry process; `start()` returns the start-to-ready seconds, `address` is `127.0.0.1:PORT`."""

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self.log = self.data_dir / "registry.log"
        self.address = ""
        self._process: subprocess.Popen | None = None

    def start(self, die_with_parent: bool = False) -> float:
        binary = install.bin_dir() / "registry"
        if "registry" in install.missing():
            raise RuntimeError(f"the OCI registry is not installed ({binary}): run `make k8s-bin`")
        if self._process is not None:
            raise RuntimeError(f"the registry of {self.data_dir} is running: stop it first")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.address = f"127.0.0.1:{self._port()}"
        config = self.data_dir / "config.json"  # JSON is YAML
        config.write_text(json.dumps({
            "version": 0.1,
            "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(self.data_dir / "storage")}, "delete": {"enabled": True}},
            "http": {"addr": self.address},
        }, indent=1))
        # REGISTRY_* variables would override the config file's keys; OTEL_TRACES_EXPORTER: no traces to :4318.
        env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")} | {"OTEL_TRACES_EXPORTER": "none"}
        t0 = time.monotonic()
        with open(self.log, "wb") as log:
            self._process = subprocess.Popen([str(binary), "serve", str(config)], stdin=subprocess.DEVNULL,
                                             stdout=log, stderr=log, env=env, start_new_session=True,
                                             preexec_fn=children.die_with_parent if die_with_parent else None)
        deadline = time.monotonic() + START_TIMEOUT_S
        while _get(f"{self.url}/v2/")[0] != 200:
            if self._process.poll() is not None:
                rc, self._process = self._process.returncode, None
                tail = self.log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the registry exited {rc} at start; its log ({self.log}) ends:\n{tail}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the registry did not answer {self.url}/v2/ in {START_TIMEOUT_S} s; log {self.log}")
            time.sleep(0.1)
        return time.monotonic() - t0

    def _port(self) -> int:
        """The port this storage was last served on, when it is free, else a free one (remembered in `port`).

        Pushers know a registry by its address: buildah's blob-info cache remembers which layers `127.0.0.1:PORT`
        holds, so a push to the same address of an image whose big layers are there already skips them without
        compressing them again (runtime-cpu's torch layer: about 80 s of gzip)."""
        remembered = self.data_dir / "port"
        if remembered.exists() and remembered.read_text().strip().isdigit():
            port = int(remembered.read_text())
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                    return port
                except OSError:
                    pass
        port = _free_port()
        remembered.write_text(f"{port}\n")
        return port

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self) -> None:
        """SIGTERM, SIGKILL after 10 s; the storage stays (the caller owns `data_dir`)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def tags(self, repository: str) -> list[str]:
        """The tags of `repository` (e.g. `charts/neuronmodel-operator`); [] when it holds none."""
        status, body = _get(f"{self.url}/v2/{repository}/tags/list")
        return sorted(body.get("tags") or []) if status == 200 else []

    def __enter__(self) -> "Registry":
        self.start(die_with_parent=True)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        sys.exit(__doc__)
    with contextlib.ExitStack() as stack:
        data_dir = Path(argv[0]) if argv else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        registry = Registry(data_dir)
        try:
            seconds = registry.start(die_with_parent=True)
        except (RuntimeError, TimeoutError) as err:
            sys.exit(f"registry: {err}")
        stack.callback(registry.stop)
        print(f"registry: serving {data_dir / 'storage'} on {registry.url} (ready in {seconds:.1f} s); Ctrl-C stops it")
        print(f"  helm push <chart>.tgz oci://{registry.address}/charts --plain-http", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while registry.running():
                time.sleep(1)


if __name__ == "__main__":
    main(sys.argv[1:])
