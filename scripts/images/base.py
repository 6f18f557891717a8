"""The base image, made here: `mmdebstrap --variant=minbase bookworm` with Debian 12's python3 (3.11).

It stands in for the official `python:3.11-slim-bookworm` (a Debian 12 minbase plus a Python 3.11 of its own in
/usr/local), which cannot be pulled here: it is tagged `docker.io/library/python:3.11-slim-bookworm` in the
project's private buildah storage only (tools.cache_dir()/storage), so the Dockerfile's `FROM` line resolves with
`--pull=never` and stays what a normal `docker build` pulls. Why a tag rather than a `FROM ${BASE}` ARG: the
Dockerfile, images.py and the README keep naming the real base of the published images, and the label
`dev.neuronmodel.base.source` (inherited by every image built on it) says which one a local image really has.

What makes it behave as the official image does for the Dockerfile: `python` is python3 (python-is-python3), pip
is Debian's (python3-pip), PEP 668's EXTERNALLY-MANAGED marker is removed (as root, `python -m pip install` goes
into the system Python, as it does into /usr/local in the official image), Python's headers (libpython3.11-dev:
the official image ships them, and torch.compile's C++ kernels include Python.h), ca-certificates, LANG=C.UTF-8, CMD
python3. apt's lists and caches and the documentation are left out. Cached: rebuilt only when its inputs change.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from images import tools

TAG = "docker.io/library/python:3.11-slim-bookworm"
SUITE = "bookworm"
VARIANT = "minbase"
INCLUDE = ["python3", "python3-pip", "python-is-python3", "libpython3.11-dev", "ca-certificates"]
PYTHON = "3.11"
#: Debian's mirrors as this machine has them (deb822); mmdebstrap copies the file into the root filesystem.
SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
LABEL_INPUTS = "dev.neuronmodel.base.inputs"
LABEL_SOURCE = "dev.neuronmodel.base.source"
DPKG_OPTIONS = ["path-exclude=/usr/share/man/*", "path-exclude=/usr/share/doc/*", "path-include=/usr/share/doc/*/copyright",
                "path-exclude=/usr/share/info/*", "path-exclude=/usr/share/locale/*", "path-exclude=/usr/share/lintian/*"]
CUSTOMIZE = [f'rm -f "$1"/usr/lib/python{PYTHON}/EXTERNALLY-MANAGED',
             'rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*.log "$1"/var/log/apt/*']
CONFIG = {"env": ["LANG=C.UTF-8"], "cmd": "python3"}


def command(output: Path) -> list[str]:
    argv = ["mmdebstrap", f"--variant={VARIANT}", f"--include={','.join(INCLUDE)}", "--format=tar",
            "--aptopt=APT::Install-Recommends \"false\"", "--skip=output/dev", "--quiet"]
    argv += [f"--dpkgopt={option}" for option in DPKG_OPTIONS]
    argv += [f"--customize-hook={hook}" for hook in CUSTOMIZE]
    return argv + [SUITE, str(output), str(SOURCES)]


def inputs_digest() -> str:
    """sha256 of everything that decides the base: the command, the sources, mmdebstrap's version, the config."""
    version = tools.run(["mmdebstrap", "--version"]).stdout.strip()
    text = json.dumps({"command": command(Path("OUT")), "sources": SOURCES.read_text(), "mmdebstrap": version,
                       "config": CONFIG, "tag": TAG}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def inspect(reference: str) -> dict | None:
    """`buildah inspect` of a local image; None when the storage has no such image."""
    out = tools.buildah("inspect", "--type", "image", reference, check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def image_labels(reference: str) -> dict[str, str] | None:
    """The labels of a local image; None when the storage has no such image."""
    found = inspect(reference)
    return None if found is None else found["OCIv1"]["config"].get("Labels") or {}


def image_id(reference: str) -> str:
    return inspect(reference)["FromImageID"]


def ensure() -> dict:
    """Build and tag the base unless an image of the same inputs is tagged; returns what happened and its id."""
    tools.ensure()
    digest = inputs_digest()
    t0 = time.monotonic()
    if (image_labels(TAG) or {}).get(LABEL_INPUTS) == digest:
        return {"image": TAG, "id": image_id(TAG), "cached": True, "seconds": time.monotonic() - t0}
    print(f"images: base {TAG} (mmdebstrap {SUITE}, {', '.join(INCLUDE)}) ...", flush=True)
    tar = tools.tmp_dir() / f"base-{digest[:16]}.tar"
    container = None
    try:
        tools.run(command(tar))
        container = tools.buildah("from", *tools.signature_policy(), "--pull=never", "scratch").stdout.strip()
        tools.buildah("add", container, str(tar), "/")
        config = ["--env", CONFIG["env"][0], "--cmd", CONFIG["cmd"], "--label", f"{LABEL_INPUTS}={digest}",
                  "--label", f"{LABEL_SOURCE}=mmdebstrap --variant={VARIANT} {SUITE}: {' '.join(INCLUDE)}",
                  "--os", "linux", "--arch", "amd64"]
        tools.buildah("config", *config, container)
        tools.buildah("commit", *tools.signature_policy(), "--rm", container, TAG)
        container = None
    finally:
        if container:
            tools.buildah("rm", container, check=False)
        tar.unlink(missing_ok=True)
    tools.buildah("rmi", "--prune", check=False)  # an older base, untagged now, with nothing built on it
    return {"image": TAG, "id": image_id(TAG), "cached": False, "seconds": time.monotonic() - t0}


if __name__ == "__main__":
    done = ensure()
    json.dump(done, sys.stdout)
    print()
