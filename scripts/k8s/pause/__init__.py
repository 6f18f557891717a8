"""Container images of the real node (`k8s.realnode`), built here without any registry or image tool.

  * the pause image (the pod sandbox): Kubernetes' own `build/pause/linux/pause.c` (`install.pause_source()`,
    copied from the `k8s.io/kubernetes` module by `make k8s-bin`), compiled statically with gcc;
  * a tiny test image: the static busybox of Debian's `busybox-static` package (httpd, sh, wget), user 65534.

Each is written as an OCI image layout archive (one uncompressed tar layer, config, manifest, index) that
`ctr -n k8s.io images import` loads into the node's containerd. Archives are cached under
`$NEURONMODEL_CACHE/k8s/realnode-cache/images/`, keyed by what they are built from.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import urllib.parse
from pathlib import Path

from k8s import install

PAUSE_TAG = "3.10.1"  # build/pause/Makefile's TAG in k8s.io/kubernetes v1.34.4
PAUSE_IMAGE = f"neuronmodel.local/pause:{PAUSE_TAG}"
BUSYBOX_REPO = "neuronmodel.local/busybox"
# the applets the test image links into /bin (all served by the one static binary)
BUSYBOX_APPLETS = ("sh", "httpd", "wget", "cat", "echo", "id", "ls", "sleep", "nc", "hostname", "mount", "ps",
                   "ip", "timeout")


def cache_dir() -> Path:
    return install.cache_dir().parent / "realnode-cache"


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _layer(files: dict[str, tuple[int, bytes | str | None]]) -> bytes:
    """A deterministic tar: path -> (mode, bytes: a file | str: a symlink target | None: a directory)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(files):
            mode, content = files[path]
            info = tarfile.TarInfo(path)
            info.mode, info.mtime, info.uid, info.gid = mode, 0, 0, 0
            if content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def write_oci_archive(target: Path, name: str, layer: bytes, config: dict) -> None:
    """Write an OCI image layout as a tar at `target`: one layer, `config` (the image config's `config`)."""
    image_config = json.dumps({
        "architecture": "amd64", "os": "linux", "config": config,
        "rootfs": {"type": "layers", "diff_ids": [_sha256(layer)]},
        "history": [{"created_by": "neuronmodel k8s.pause"}],
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": _sha256(image_config),
                   "size": len(image_config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": _sha256(layer),
                    "size": len(layer)}],
    }, sort_keys=True).encode()
    index = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": _sha256(manifest),
                       "size": len(manifest), "platform": {"architecture": "amd64", "os": "linux"},
                       "annotations": {"io.containerd.image.name": name,
                                       "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}],
    }, sort_keys=True).encode()
    entries = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": index}
    for blob in (layer, image_config, manifest):
        entries["blobs/sha256/" + _sha256(blob).split(":")[1]] = blob
    tmp = target.with_suffix(".partial")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_bytes(_layer({"blobs": (0o755, None), "blobs/sha256": (0o755, None)}
                           | {path: (0o644, data) for path, data in entries.items()}))
    tmp.replace(target)


def pause_archive() -> Path:
    """The pause image archive (built on first use): `PAUSE_IMAGE`, user 65535, entrypoint /pause."""
    target = cache_dir() / "images" / f"pause-{PAUSE_TAG}-{install.K8S_VERSION}.tar"
    if target.exists():
        return target
    if not shutil.which("gcc") or not Path("/usr/lib/x86_64-linux-gnu/libc.a").exists():
        _apt_install("gcc", "libc6-dev")
    source = install.pause_source()
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "pause"
        subprocess.run(["gcc", "-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{PAUSE_TAG}-neuronmodel",
                        "-o", str(binary), str(source)], check=True, capture_output=True)
        subprocess.run(["strip", str(binary)], check=True, capture_output=True)
        layer = _layer({"pause": (0o755, binary.read_bytes())})
    write_oci_archive(target, PAUSE_IMAGE, layer, {"User": "65535:65535", "Entrypoint": ["/pause"]})
    return target


def busybox_archive() -> tuple[Path, str]:
    """The test image archive (built on first use) and its name: Debian's static busybox, user 65534."""
    debs = cache_dir() / "debs"
    found = sorted(debs.glob("busybox-static_*.deb"))
    if not found:
        debs.mkdir(parents=True, exist_ok=True)
        subprocess.run(["apt-get", "download", "busybox-static"], cwd=debs, check=True, capture_output=True)
        found = sorted(debs.glob("busybox-static_*.deb"))
    deb = found[-1]
    version = urllib.parse.unquote(deb.name.split("_")[1]).split(":")[-1]  # 1%3a1.35.0-4+b1 -> 1.35.0-4+b1
    version = version.replace("+", "-").replace("~", "-")
    name = f"{BUSYBOX_REPO}:{version}"
    applets = hashlib.sha256(" ".join(BUSYBOX_APPLETS).encode()).hexdigest()[:8]
    target = cache_dir() / "images" / f"busybox-{version}-{applets}.tar"
    if target.exists():
        return target, name
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True, capture_output=True)
        busybox = (Path(tmp) / "bin" / "busybox").read_bytes()
    files: dict[str, tuple[int, bytes | str | None]] = {
        "bin": (0o755, None), "bin/busybox": (0o755, busybox), "tmp": (0o1777, None), "www": (0o755, None),
        "etc": (0o755, None), "etc/passwd": (0o644, b"root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n"),
        "etc/group": (0o644, b"root:x:0:\nnogroup:x:65534:\n"),
        "www/index.html": (0o644, b"neuronmodel busybox test image\n"),
    }
    files |= {f"bin/{applet}": (0o777, "busybox") for applet in BUSYBOX_APPLETS}
    write_oci_archive(target, name, _layer(files), {
        "User": "65534:65534", "Env": ["PATH=/bin"], "WorkingDir": "/",
        "Cmd": ["httpd", "-f", "-v", "-p", "8080", "-h", "/www"], "ExposedPorts": {"8080/tcp": {}}})
    return target, name


def _apt_install(*packages: str) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, capture_output=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages], check=True,
                   capture_output=True, env=env)
