"""`neuronmodel-operator` as a subprocess of a test or a benchmark, against a local control plane."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class OperatorProcess:
    """The operator of this checkout's venv, watching every namespace with `kubeconfig`, logging to `log`.

    `image`: passed as --runtime-image (None: not passed, the env decides). `env`: the operator's environment as a
    Deployment would set it (the chart's); given, the `NEURONMODEL_*` variables of this process are not inherited.
    `allow_host_path`: passed as --allow-host-path (the default: the tests serve the tiny model from a node path)
    or --no-allow-host-path, over the env's setting.
    """

    def __init__(self, kubeconfig: Path, log: Path, image: str | None, *args: str, env: dict[str, str] | None = None,
                 allow_host_path: bool = True):
        self.kubeconfig, self.log, self.image, self.args, self.env = kubeconfig, log, image, args, env
        self.allow_host_path = allow_host_path
        self.process: subprocess.Popen | None = None
        self.metrics_port: int | None = None

    def start(self, timeout: float = 90) -> None:
        """Start it and return once kopf answers its liveness probe (it does once it is watching)."""
        liveness = f"http://127.0.0.1:{_free_port()}/healthz"
        self.metrics_port = _free_port()  # its /metrics: operators started at once must not share a port
        exe = Path(sys.executable).parent / "neuronmodel-operator"
        env = dict(os.environ)
        if self.env is not None:
            env = {k: v for k, v in env.items() if not k.startswith("NEURONMODEL_")} | self.env
        image = ["--runtime-image", self.image] if self.image else []
        host_path = "--allow-host-path" if self.allow_host_path else "--no-allow-host-path"
        with self.log.open("a") as out:
            self.process = subprocess.Popen(
                [str(exe), "--kubeconfig", str(self.kubeconfig), "--liveness", liveness,
                 "--metrics-port", str(self.metrics_port), *image, host_path, *self.args],
                stdout=out, stderr=subprocess.STDOUT, env={**env, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(liveness, timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"neuronmodel-operator did not start; log tail:\n{self.tail()}")
            time.sleep(0.2)

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill would: no cleanup runs."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
