"""Guards for the repository layout that the packaging relies on (DESIGN.md: no top-level `operator` package)."""

import importlib
import operator
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_operator_and_runtime_folders_are_not_packages():
    assert not (ROOT / "operator" / "__init__.py").exists()
    assert not (ROOT / "runtime" / "__init__.py").exists()


def test_stdlib_operator_is_not_shadowed():
    assert Path(operator.__file__).parent == Path(importlib.import_module("os").__file__).parent
    assert operator.add(2, 3) == 5


def test_both_packages_import():
    import neuronmodel_operator  # noqa: F401
    import neuronmodel_runtime

    assert Path(neuronmodel_runtime.__file__).parent == ROOT / "runtime" / "neuronmodel_runtime"


def test_config_and_frameworks_do_not_import_torch():
    import subprocess

    code = (
        "import sys; import neuronmodel_runtime.config, neuronmodel_runtime.frameworks, neuronmodel_operator;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": f"{ROOT/'runtime'}:{ROOT/'operator'}"})
    assert out.stdout.strip() == "False"
