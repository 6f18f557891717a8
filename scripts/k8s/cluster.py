"""Start and stop a local control plane from the binaries that `k8s.install` put in the cache.

    PYTHONPATH=scripts python -m k8s.cluster up [DIR]     # prints `export KUBECONFIG=DIR/kubeconfig`
    PYTHONPATH=scripts python -m k8s.cluster down [DIR]   # stops exactly the PIDs `up` started, removes DIR

Everything listens on free ports of 127.0.0.1: etcd, kube-apiserver (TLS from a throw-away CA, a
static admin token in `system:masters`, RBAC + Node authorization, service-account issuer and keys
so TokenRequest works), kube-controller-manager, kube-scheduler, kwok (acting as the kubelet of the
fake Neuron nodes of `k8s.nodes`) and the LeaderWorkerSet controller with its CRD and webhooks.
The scheduler has a second profile, `my-scheduler`, standing in for the Neuron scheduler extension
(`scheduler_configuration`). `DIR` (default `.cluster/`) holds the PKI, the kubeconfig, `pids.json` and `logs/`.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from children import die_with_parent
from k8s import install, lws, nodes

DEFAULT_DIR = Path(__file__).resolve().parents[2] / ".cluster"
START_TIMEOUT_S = 120
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"  # the first address of SERVICE_CIDR
#: The Neuron Helm chart's scheduler extension's name (the operator's default --neuron-scheduler-name)
NEURON_SCHEDULER_NAME = "my-scheduler"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _same_binary(pid: int, binary: str) -> bool:
    """Guards against a recycled PID: is `pid` still running `binary`?"""
    try:
        return Path(os.readlink(f"/proc/{pid}/exe")).resolve() == Path(binary).resolve()
    except OSError:
        return False


def scheduler_configuration(kubeconfig: Path) -> dict:
    """kube-scheduler's configuration: the default profile, and a second one named like the Neuron scheduler
    extension's scheduler (`my-scheduler`, what the operator gives pods that take part of a node's NeuronCores).

    The second profile stands in for the extension, which on EKS runs as a second scheduler that filters nodes
    through the Neuron scheduler extender; here it is a plain scheduler under that name, so that such pods are
    scheduled (kwok's nodes have no devices whose contiguity would matter) instead of waiting for a scheduler that
    does not exist. The client settings are here: kube-scheduler ignores --kubeconfig and --leader-elect once it
    has --config.
    """
    return {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)}, "leaderElection": {"leaderElect": False},
            "profiles": [{"schedulerName": "default-scheduler"}, {"schedulerName": NEURON_SCHEDULER_NAME}]}


def _get(url: str, context: ssl.SSLContext | None = None, headers: dict | None = None) -> tuple[int, dict]:
    """GET `url`: (HTTP status or 0 if unreachable, decoded JSON body or {})."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5,
                                    context=context) as resp:
            body = resp.read()
            return resp.status, json.loads(body) if body.startswith(b"{") else {}
    except urllib.error.HTTPError as err:
        return err.code, {}
    except (OSError, ValueError):
        return 0, {}


class ControlPlane:
    """One control plane whose state lives in `data_dir`; `start()` returns the start-to-ready seconds."""

    def __init__(self, data_dir: Path = DEFAULT_DIR):
        self.data_dir = Path(data_dir)
        self.kubeconfig = self.data_dir / "kubeconfig"
        self.pki = self.data_dir / "pki"
        self.server = ""
        self.admin_token = ""
        self._die_with_parent = False
        self._children: dict[int, subprocess.Popen] = {}
        self._commands: dict[str, tuple[tuple[str, ...], dict[str, str] | None]] = {}  # name -> how _spawn ran it

    # --- lifecycle ---------------------------------------------------------------------------------
    def start(self, die_with_parent: bool = False) -> float:
        """Start everything and wait until it is ready; on any failure stop what was started."""
        missing = install.missing()
        if missing:
            raise RuntimeError(f"control-plane binaries missing ({', '.join(missing)}): run `make k8s-bin`")
        if any(_alive(pid) for pid, _ in self._pids().values()):
            raise RuntimeError(f"a control plane from {self.data_dir} is running: stop it first (make cluster-down)")
        shutil.rmtree(self.data_dir, ignore_errors=True)
        (self.data_dir / "logs").mkdir(parents=True)
        self._die_with_parent = die_with_parent
        t0 = time.monotonic()
        try:
            self._write_pki()
            self._start_etcd_and_apiserver()
            self._start_controllers()
            self._start_lws()
        except BaseException:
            self.stop(remove=False)  # keep the logs
            raise
        return time.monotonic() - t0

    def stop(self, remove: bool = True) -> None:
        """SIGTERM each recorded process (newest first), SIGKILL after 10 s; remove `data_dir` if asked."""
        pids = self._pids()
        for pid, binary in reversed(list(pids.values())):
            if _alive(pid) and _same_binary(pid, binary):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for pid, binary in pids.values():
            while _alive(pid) and time.monotonic() < deadline:
                self._reap(pid)
                time.sleep(0.1)
            if _alive(pid) and _same_binary(pid, binary):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self._reap(pid)
        if remove:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def restart(self, *names: str) -> None:
        """Stop the named components (last named first: `restart("etcd", "kube-apiserver")` takes the API server
        down before its store) and start them again with the same flags, ports and data, first named first; return
        once the API server is ready. What a node reboot or a control-plane upgrade does to its clients."""
        pids = self._pids()
        for name in reversed(names):
            pid, binary = pids[name]
            if _alive(pid) and _same_binary(pid, binary):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                self._reap(pid)
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
                while _alive(pid):
                    self._reap(pid)
                    time.sleep(0.1)
        for name in names:
            args, env = self._commands[name]
            self._spawn(name, *args, env=env)
        self._wait("kube-apiserver", lambda: self.get("/readyz")[0] == 200)

    @contextlib.contextmanager
    def paused(self, name: str):
        """SIGSTOP the component for the block, SIGCONT after: kwok paused is a kubelet that reports nothing (a pod
        stays as the test leaves it). Keep it short: paused kwok renews no node Lease (40 s)."""
        pid, binary = self._pids()[name]
        if not _same_binary(pid, binary):
            raise RuntimeError(f"{name} (pid {pid}) is not running")
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)

    # --- for tests ---------------------------------------------------------------------------------
    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """Run kubectl as admin; with `check`, a non-zero exit raises with kubectl's stderr."""
        out = subprocess.run([str(install.bin_dir() / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
                             input=stdin, capture_output=True, text=True, timeout=120)
        if check and out.returncode:
            raise RuntimeError(f"kubectl {' '.join(args)} exited {out.returncode}: {out.stderr.strip()}")
        return out

    def get(self, path: str) -> tuple[int, dict]:
        """GET `path` from the apiserver as admin: (HTTP status, decoded JSON body)."""
        return _get(self.server + path, ssl.create_default_context(cafile=self.pki / "ca.crt"),
                    {"Authorization": f"Bearer {self.admin_token}"})

    def write_kubeconfig(self, path: Path, token: str) -> None:
        """A kubeconfig for this cluster that authenticates with the bearer `token`."""
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "neuronmodel",
            "clusters": [{"name": "neuronmodel", "cluster": {
                "server": self.server, "certificate-authority": str(self.pki / "ca.crt")}}],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [{"name": "neuronmodel", "context": {"cluster": "neuronmodel", "user": "user"}}],
        }
        path.write_text(json.dumps(config, indent=1))  # JSON is YAML
        path.chmod(0o600)

    # --- the components ----------------------------------------------------------------------------
    def _write_pki(self) -> None:
        """A CA, one serving cert for 127.0.0.1 (apiserver, LWS webhooks), the SA key pair, the admin token."""
        self.pki.mkdir()

        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], cwd=self.pki, check=True, capture_output=True)

        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
                "-days", "3650", "-subj", "/CN=neuronmodel-test-ca")
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.crt",
                "-days", "3650", "-subj", "/CN=127.0.0.1", "-CA", "ca.crt", "-CAkey", "ca.key",
                # the `kubernetes` Service's ClusterIP and names too: in-cluster clients of the real node's pods
                # (k8s.realnode forwards the Service to 127.0.0.1) verify the serving cert against them
                "-addext", f"subjectAltName=IP:127.0.0.1,DNS:localhost,IP:{KUBERNETES_SERVICE_IP},"
                           "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,"
                           "DNS:kubernetes.default.svc.cluster.local",
                "-addext", "basicConstraints=critical,CA:FALSE")
        # the apiserver's client cert for kubelets (logs, exec, port-forward of the optional real node, k8s.realnode)
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "kubelet-client.key",
                "-out", "kubelet-client.crt", "-days", "3650",
                "-subj", "/O=system:masters/CN=kube-apiserver-kubelet-client",
                "-CA", "ca.crt", "-CAkey", "ca.key", "-addext", "extendedKeyUsage=clientAuth",
                "-addext", "basicConstraints=critical,CA:FALSE")
        openssl("genpkey", "-algorithm", "RSA", "-out", "sa.key")
        openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        self.admin_token = secrets.token_hex(24)
        (self.pki / "tokens.csv").write_text(f'{self.admin_token},admin,admin-uid,"system:masters"\n')

    def _start_etcd_and_apiserver(self) -> None:
        etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
        etcd, peer = f"http://127.0.0.1:{etcd_port}", f"http://127.0.0.1:{peer_port}"
        self._spawn("etcd", "--name=default", f"--data-dir={self.data_dir / 'etcd'}",
                    f"--listen-client-urls={etcd}", f"--advertise-client-urls={etcd}", f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}", f"--initial-cluster=default={peer}",
                    "--unsafe-no-fsync=true", "--log-level=warn")
        self._wait("etcd", lambda: _get(etcd + "/health")[1].get("health") == "true")
        self.server = f"https://127.0.0.1:{api_port}"
        pki = self.pki
        self._spawn("kube-apiserver", f"--etcd-servers={etcd}",
                    "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={api_port}",
                    f"--tls-cert-file={pki / 'tls.crt'}", f"--tls-private-key-file={pki / 'tls.key'}",
                    f"--client-ca-file={pki / 'ca.crt'}", f"--token-auth-file={pki / 'tokens.csv'}",
                    "--authorization-mode=Node,RBAC", "--allow-privileged=true",
                    "--enable-admission-plugins=NodeRestriction",  # a node identity edits only its own Node (EKS's)
                    f"--service-cluster-ip-range={SERVICE_CIDR}", "--endpoint-reconciler-type=none",
                    f"--service-account-issuer={self.server}", f"--service-account-key-file={pki / 'sa.pub'}",
                    f"--service-account-signing-key-file={pki / 'sa.key'}", f"--cert-dir={pki}",
                    "--profiling=false",
                    # to kubelets (only the real node of k8s.realnode serves; kwok nodes have no kubelet endpoint):
                    # its node IP first (its hostname resolves nowhere), verified by the CA, as a system:masters client
                    "--kubelet-preferred-address-types=InternalIP,Hostname,InternalDNS,ExternalDNS,ExternalIP",
                    f"--kubelet-certificate-authority={pki / 'ca.crt'}",
                    f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
                    f"--kubelet-client-key={pki / 'kubelet-client.key'}")
        self._wait("kube-apiserver", lambda: self.get("/readyz")[0] == 200)
        self.write_kubeconfig(self.kubeconfig, self.admin_token)

    def _start_controllers(self) -> None:
        """controller-manager, scheduler, kwok and its nodes; ready once every node is Ready."""
        kcm_port, sched_port, pki = _free_port(), _free_port(), self.pki
        delegated = [f"--kubeconfig={self.kubeconfig}", f"--authentication-kubeconfig={self.kubeconfig}",
                     f"--authorization-kubeconfig={self.kubeconfig}", "--leader-elect=false",
                     "--bind-address=127.0.0.1"]
        self._spawn("kube-controller-manager", *delegated, f"--secure-port={kcm_port}",
                    f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
                    f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
                    "--use-service-account-credentials=true", "--controllers=*")
        scheduler_config = self.data_dir / "scheduler-config.json"
        scheduler_config.write_text(json.dumps(scheduler_configuration(self.kubeconfig), indent=1))
        self._spawn("kube-scheduler", f"--config={scheduler_config}", f"--authentication-kubeconfig={self.kubeconfig}",
                    f"--authorization-kubeconfig={self.kubeconfig}", "--bind-address=127.0.0.1",
                    f"--secure-port={sched_port}")
        self._spawn("kwok", f"--kubeconfig={self.kubeconfig}", f"--config={install.kwok_stages()}",
                    "--manage-all-nodes=false", f"--manage-nodes-with-label-selector={nodes.KWOK_SELECTOR}",
                    # the heartbeat stage renews node Leases (as kwokctl does): without them the node controller
                    # marks every node NotReady after its grace period (~50 s) and their pods unready
                    "--node-lease-duration-seconds=40")
        self._apply({"apiVersion": "v1", "kind": "List", "items": nodes.nodes()})
        insecure = ssl._create_unverified_context()  # the components' self-signed serving certs
        self._wait("kube-controller-manager", lambda: _get(f"https://127.0.0.1:{kcm_port}/healthz", insecure)[0] == 200)
        self._wait("kube-scheduler", lambda: _get(f"https://127.0.0.1:{sched_port}/readyz", insecure)[0] == 200)
        self._wait("kwok nodes Ready", self._nodes_ready)
        self._wait("default ServiceAccount",
                   lambda: self.get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200)

    def _start_lws(self) -> None:
        """The LWS CRD, then its controller, then (once it serves) the webhook registrations."""
        self.kubectl("apply", "--server-side", "--field-manager=neuronmodel-cluster", "-f", str(install.lws_crd()))
        self._wait("LeaderWorkerSet API", lambda: self.get("/apis/leaderworkerset.x-k8s.io/v1")[0] == 200)
        webhook_port, health_port = _free_port(), _free_port()
        config = self.data_dir / "lws-config.json"
        config.write_text(json.dumps(lws.controller_config(webhook_port, health_port, self.pki)))
        self._spawn("lws-controller", f"--config={config}", env={"KUBECONFIG": str(self.kubeconfig)})
        self._wait("lws-controller", lambda: _get(f"http://127.0.0.1:{health_port}/readyz")[0] == 200)
        webhooks = f"https://127.0.0.1:{webhook_port}/"
        self._wait("LWS webhook server", lambda: _get(webhooks, ssl.create_default_context(cafile=self.pki / "ca.crt"))[0])
        self._apply(lws.webhook_configurations(webhook_port, self.pki / "ca.crt"))

    # --- plumbing ----------------------------------------------------------------------------------
    def _apply(self, manifest: dict) -> None:
        self.kubectl("apply", "--server-side", "--field-manager=neuronmodel-cluster", "-f", "-",
                     stdin=json.dumps(manifest))

    def _spawn(self, name: str, *args: str, env: dict[str, str] | None = None) -> None:
        binary = str(install.bin_dir() / name)
        self._commands[name] = (args, env)
        with open(self.data_dir / "logs" / f"{name}.log", "ab") as log:  # a restart appends
            proc = subprocess.Popen([binary, *args], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    env={**os.environ, **(env or {})}, start_new_session=True,
                                    preexec_fn=die_with_parent if self._die_with_parent else None)
        self._children[proc.pid] = proc
        pids = self._pids() | {name: (proc.pid, binary)}
        (self.data_dir / "pids.json").write_text(json.dumps(pids, indent=1))

    def _pids(self) -> dict[str, tuple[int, str]]:
        path = self.data_dir / "pids.json"
        return {k: tuple(v) for k, v in json.loads(path.read_text()).items()} if path.exists() else {}

    def _reap(self, pid: int) -> None:
        if pid in self._children:
            self._children[pid].poll()

    def _wait(self, what: str, ready) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for name, (pid, _) in self._pids().items():
                if not _alive(pid):
                    log = (self.data_dir / "logs" / f"{name}.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{name} exited while waiting for {what}; its log ends:\n{log}")
            if ready():
                return
            time.sleep(0.2)
        raise TimeoutError(f"{what} not ready after {START_TIMEOUT_S} s; logs in {self.data_dir / 'logs'}")

    def _nodes_ready(self) -> bool:
        status, body = self.get("/api/v1/nodes?labelSelector=" + nodes.KWOK_SELECTOR)
        ready = [n for n in body.get("items", []) if any(
            c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))]
        return status == 200 and len(ready) == len(nodes.SHAPES)


def up(data_dir: Path) -> ControlPlane:
    """Start the control plane in `data_dir` and say how long it took (what `make cluster` prints); exits with
    the reason when it cannot start."""
    plane = ControlPlane(data_dir)
    try:
        seconds = plane.start()
    except (RuntimeError, TimeoutError) as err:
        sys.exit(f"cluster: {err}")
    print(f"cluster: {install.K8S_VERSION} ready in {seconds:.1f} s (start-to-ready: etcd, kube-apiserver, "
          f"controller-manager, scheduler, kwok with {len(nodes.SHAPES)} Ready nodes, LWS controller)")
    return plane


def main(argv: list[str]) -> None:
    if len(argv) not in (1, 2) or argv[0] not in ("up", "down"):
        sys.exit(__doc__)
    data_dir = Path(argv[1]) if len(argv) == 2 else DEFAULT_DIR
    if argv[0] == "down":
        ControlPlane(data_dir).stop()
        print(f"cluster: stopped; removed {data_dir}")
        return
    plane = up(data_dir)
    print(f"export KUBECONFIG={plane.kubeconfig}")


if __name__ == "__main__":
    main(sys.argv[1:])
