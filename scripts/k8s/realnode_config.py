"""The files the real node's daemons read (`k8s.realnode`), made from the node's settings: the runc wrapper and
the API forwarder (scripts, `{python}` and `{runc}` filled in by the node), containerd's config.toml and its
registries' hosts.toml, the CNI network, the kubeconfigs, the kubelet's and kube-proxy's configurations. Each function
returns a file's content (text, or a JSON document as a dict); `RealNode` writes it where the daemon reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from k8s import pause
from k8s.cluster import SERVICE_CIDR

if TYPE_CHECKING:
    from k8s.realnode import RealNode

RUNC_WRAPPER = '''#!{python} -IS
"""runc, with process.oomScoreAdj raised to this process's own (lowering it is forbidden in this sandbox)."""
import json, os, sys
args = sys.argv[1:]
try:
    floor = int(open("/proc/self/oom_score_adj").read())
except (OSError, ValueError):
    floor = 0
def value(flags):
    for i, arg in enumerate(args):
        for flag in flags:
            if arg == flag and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return None
def clamp(path, nested):
    try:
        with open(path) as f:
            spec = json.load(f)
    except (OSError, ValueError):
        return
    process = spec.get("process") if nested else spec
    if isinstance(process, dict) and process.get("oomScoreAdj", floor) < floor:
        process["oomScoreAdj"] = floor
        with open(path + ".clamped", "w") as f:
            json.dump(spec, f)
        os.replace(path + ".clamped", path)
if "create" in args or "run" in args:
    clamp(os.path.join(value(("--bundle", "-b")) or ".", "config.json"), True)
if "exec" in args and value(("--process", "-p")):
    clamp(value(("--process", "-p")), False)
os.execv("{runc}", ["runc", *args])
'''


API_FORWARDER = '''#!{python} -IS
"""TCP from the node IP to the apiserver's loopback port, byte for byte (TLS stays end to end)."""
import asyncio, sys
listen_host, listen_port = sys.argv[1].rsplit(":", 1)
target_host, target_port = sys.argv[2].rsplit(":", 1)
async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()
async def handle(reader, writer):
    try:
        up_reader, up_writer = await asyncio.open_connection(target_host, int(target_port))
    except OSError:
        writer.close()
        return
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
async def main():
    server = await asyncio.start_server(handle, listen_host, int(listen_port), reuse_address=True)
    print(f"forwarding {sys.argv[1]} -> {sys.argv[2]}", flush=True)
    async with server:
        await server.serve_forever()
asyncio.run(main())
'''


def _toml(value) -> str:
    return json.dumps(value)  # a JSON string, number, bool or list of strings is TOML


def registry_hosts(registry: str) -> str:
    """containerd's hosts.toml for a plain-http registry (`host:port`) it may pull from."""
    return f'server = "http://{registry}"\n\n[host."http://{registry}"]\n  capabilities = ["pull", "resolve"]\n'


def containerd_config(node: RealNode, wrapper: Path) -> str:
    """containerd's config.toml: everything under the node's data dir, the CRI plugin running `wrapper` as runc."""
    d = node.data_dir / "containerd"
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = {_toml(str(d / "root"))}
state = {_toml(str(d / "state"))}
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = {_toml(str(node.socket))}
[ttrpc]
  address = {_toml(str(node.socket) + ".ttrpc")}
[metrics]
  address = ""
[{cri}]
  sandbox_image = {_toml(pause.PAUSE_IMAGE)}
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true
  enable_selinux = false
  restrict_oom_score_adj = false
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
  # an unpacked layer's compressed blob is dropped: the runtime image (about 6 GB) is on disk once, not twice
  discard_unpacked_layers = true
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  BinaryName = {_toml(str(wrapper))}
  Root = {_toml(str(node.data_dir / "runc"))}
  SystemdCgroup = false
[{cri}.cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = {_toml(str(node.data_dir / "cni" / "net.d"))}
  max_conf_num = 1
[{cri}.registry]
  config_path = {_toml(str(d / "certs.d"))}
"""


def cni_network(node: RealNode) -> dict:
    """The pods' network (10-neuronmodel.conflist): the bridge plugin on the node's bridge, host-local IPAM."""
    return {
        "cniVersion": "1.0.0", "name": node.network,
        "plugins": [{
            "type": "bridge", "bridge": node.bridge,
            # isGateway false: the plugin would turn on the global ip_forward; the bridge has the gateway address
            "isGateway": False, "isDefaultGateway": False, "ipMasq": False, "hairpinMode": True,
            "ipam": {"type": "host-local", "dataDir": str(node.data_dir / "cni" / "ipam"),
                     "ranges": [[{"subnet": node.pod_cidr, "gateway": node.gateway}]],
                     # no default route: pods reach their subnet (on link) and Service IPs, nothing else
                     "routes": [{"dst": SERVICE_CIDR, "gw": node.gateway}]},
        }],
    }


def kubeconfig(node: RealNode, stem: str) -> dict:
    """A kubeconfig for the control plane with the client certificate `pki/<stem>.crt` of the node's data dir."""
    pki = node.data_dir / "pki"
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "node",
        "clusters": [{"name": "local", "cluster": {"server": node.plane.server,
                                                   "certificate-authority": str(node.plane.pki / "ca.crt")}}],
        "users": [{"name": stem, "user": {"client-certificate": str(pki / f"{stem}.crt"),
                                          "client-key": str(pki / f"{stem}.key")}}],
        "contexts": [{"name": "node", "context": {"cluster": "local", "user": stem}}],
    }


def kubelet_config(node: RealNode, port: int, healthz: int, taints: list[dict]) -> dict:
    """The kubelet's KubeletConfiguration: serving on the node IP at `port`, healthz on 127.0.0.1:`healthz`."""
    pki, ca = node.data_dir / "pki", str(node.plane.pki / "ca.crt")
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": node.node_ip, "port": port, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": healthz,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": ca}},
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": str(pki / "kubelet-serving.crt"), "tlsPrivateKeyFile": str(pki / "kubelet-serving.key"),
        "serverTLSBootstrap": False, "rotateCertificates": False,
        "containerRuntimeEndpoint": f"unix://{node.socket}",
        "cgroupDriver": "cgroupfs", "cgroupsPerQOS": True, "cgroupRoot": f"/{node.cgroup}",
        "enforceNodeAllocatable": ["pods"], "failSwapOn": False, "failCgroupV1": False,
        "makeIPTablesUtilChains": False,
        # The disk is the machine's, shared with the builds: no disk signal evicts ("0%" turns one off) and
        # image GC never starts (100%). Reclaiming would delete the pause image, which containerd 1.6 does not
        # pin, and every later pod would fail "failed to get sandbox image"; a full disk fails plainly instead.
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "0%", "nodefs.inodesFree": "0%",
                         "imagefs.available": "0%", "imagefs.inodesFree": "0%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "resolvConf": str(node.data_dir / "resolv.conf"), "clusterDomain": "cluster.local",
        "clusterDNS": [node.gateway],  # k8s.realnode_dns, on the bridge's address
        "maxPods": 16, "podCIDR": node.pod_cidr, "podLogsDir": str(node.data_dir / "pod-logs"),
        "registerNode": True, "registerWithTaints": taints,
        "nodeStatusReportFrequency": "10s", "syncFrequency": "10s",
        "staticPodPath": "", "kernelMemcgNotification": False, "protectKernelDefaults": False,
    }


def kube_proxy_config(node: RealNode, healthz: int, metrics: int) -> dict:
    """kube-proxy's KubeProxyConfiguration: iptables mode, no sysctl writes."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(node.data_dir / "kube-proxy.kubeconfig")},
        "mode": "iptables", "clusterCIDR": node.pod_cidr, "hostnameOverride": node.name,
        "bindAddress": node.node_ip, "healthzBindAddress": f"127.0.0.1:{healthz}",
        "metricsBindAddress": f"127.0.0.1:{metrics}", "nodePortAddresses": [f"{node.node_ip}/32"],
        # no sysctl writes: leave the machine's conntrack table and route_localnet as they are
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "iptables": {"localhostNodePorts": False, "masqueradeAll": False, "syncPeriod": "30s",
                     "minSyncPeriod": "0s"},
    }
