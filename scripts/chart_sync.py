"""Keep the Helm chart in step with the repository: copy the canonical CRD and the operator's rules file into
charts/neuronmodel-operator/, and regenerate the golden renders tests/chart/golden/<case>.yaml, one per values file
tests/chart/values/<case>.yaml (`helm template`, Helm 4).

    python scripts/chart_sync.py           # copy and regenerate
    python scripts/chart_sync.py --check   # exit 1 naming each file that is not current (changes nothing)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from k8s import install  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "neuronmodel-operator"
VALUES = ROOT / "tests" / "chart" / "values"
GOLDEN = ROOT / "tests" / "chart" / "golden"
RELEASE, NAMESPACE = "neuronmodel", "neuronmodel-system"

#: canonical file -> its copy in the chart
COPIES = {
    ROOT / "crds" / "neuronmodels.neuronmodel.dev.yaml": CHART / "crds" / "neuronmodels.neuronmodel.dev.yaml",
    ROOT / "rbac" / "operator-rules.yaml": CHART / "files" / "operator-rules.yaml",
}


def cases() -> dict[str, Path]:
    """case name -> its values file."""
    return {path.stem: path for path in sorted(VALUES.glob("*.yaml"))}


def helm(binary: str = "helm") -> Path:
    path = install.bin_dir() / binary
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `make k8s-bin` (scripts/k8s/install.py) first")
    return path


def render(values: Path, binary: str = "helm", *extra: str) -> subprocess.CompletedProcess:
    """`helm template` of the chart with one values file, as release `neuronmodel` in `neuronmodel-system`."""
    return subprocess.run([str(helm(binary)), "template", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values),
                           *extra], capture_output=True, text=True, timeout=120)


def golden_text(values: Path) -> str:
    out = render(values)
    if out.returncode:
        raise RuntimeError(f"helm template -f {values.relative_to(ROOT)} failed:\n{out.stderr.strip()}")
    return out.stdout


def wanted() -> dict[Path, str]:
    """Every file this script owns -> the content it must have."""
    files = {copy: source.read_text() for source, copy in COPIES.items()}
    files.update({GOLDEN / f"{case}.yaml": golden_text(values) for case, values in cases().items()})
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report stale files instead of writing them")
    args = parser.parse_args(argv)
    files = wanted()
    stale = [path for path, text in files.items() if not path.exists() or path.read_text() != text]
    orphans = [path for path in GOLDEN.glob("*.yaml") if path not in files]
    if args.check:
        for path in stale + orphans:
            print(f"{path.relative_to(ROOT)} is not current: run python scripts/chart_sync.py", file=sys.stderr)
        return 1 if stale or orphans else 0
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for path in stale:
        path.write_text(files[path])
        print(f"wrote {path.relative_to(ROOT)}")
    for path in orphans:
        path.unlink()
        print(f"removed {path.relative_to(ROOT)} (no values file)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
