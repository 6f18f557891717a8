"""The operator image's lock file, docker/operator-requirements.txt: every distribution the wheel's `operator` extra
installs on the image's interpreter (CPython 3.11, manylinux x86_64), as `name==version --hash=sha256:...`.

The Dockerfile's `operator` target installs exactly these with `pip install --require-hashes --no-deps`, then our
wheel with `--no-deps`, so a rebuild months later gets byte-identical packages or fails naming the one whose file
changed; the offline wheelhouse downloads the same file (`images.wheelhouse`). The lock is pip's own resolution
(`pip install --dry-run --report`, whose entries carry the sha256 of the file pip chose), never hand-edited.

Regenerate after changing the `operator` extra:  PYTHONPATH=scripts:runtime python -m images.lock
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from images import wheelhouse
import vllm_cpu  # noqa: I001 (after wheelhouse, which puts scripts/ on sys.path)

LOCK = wheelhouse.ROOT / "docker" / "operator-requirements.txt"
HEADER = __doc__.split("\n\n")[0].replace("\n", "\n# ")


def resolution(project: Path = wheelhouse.ROOT) -> list[dict]:
    """pip's report entries for `.[operator]` on the image's interpreter (our own distribution left out)."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        subprocess.run([*wheelhouse.pip(), "install", "--dry-run", "--quiet", "--ignore-installed",
                        *vllm_cpu.target_options(wheelhouse.PYTHON_VERSION, wheelhouse.PLATFORMS),
                        "--target", str(Path(scratch) / "target"), "--report", str(report),
                        f"{project}[operator]"], check=True)
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


def main() -> int:
    LOCK.write_text(f"# {HEADER}\n# Regenerate: PYTHONPATH=scripts:runtime python -m images.lock\n"
                    + "\n".join(lock_lines(resolution())) + "\n")
    print(f"wrote {LOCK.relative_to(wheelhouse.ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
