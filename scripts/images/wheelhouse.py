"""The wheelhouse of a target: every wheel its build installs, downloaded on the host, never inside a build.

Inside the build containers nothing is reached (`--network=none`): pip installs only from this folder, bind-mounted
read-only at MOUNT (PIP_NO_INDEX=1, PIP_FIND_LINKS=MOUNT; see images.build). `pip download --only-binary=:all:`
for CPython 3.11 on manylinux x86_64 (the base: Debian 12, glibc 2.36), so no sdist is ever built in a container:

* `operator`: the wheel's `operator` extra under docker/operator-constraints.txt;
* `runtime-cpu`: `torch==<the Dockerfile's TORCH_VERSION>` and the wheel's `runtime` extra (PyPI's torch wheel
  pulls the CUDA libraries, nvidia-*, about 3 GB: torch's import loads them, so the image carries them);
* both: the build backend of pyproject's [build-system] (the Dockerfile's wheel stage builds our wheel).

Cached in `$NEURONMODEL_CACHE/images/wheelhouse-<target>-<key>`, key = sha256 of what decides the resolution (the
requirement lists read from pyproject, the constraints' text, TORCH_VERSION, the target tags), not of pyproject's
whole text: a version bump or a new test extra reuses the wheels. A new key downloads into a `.partial` folder
renamed when complete (`manifest.json` inside), then older wheelhouses of the target are removed.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

from images import tools

ROOT = Path(__file__).resolve().parents[2]
MOUNT = "/tmp/wheelhouse"
PYTHON_VERSION = "3.11"
#: glibc 2.36 (Debian 12) runs manylinux wheels up to 2_36. pip expands only the legacy aliases (manylinux2014 ->
#: 2010 -> 1), not PEP 600 tags: every one is named.
GLIBC_MINOR = 36
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(GLIBC_MINOR, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
CONSTRAINTS = ROOT / "docker" / "operator-constraints.txt"
TARGETS = ("operator", "runtime-cpu")


def _pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def torch_version(dockerfile: Path = ROOT / "Dockerfile") -> str:
    """The default of `ARG TORCH_VERSION=...` in the Dockerfile (runtime-cpu's torch)."""
    match = re.search(r"^ARG TORCH_VERSION=(\S+)$", dockerfile.read_text(), re.M)
    if not match:
        raise LookupError(f"{dockerfile}: no ARG TORCH_VERSION=<version>")
    return match.group(1)


def requirements(target: str) -> dict:
    """What the wheelhouse of `target` is downloaded from: {"requirements": [...], "constraints": text or None}."""
    project = _pyproject()
    backend = project["build-system"]["requires"]
    extras = project["project"]["optional-dependencies"]
    base = project["project"]["dependencies"]
    if target == "operator":
        return {"requirements": backend + base + extras["operator"], "constraints": CONSTRAINTS.read_text()}
    if target == "runtime-cpu":
        return {"requirements": backend + base + extras["runtime"] + [f"torch=={torch_version()}"],
                "constraints": None}
    raise ValueError(f"no wheelhouse for target {target!r} (one of {', '.join(TARGETS)})")


def key(target: str) -> str:
    spec = requirements(target) | {"python": PYTHON_VERSION, "platforms": PLATFORMS, "target": target}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def path(target: str) -> Path:
    return tools.cache_dir() / f"wheelhouse-{target}-{key(target)[:16]}"


def download_command(target: str, dest: Path) -> list[str]:
    spec = requirements(target)
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-cache-dir",
            "--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp",
            "--abi", f"cp{PYTHON_VERSION.replace('.', '')}", "--dest", str(dest)]
    for platform in PLATFORMS:
        argv += ["--platform", platform]
    if spec["constraints"] is not None:
        argv += ["--constraint", str(CONSTRAINTS)]
    return argv + spec["requirements"]


def ensure(target: str) -> dict:
    """The wheelhouse of `target`, downloaded unless cached: {"path", "digest", "cached", "seconds", "bytes"}."""
    folder = path(target)

    def fill(partial: Path) -> dict:
        print(f"images: wheelhouse {target} -> {folder} ...", flush=True)
        tools.run(download_command(target, partial))
        wheels = sorted(p.name for p in partial.glob("*.whl"))
        others = [p.name for p in partial.iterdir() if not p.name.endswith(".whl")]
        if others:
            raise RuntimeError(f"wheelhouse {target}: not wheels: {others}")
        return {"target": target, "key": key(target), "digest": tools.files_digest(partial, "*.whl"),
                "bytes": tools.du(partial), "wheels": wheels} | requirements(target)

    done = tools.filled_folder(folder, fill, f"wheelhouse-{target}-*")
    return {name: done[name] for name in ("path", "digest", "cached", "seconds", "bytes")}


if __name__ == "__main__":
    for name in sys.argv[1:] or TARGETS:
        print(json.dumps({"target": name} | ensure(name)), flush=True)
