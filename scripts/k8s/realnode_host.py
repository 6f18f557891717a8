"""Host resources of the real node (`k8s.realnode`): its links, cgroups, mounts and iptables chains.

Every function here acts only on names the node owns (its links, `/sys/fs/cgroup/*/<cgroup>`, mounts under
its data dir, `KUBE-*` chains it checked were absent before it started), so the cleanup can run again and
again, and from another process (the reaper) after the harness was killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
IPTABLES = ("iptables", "ip6tables")
IPTABLES_TABLES = ("nat", "filter", "mangle")
EGRESS_CHAIN = "NEURONMODEL-POD-EGRESS"  # the node's own: pods' packets may not be forwarded off their bridge
CHAIN_PREFIXES = ("KUBE-", EGRESS_CHAIN)  # kube-proxy's (the kubelet makes none: makeIPTablesUtilChains false)


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if check and out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {out.returncode}: {out.stderr.strip()}")
    return out


# --- links ---------------------------------------------------------------------------------------------
def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def make_dummy(name: str, address: str) -> str:
    """A link that only holds `address`: a dummy, or where the kernel has no dummy driver (this sandbox's),
    a bridge without ports (its local address is reachable all the same). Returns the link type."""
    kind = "dummy"
    if sh("ip", "link", "add", name, "type", "dummy", check=False).returncode:
        kind = "bridge"
        sh("ip", "link", "add", name, "type", "bridge")
    sh("ip", "addr", "add", address, "dev", name)
    sh("ip", "link", "set", name, "up")
    return kind


def make_bridge(name: str, address: str) -> None:
    """The pods' bridge, with the gateway address; IPv4 forwarding on this device only (ip_forward untouched)."""
    sh("ip", "link", "add", name, "type", "bridge")
    sh("ip", "addr", "add", address, "dev", name)
    sh("ip", "link", "set", name, "up")
    Path(f"/proc/sys/net/ipv4/conf/{name}/forwarding").write_text("1")


def bridge_ports(bridge: str) -> list[str]:
    brif = Path("/sys/class/net", bridge, "brif")
    return sorted(p.name for p in brif.iterdir()) if brif.exists() else []


def delete_links(names: list[str]) -> None:
    for name in names:
        if link_exists(name):
            sh("ip", "link", "del", name, check=False)


# --- cgroups (v1 hierarchies, or the unified one) ------------------------------------------------------------
def hierarchies() -> list[Path]:
    return sorted(p for p in CGROUP_ROOT.iterdir() if (p / "cgroup.procs").exists())


def make_cgroup(name: str) -> None:
    """`<hierarchy>/<name>` in every hierarchy (cpuset: the parent's cpus and mems)."""
    for hierarchy in hierarchies():
        path = hierarchy / name
        path.mkdir(exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (path / knob).exists() and not (path / knob).read_text().strip():
                (path / knob).write_text((hierarchy / knob).read_text())


def tracking_hierarchy() -> Path:
    """The hierarchy whose `cgroup.procs` track the node's processes: pids (v1), else the unified one."""
    return CGROUP_ROOT / "pids" if (CGROUP_ROOT / "pids" / "cgroup.procs").exists() else CGROUP_ROOT


def cgroup_pids(name: str) -> list[int]:
    root = tracking_hierarchy() / name
    pids: set[int] = set()
    if root.exists():
        for procs in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids |= {int(p) for p in procs.read_text().split()}
    return sorted(pids)


def join_cgroup(name: str, leaf: str) -> None:
    """preexec_fn helper: move this process into `<name>/<leaf>` of the tracking hierarchy."""
    (tracking_hierarchy() / name / leaf / "cgroup.procs").write_text(str(os.getpid()))


def kill_cgroup(name: str, timeout: float = 15.0) -> None:
    """SIGKILL every process in the node's cgroup (daemons, shims, pods) until it is empty."""
    deadline = time.monotonic() + timeout
    while (pids := cgroup_pids(name)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass


def remove_cgroups(name: str) -> None:
    """rmdir `<hierarchy>/<name>` and everything below it (the kubelet's kubepods), deepest first."""
    for hierarchy in hierarchies():
        root = hierarchy / name
        if not root.exists():
            continue
        for path in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [root]:
            for _ in range(50):  # a cgroup whose last task just died is busy for a moment
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def cgroups_left(name: str) -> list[str]:
    return [str(h / name) for h in hierarchies() if (h / name).exists()]


# --- mounts ----------------------------------------------------------------------------------------------
def mounts_under(root: Path) -> list[str]:
    """Mount points at or under `root` (from /proc/self/mountinfo, octal escapes decoded)."""
    prefix = str(root).rstrip("/")
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return found


def unmount_under(root: Path) -> None:
    """Lazily unmount (MNT_DETACH) every mount under `root`, deepest first, until none is left."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    for _ in range(20):
        points = mounts_under(root)
        if not points:
            return
        for point in sorted(set(points), key=lambda p: -len(p)):
            libc.umount2(point.encode(), 2)  # MNT_DETACH


# --- iptables --------------------------------------------------------------------------------------------
def _ours(chain: str) -> bool:
    return chain.startswith(CHAIN_PREFIXES)


def chains() -> list[str]:
    """`<binary> <table> <chain>` of every chain with one of CHAIN_PREFIXES (IPv4 and IPv6)."""
    found = []
    for binary in IPTABLES:
        for table in IPTABLES_TABLES:
            out = sh(f"{binary}-save", "-t", table, check=False).stdout
            found += [f"{binary} {table} {line[1:].split()[0]}" for line in out.splitlines()
                      if line.startswith(":") and _ours(line[1:].split()[0])]
    return found


def remove_chains() -> None:
    """Delete the rules that jump to CHAIN_PREFIXES chains, then flush and delete those chains."""
    for binary in IPTABLES:
        for table in IPTABLES_TABLES:
            out = sh(f"{binary}-save", "-t", table, check=False).stdout
            declared = [line[1:].split()[0] for line in out.splitlines() if line.startswith(":")]
            ours = [chain for chain in declared if _ours(chain)]
            if not ours:
                continue
            for line in out.splitlines():
                if line.startswith("-A ") and not _ours(line.split()[1]):
                    rule = shlex.split(line)
                    if any(_ours(arg) for arg in rule[2:]):
                        sh(binary, "-w", "-t", table, "-D", *rule[1:], check=False)
            for chain in ours:
                sh(binary, "-w", "-t", table, "-F", chain, check=False)
            for chain in ours:
                sh(binary, "-w", "-t", table, "-X", chain, check=False)


def block_pod_egress(bridge: str) -> None:
    """Reject what pods send that would be forwarded off their bridge (a pod that adds a route of its own
    still reaches nothing beyond this machine); the bridge's per-device forwarding is only for Services."""
    sh("iptables", "-w", "-N", EGRESS_CHAIN)
    sh("iptables", "-w", "-A", EGRESS_CHAIN, "-i", bridge, "!", "-o", bridge, "-j", "REJECT",
       "--reject-with", "icmp-net-unreachable")
    sh("iptables", "-w", "-I", "FORWARD", "1", "-j", EGRESS_CHAIN)
