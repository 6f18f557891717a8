"""checkov (the Kubernetes scanner) in its own virtual environment, `$NEURONMODEL_CACHE/tools/checkov`, installed from
PyPI on first use: its pins (boto3 1.35, packaging 23) conflict with the project's .venv."""

from __future__ import annotations

import os
import shutil
import subprocess
import venv
from pathlib import Path

VERSION = "3.3.30"


def home() -> Path:
    root = os.environ.get("NEURONMODEL_CACHE") or Path.home() / ".cache" / "neuronmodel"
    return Path(root) / "tools" / "checkov"


def checkov() -> Path:
    """The checkov executable, installing it first (a few minutes, once per machine)."""
    folder, stamp = home(), home() / f"installed-{VERSION}"
    if not stamp.exists():
        shutil.rmtree(folder, ignore_errors=True)
        venv.create(folder, with_pip=True)
        subprocess.run(["nice", str(folder / "bin" / "pip"), "install", "--quiet", f"checkov=={VERSION}"],
                       check=True, capture_output=True, text=True, timeout=1200)
        stamp.touch()
    return folder / "bin" / "checkov"


if __name__ == "__main__":  # `make test-deps` installs it beside the other setup, not at the suite's end
    print(checkov())
