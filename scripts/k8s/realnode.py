"""An optional real node for the local control plane: kubelet + containerd + runc + CNI bridge + kube-proxy.

    PYTHONPATH=scripts python -m k8s.realnode up      # control plane (.cluster/) + the node; prints KUBECONFIG
    PYTHONPATH=scripts python -m k8s.realnode down    # removes the node (state in $TMPDIR/neuronmodel-realnode)

What it runs (all from the pinned v1.34.4 build of `k8s.install` and Debian 12 packages; the files each daemon
reads are made by `k8s.realnode_config`):
  * containerd 1.6 with its own config, root, state and socket under the node's data dir; the CRI plugin with
    runc through a wrapper that clamps `oomScoreAdj` up to containerd's own (this sandbox forbids lowering it:
    runc fails with "can't get final child's PID from pipe"); cgroupfs; the locally built pause image
    (`k8s.pause`); netns under the state dir; plain-http registries through `hosts.toml` (`registries=`);
  * the kubelet as `system:node:<name>` (group `system:nodes`, through the Node authorizer): its client and
    serving certificates come from CSRs signed by the controller-manager's signers (the control plane's CA);
    webhook authentication/authorization, so `kubectl logs/exec` work; node IP on a dummy link of its own
    (the kubelet refuses a loopback node IP);
  * a pod network: the CNI bridge plugin on a bridge of its own, host-local IPAM on a private /24, no
    masquerade, no route out of the pods beyond the pod subnet and the Service CIDR, and an iptables chain
    (`NEURONMODEL-POD-EGRESS`) that rejects whatever a pod sends off its bridge all the same;
  * kube-proxy in iptables mode as `system:kube-proxy`, so Service ClusterIPs work from pods and from the host;
  * a cluster DNS (`k8s.realnode_dns`) on the bridge's address, the kubelet's clusterDNS: Service and headless-
    Service pod names (a LeaderWorkerSet's LWS_LEADER_ADDRESS) resolve in the pods;
  * the `kubernetes` Service for in-cluster clients (an operator pod): its Endpoints/EndpointSlice name the node IP,
    where a forwarder passes TCP to the apiserver's 127.0.0.1 port (the apiserver binds loopback only and runs
    `--endpoint-reconciler-type=none`; its serving cert names 10.96.0.1 and kubernetes.default.svc).

Placement: the node poses as a CPU node (`node.kubernetes.io/instance-type=m5.xlarge`, what the operator's
torch pods select) and carries `neuronmodel.dev/real-node=true` as a label and as a NoSchedule taint: a pod
lands here only if it tolerates the taint; to land nowhere else it also selects the label (the kwok m5 node
matches the instance type too). kwok manages only `type=kwok` nodes, so it never touches this one.

Cleanup (`stop()`, atexit, and a reaper process that the harness's death wakes through PR_SET_PDEATHSIG)
kills every process in the node's cgroup (daemons, shims, pods), lazily unmounts everything under the data
dir, removes the cgroups, links (dummy, bridge, veths), the `KUBE-*` iptables chains (checked absent at start),
the CNI result cache and log symlinks it wrote outside its dir, then the data dir. It acts from `state.json`,
which records what the node created before it creates it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from children import die_with_parent
from k8s import cluster, install, pause
from k8s import realnode_config
from k8s import realnode_host as host
from k8s.cluster import ControlPlane, _alive, _free_port, _get

DEFAULT_DIR = Path(tempfile.gettempdir()) / "neuronmodel-realnode"
START_TIMEOUT_S = 120
TAINT = {"key": "neuronmodel.dev/real-node", "value": "true", "effect": "NoSchedule"}
TOLERATION = {"key": TAINT["key"], "operator": "Equal", "value": "true", "effect": "NoSchedule"}
LABELS = {
    "neuronmodel.dev/real-node": "true",
    "node.kubernetes.io/instance-type": "m5.xlarge",
    "karpenter.k8s.aws/instance-family": "m5",
    "karpenter.sh/capacity-type": "on-demand",
    "topology.kubernetes.io/region": "us-west-2",
    "topology.kubernetes.io/zone": "us-west-2a",
}
#: The `kubernetes` Service's endpoint on the node IP: a forwarder to the apiserver's 127.0.0.1 port.
API_PORT = 6443
# outside the node's dir: what containerd's CNI library and the kubelet write at fixed paths
CNI_CACHE = Path("/var/lib/cni")
CONTAINER_LOG_LINKS = Path("/var/log/containers")
SHIM_SOCKETS = Path("/run/containerd")

class RealNode:
    """One real node joined to `plane`; `start()` returns the start-to-Ready seconds."""

    def __init__(self, plane: ControlPlane | None, data_dir: Path = DEFAULT_DIR, name: str = "nm-node0",
                 node_ip: str = "10.213.0.1", pod_cidr: str = "10.244.0.0/24", registries: tuple[str, ...] = ()):
        self.plane, self.data_dir, self.name = plane, Path(data_dir), name
        self.node_ip, self.pod_cidr = node_ip, pod_cidr
        self.gateway = pod_cidr.rsplit(".", 1)[0] + ".1"
        self.registries = tuple(registries)  # host:port of plain-http registries containerd may pull from
        self.dummy, self.bridge = name[:15], f"{name[:10]}-br"
        self.cgroup = f"neuronmodel-{name}"
        self.network = f"neuronmodel-{name}"
        self.socket = self.data_dir / "containerd" / "containerd.sock"
        self.kubeconfig = self.data_dir / "kubelet.kubeconfig"
        self.images: dict[str, str] = {}  # what -> image name, once imported
        self.timings: dict[str, float] = {}
        self._die_with_parent = False
        self._children: list[subprocess.Popen] = []
        self._memory: dict = {}

    # --- lifecycle ---------------------------------------------------------------------------------
    def start(self, die_with_parent: bool = False) -> float:
        problems = self.preflight()
        if problems:
            raise RuntimeError("the real node cannot start: " + "; ".join(problems))
        self._die_with_parent = die_with_parent
        t0 = time.monotonic()
        (self.data_dir / "logs").mkdir(parents=True)
        self._record(name=self.name, cgroup=self.cgroup, network=self.network, links=[], pids={},
                     outside={str(p): p.exists() for p in (CNI_CACHE, CNI_CACHE / "results", CONTAINER_LOG_LINKS,
                                                          SHIM_SOCKETS, SHIM_SOCKETS / "s")},
                     shim_sockets_before=sorted(os.listdir(SHIM_SOCKETS / "s"))
                     if (SHIM_SOCKETS / "s").exists() else [])
        try:
            if die_with_parent:
                self._start_reaper()
            self._make_network()
            host.make_cgroup(self.cgroup)
            for leaf in ("daemons",):
                (host.tracking_hierarchy() / self.cgroup / leaf).mkdir(exist_ok=True)
            self._issue_certificates()
            self.timings["certificates"] = time.monotonic() - t0
            self._start_containerd()
            self.timings["containerd"] = time.monotonic() - t0
            self._start_dns()
            self._start_kubelet()
            self._start_kube_proxy()
            self._start_api_forwarder()
            self._wait("node Ready", self.ready)
        except BaseException:
            self.stop(remove=False)
            raise
        self.timings["ready"] = time.monotonic() - t0
        return self.timings["ready"]

    def preflight(self) -> list[str]:
        """Why the node cannot start here (an empty list: it can)."""
        problems = []
        if os.geteuid() != 0:
            problems.append("it needs root (links, mounts, cgroups, iptables)")
        if missing := install.missing(node=True):
            problems.append(f"binaries missing ({', '.join(missing)}): run `make k8s-bin`")
        if packages := install.missing_node_packages():
            problems.append(f"Debian packages missing ({', '.join(packages)}): run "
                            "`PYTHONPATH=scripts python -m k8s.realnode packages` as root")
        if self._state().get("pids") or self.data_dir.exists():
            problems.append(f"{self.data_dir} exists (a node is running or was not cleaned up): "
                            "`PYTHONPATH=scripts python -m k8s.realnode down`")
        for link in (self.dummy, self.bridge):
            if host.link_exists(link):
                problems.append(f"a link named {link} exists and is not this node's")
        if host.cgroups_left(self.cgroup):
            problems.append(f"cgroup {self.cgroup} exists")
        if not problems and (chains := host.chains()):
            problems.append(f"iptables chains this node would make exist already: {', '.join(chains[:5])}")
        return problems

    def stop(self, remove: bool = True, keep_logs: bool = False) -> None:
        """Remove every process, mount, cgroup, link, iptables chain and file the node made.

        `remove=False` keeps the data dir (a restart reuses it); `keep_logs` removes all of it but `logs/` (what a
        killed harness leaves: its containerd store holds the pulled images, gigabytes).
        """
        state = self._state()
        if not state:
            return
        for name in ("kube-proxy", "kubelet"):  # let them exit first (no new pods, no new rules)
            pid = state.get("pids", {}).get(name)
            if pid and _alive(pid) and pid in host.cgroup_pids(state["cgroup"]):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        host.kill_cgroup(state["cgroup"])
        for child in self._children:
            child.poll()
        host.unmount_under(self.data_dir)
        host.remove_cgroups(state["cgroup"])
        bridge = state.get("bridge")
        host.delete_links(host.bridge_ports(bridge) if bridge else [])
        host.delete_links(list(reversed(state.get("links", []))))
        host.remove_chains()
        self._remove_outside(state)
        reaper = state.get("reaper")
        if reaper and reaper != os.getpid() and _alive(reaper):
            with contextlib.suppress(ProcessLookupError):
                os.kill(reaper, signal.SIGKILL)
        if host.mounts_under(self.data_dir):
            raise RuntimeError(f"mounts remain under {self.data_dir}; not removing it")
        if remove:
            doomed = [c for c in self.data_dir.iterdir() if c.name != "logs"] if keep_logs else [self.data_dir]
            subprocess.run(["rm", "-rf", "--one-file-system", *map(str, doomed)], check=False)
            self._memory = {}
        else:
            self._record(pids={}, reaper=None)

    def leftovers(self) -> dict[str, list[str]]:
        """What of the node remains on this machine (all empty after `stop()`)."""
        cgroup = self.cgroup
        return {
            "processes": [str(p) for p in host.cgroup_pids(cgroup)],
            "mounts": host.mounts_under(self.data_dir),
            "cgroups": host.cgroups_left(cgroup),
            "links": [n for n in (self.dummy, self.bridge) if host.link_exists(n)],
            "iptables chains": host.chains(),
            "cni results": [p.name for p in self._cni_results()],
            "netns": [line for line in self._netns_mounts()],
        }

    # --- for tests ---------------------------------------------------------------------------------
    def ready(self) -> bool:
        status, body = self.plane.get(f"/api/v1/nodes/{self.name}")
        return status == 200 and any(c["type"] == "Ready" and c["status"] == "True"
                                     for c in body.get("status", {}).get("conditions", []))

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run(["ctr", f"--address={self.socket}", "--namespace=k8s.io", *args],
                             capture_output=True, text=True, timeout=120)
        if check and out.returncode:
            raise RuntimeError(f"ctr {' '.join(args)} exited {out.returncode}: {out.stderr.strip()}")
        return out

    def import_image(self, archive: Path) -> None:
        """Load an OCI archive (e.g. from `k8s.pause`) into the node's containerd, unpacked."""
        self.ctr("images", "import", str(archive))

    # --- the pieces --------------------------------------------------------------------------------
    def _make_network(self) -> None:
        """The node's own address (dummy link) and the pods' bridge; recorded before each is made."""
        self._record(links=[self.dummy])
        self._record(node_ip_link=host.make_dummy(self.dummy, f"{self.node_ip}/32"))
        self._record(links=[self.dummy, self.bridge], bridge=self.bridge)
        host.make_bridge(self.bridge, f"{self.gateway}/{self.pod_cidr.split('/')[1]}")
        host.block_pod_egress(self.bridge)
        net = self.data_dir / "cni" / "net.d"
        net.mkdir(parents=True)
        (net / "10-neuronmodel.conflist").write_text(json.dumps(realnode_config.cni_network(self), indent=1))
        (self.data_dir / "resolv.conf").write_text("# the real node's pods: no DNS beyond this pod\n"
                                                   "nameserver 127.0.0.1\noptions ndots:1\n")

    def _issue_certificates(self) -> None:
        """Keys here; certificates from CSRs approved by the admin and signed by the controller-manager."""
        pki = self.data_dir / "pki"
        pki.mkdir()
        node_subject = f"/O=system:nodes/CN=system:node:{self.name}"
        wanted = {  # file stem -> (subject, signer, usages, subjectAltName)
            "kubelet-client": (node_subject, "kubernetes.io/kube-apiserver-client-kubelet", ["client auth"], None),
            "kubelet-serving": (node_subject, "kubernetes.io/kubelet-serving", ["server auth"],
                                f"IP:{self.node_ip},DNS:{self.name}"),
            "kube-proxy": ("/CN=system:kube-proxy", "kubernetes.io/kube-apiserver-client", ["client auth"], None),
        }
        suffix = secrets.token_hex(3)
        names = {}
        for stem, (subject, signer, usages, san) in wanted.items():
            cmd = ["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                   "-keyout", f"{stem}.key", "-out", f"{stem}.csr", "-subj", subject]
            subprocess.run(cmd + (["-addext", f"subjectAltName={san}"] if san else []), cwd=pki, check=True,
                           capture_output=True)
            names[stem] = f"{self.name}-{stem}-{suffix}"
            self.plane.kubectl("create", "-f", "-", stdin=json.dumps({
                "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
                "metadata": {"name": names[stem]},
                "spec": {"request": base64.b64encode((pki / f"{stem}.csr").read_bytes()).decode(),
                         "signerName": signer, "usages": ["digital signature", *usages]}}))
        self.plane.kubectl("certificate", "approve", *names.values())
        for stem, csr in names.items():
            path = f"/apis/certificates.k8s.io/v1/certificatesigningrequests/{csr}"
            cert = self._wait(f"certificate {csr}", lambda path=path: self.plane.get(path)[1].get("status", {})
                              .get("certificate"))
            (pki / f"{stem}.crt").write_bytes(base64.b64decode(cert))
        self.plane.kubectl("delete", "csr", *names.values())
        self._kubeconfig(self.kubeconfig, "kubelet-client")
        self._kubeconfig(self.data_dir / "kube-proxy.kubeconfig", "kube-proxy")

    def _kubeconfig(self, path: Path, stem: str) -> None:
        path.write_text(json.dumps(realnode_config.kubeconfig(self, stem), indent=1))
        path.chmod(0o600)

    def _start_containerd(self) -> None:
        d = self.data_dir / "containerd"
        (d / "certs.d").mkdir(parents=True)
        wrapper = self.data_dir / "bin" / "runc"
        wrapper.parent.mkdir()
        python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
        wrapper.write_text(realnode_config.RUNC_WRAPPER.replace("{python}", python)
                           .replace("{runc}", "/usr/sbin/runc"))
        wrapper.chmod(0o755)
        for registry in self.registries:
            (d / "certs.d" / registry).mkdir(parents=True)
            (d / "certs.d" / registry / "hosts.toml").write_text(realnode_config.registry_hosts(registry))
        (d / "config.toml").write_text(realnode_config.containerd_config(self, wrapper))
        self._spawn("containerd", "/usr/bin/containerd", f"--config={d / 'config.toml'}", "--log-level=warn")
        self._wait("containerd", lambda: self.ctr("version", check=False).returncode == 0)
        self.import_image(pause.pause_archive())
        busybox, name = pause.busybox_archive()
        self.import_image(busybox)
        self.images = {"pause": pause.PAUSE_IMAGE, "busybox": name}

    def _start_kubelet(self) -> None:
        pki = self.data_dir / "pki"
        port, healthz = _free_port(), _free_port()
        config = self.data_dir / "kubelet-config.json"
        config.write_text(json.dumps(realnode_config.kubelet_config(self, port, healthz, [TAINT]), indent=1))
        labels = ",".join(f"{k}={v}" for k, v in LABELS.items())
        self._spawn("kubelet", str(install.bin_dir() / "kubelet"), f"--config={config}",
                    f"--kubeconfig={self.kubeconfig}", f"--root-dir={self.data_dir / 'kubelet'}",
                    f"--cert-dir={pki}", f"--hostname-override={self.name}", f"--node-ip={self.node_ip}",
                    f"--node-labels={labels}", "--v=1")
        self._wait("kubelet healthz", lambda: _get(f"http://127.0.0.1:{healthz}/healthz")[0] == 200)

    def _start_kube_proxy(self) -> None:
        healthz, metrics = _free_port(), _free_port()
        config = self.data_dir / "kube-proxy-config.json"
        config.write_text(json.dumps(realnode_config.kube_proxy_config(self, healthz, metrics), indent=1))
        self._spawn("kube-proxy", str(install.bin_dir() / "kube-proxy"), f"--config={config}", "--v=1")
        self._wait("kube-proxy healthz", lambda: _get(f"http://127.0.0.1:{healthz}/healthz")[0] == 200)

    def _start_api_forwarder(self) -> None:
        """In-cluster clients (KUBERNETES_SERVICE_HOST=10.96.0.1:443) reach the apiserver through the `kubernetes`
        Service: its endpoint (written here; the apiserver runs `--endpoint-reconciler-type=none`) is a forwarder on
        the node IP to the apiserver's 127.0.0.1 port. kube-proxy DNATs the ClusterIP to it; the pods' own routes
        still end at the pod subnet and the Service CIDR. The serving cert names the ClusterIP (`k8s.cluster`)."""
        forwarder = self.data_dir / "bin" / "api-forwarder"
        python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
        forwarder.write_text(realnode_config.API_FORWARDER.replace("{python}", python))
        forwarder.chmod(0o755)
        api = self.plane.server.removeprefix("https://")
        self._spawn("api-forwarder", str(forwarder), f"{self.node_ip}:{API_PORT}", api)
        self._wait("api forwarder", lambda: "forwarding" in (self.data_dir / "logs" / "api-forwarder.log").read_text())
        address, port = [{"ip": self.node_ip}], [{"name": "https", "port": API_PORT, "protocol": "TCP"}]
        self.plane.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=neuronmodel-realnode",
                           "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Endpoints",  # what older clients read; not mirrored into a slice
             "metadata": {"name": "kubernetes", "namespace": "default",
                          "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
             "subsets": [{"addresses": address, "ports": port}]},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",  # what kube-proxy reads
             "metadata": {"name": "kubernetes", "namespace": "default",
                          "labels": {"kubernetes.io/service-name": "kubernetes",
                                     "endpointslice.kubernetes.io/managed-by": "neuronmodel-realnode"}},
             "addressType": "IPv4", "ports": port,
             "endpoints": [{"addresses": [self.node_ip], "conditions": {"ready": True}}]}]}))

    def _start_dns(self) -> None:
        """The cluster DNS (k8s.realnode_dns) on the bridge's gateway address, which the pods reach on link."""
        env_path = str(Path(__file__).resolve().parents[1])
        self._spawn("dns", "/usr/bin/env", f"PYTHONPATH={env_path}", sys.executable, "-m", "k8s.realnode_dns",
                    f"--kubeconfig={self.plane.kubeconfig}", f"--listen={self.gateway}")
        self._wait("cluster DNS", lambda: "serving" in (self.data_dir / "logs" / "dns.log").read_text())

    def _start_reaper(self) -> None:
        """A process that cleans up from state.json when the harness dies (PR_SET_PDEATHSIG), even by SIGKILL."""
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        proc = subprocess.Popen([sys.executable, "-m", "k8s.realnode", "reap", str(self.data_dir)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=open(self.data_dir / "logs" / "reaper.log", "wb"), env=env,
                                start_new_session=True, preexec_fn=die_with_parent)
        self._children.append(proc)
        self._record(reaper=proc.pid)

    # --- plumbing ----------------------------------------------------------------------------------
    def _spawn(self, name: str, binary: str, *args: str) -> None:
        cgroup, die = self.cgroup, self._die_with_parent

        def preexec() -> None:
            host.join_cgroup(cgroup, "daemons")
            if die:
                die_with_parent()

        with open(self.data_dir / "logs" / f"{name}.log", "wb") as log:
            proc = subprocess.Popen([binary, *args], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    start_new_session=True, preexec_fn=preexec)
        self._children.append(proc)
        self._record(pids=self._state().get("pids", {}) | {name: proc.pid})

    def _wait(self, what: str, ready):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for name, pid in self._state().get("pids", {}).items():
                if not _alive(pid):
                    log = (self.data_dir / "logs" / f"{name}.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{name} exited while waiting for {what}; its log ends:\n{log}")
            if result := ready():
                return result
            time.sleep(0.2)
        raise TimeoutError(f"{what} not ready after {START_TIMEOUT_S} s; logs in {self.data_dir / 'logs'}")

    def _state(self) -> dict:
        """What the node made: state.json, or this object's copy if the file went (a tmp dir cleaner)."""
        path = self.data_dir / "state.json"
        with contextlib.suppress(OSError, ValueError):
            return json.loads(path.read_text())
        return dict(self._memory)

    def _record(self, **fields) -> None:
        self._memory = self._state() | fields
        path = self.data_dir / "state.json"
        with contextlib.suppress(FileNotFoundError):
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._memory, indent=1))
            tmp.replace(path)

    def _netns_mounts(self) -> list[str]:
        return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                if "nsfs" in line and line.split()[4].startswith(str(self.data_dir))]

    def _cni_results(self) -> list[Path]:
        """containerd's CNI result cache files (its network's and the loopback's) of this node's netns."""
        results, ours = CNI_CACHE / "results", []
        for path in sorted(results.iterdir()) if results.exists() else []:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                interfaces = json.loads(path.read_text()).get("result", {}).get("interfaces", [])
                if path.name.startswith(self.network + "-") or any(
                        str(i.get("sandbox", "")).startswith(str(self.data_dir) + "/") for i in interfaces):
                    ours.append(path)
        return ours

    def _remove_outside(self, state: dict) -> None:
        """The files the CNI library, the kubelet and the shims wrote at fixed paths, then dirs they created."""
        for path in self._cni_results():
            path.unlink(missing_ok=True)
        if CONTAINER_LOG_LINKS.exists():
            for link in CONTAINER_LOG_LINKS.iterdir():
                if link.is_symlink() and os.readlink(link).startswith(str(self.data_dir) + "/"):
                    link.unlink(missing_ok=True)
        sockets = SHIM_SOCKETS / "s"
        before = set(state.get("shim_sockets_before", []))
        for sock in sockets.iterdir() if sockets.exists() else []:
            if sock.name not in before and sock.is_socket() and not _listening(sock):
                sock.unlink(missing_ok=True)
        outside = state.get("outside", {})
        for path in sorted(outside, key=len, reverse=True):  # the dirs that did not exist before, if now empty
            if not outside[path]:
                with contextlib.suppress(OSError):
                    Path(path).rmdir()


def _listening(sock: Path) -> bool:
    import socket

    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(sock))
            return True
        except OSError:
            return False


def _reap(data_dir: Path) -> None:
    """The reaper: wait for SIGTERM (the harness died), then clean up everything state.json names but the logs."""
    def cleanup(*_):
        RealNode(None, data_dir, name=json.loads((data_dir / "state.json").read_text())["name"]).stop(keep_logs=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, cleanup)
    if os.getppid() == 1:  # the harness died before PR_SET_PDEATHSIG was armed
        cleanup()
    while True:
        signal.pause()


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in ("up", "down", "packages", "reap"):
        sys.exit(__doc__)
    if argv[0] == "packages":
        install.ensure_node_packages()
        return
    if argv[0] == "reap":
        _reap(Path(argv[1]))
        return
    data_dir = Path(argv[1]) if len(argv) > 1 else DEFAULT_DIR
    if argv[0] == "down":
        state = json.loads((data_dir / "state.json").read_text()) if (data_dir / "state.json").exists() else {}
        if state:
            RealNode(None, data_dir, name=state["name"]).stop()
            print(f"realnode: stopped {state['name']}; removed {data_dir}")
        return
    install.ensure_node_packages()
    plane = cluster.up(cluster.DEFAULT_DIR)
    node = RealNode(plane, data_dir)
    try:
        seconds = node.start()
    except (RuntimeError, TimeoutError) as err:
        sys.exit(f"realnode: {err}")
    print(f"realnode: {node.name} Ready in {seconds:.1f} s (node IP {node.node_ip}, pods {node.pod_cidr}, "
          f"taint {TAINT['key']}={TAINT['value']}:{TAINT['effect']}); state in {data_dir}")
    print(f"export KUBECONFIG={plane.kubeconfig}")


if __name__ == "__main__":
    main(sys.argv[1:])
