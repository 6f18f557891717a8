"""The images' lock files: every distribution a target installs on its interpreter (CPython 3.11, manylinux x86_64),
as `name==version --hash=sha256:...`, pip's own resolution (`pip install --dry-run --report`, whose entries carry the
sha256 of the file pip chose), never hand-edited:

* docker/operator-requirements.txt: the wheel's `operator` extra;
* docker/runtime-cpu-requirements.txt: the `runtime` extra with the Dockerfile's TORCH_VERSION (PyPI's torch and the
  CUDA libraries its import loads).

The Dockerfile installs a lock with `pip install --require-hashes --no-deps`, then our wheel, so a rebuild months
later gets byte-identical packages or fails naming the file that changed; the offline wheelhouse downloads the same
files (images.wheelhouse). The Neuron targets have no lock: their packages are the AWS image's, pinned by its tag,
and install-runtime.sh refuses to change any of them (docs/security.md).

Regenerate after changing an extra or TORCH_VERSION:  PYTHONPATH=scripts:runtime python -m images.lock
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from images import wheelhouse
import vllm_cpu  # noqa: I001 (after wheelhouse, which puts scripts/ on sys.path)

LOCKS = wheelhouse.LOCKS
REGENERATE = "PYTHONPATH=scripts:runtime python -m images.lock"


def requirements(target: str, project: Path = wheelhouse.ROOT) -> list[str]:
    """What the target's lock resolves."""
    if target == "operator":
        return [f"{project}[operator]"]
    if target == "runtime-cpu":
        return [f"{project}[runtime]", f"torch=={wheelhouse.torch_version()}"]
    raise ValueError(f"no lock for target {target!r} (one of {', '.join(LOCKS)})")


def resolution(target: str) -> list[dict]:
    """pip's report entries for the target on the image's interpreter (our own distribution left out)."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        subprocess.run([*wheelhouse.pip(), "install", "--dry-run", "--quiet", "--ignore-installed",
                        *vllm_cpu.target_options(wheelhouse.PYTHON_VERSION, wheelhouse.PLATFORMS),
                        "--target", str(Path(scratch) / "target"), "--report", str(report),
                        *requirements(target)], check=True)
        entries = json.loads(report.read_text())["install"]
    return [e for e in entries if e["metadata"]["name"] != "neuronmodel"]


def lock_lines(entries: list[dict]) -> list[str]:
    """One `name==version --hash=sha256:...` a distribution, sorted by name."""
    lines = []
    for entry in entries:
        digest = entry["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
        if not digest:
            raise ValueError(f"pip's report gives no sha256 for {entry['metadata']['name']}: {entry['download_info']}")
        lines.append(f"{entry['metadata']['name']}=={entry['metadata']['version']} --hash=sha256:{digest}")
    return sorted(lines, key=str.lower)


def lock_text(target: str, entries: list[dict]) -> str:
    resolved = " ".join(requirements(target, Path(".")))
    return (f"# The {target} image's lock (scripts/images/lock.py): pip's resolution of {resolved}\n"
            f"# for CPython {wheelhouse.PYTHON_VERSION} on manylinux x86_64, installed --require-hashes --no-deps.\n"
            f"# Regenerate: {REGENERATE}\n" + "\n".join(lock_lines(entries)) + "\n")


def main() -> int:
    for target, path in LOCKS.items():
        path.write_text(lock_text(target, resolution(target)))
        print(f"wrote {path.relative_to(wheelhouse.ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
