"""Install the contract fake of transformers-neuronx (fake_neuron/transformers_neuronx) for one test.

`install_tnx(monkeypatch, tmp_path, version)` makes `import transformers_neuronx` give the fake and
`importlib.metadata.version("transformers-neuronx")` return `version`, and undoes both when the test ends. The fake
is exposed through a folder of its own in `tmp_path` (a link to the package), so installing it does not also put the
other fakes beside it on sys.path.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parent
PACKAGE = "transformers_neuronx"
DIST = "transformers-neuronx"
#: Shipped 0.13 versions (SDK 2.22 0.13.470, 2.23 0.13.798; the line ended with SDK 2.25).
RELEASES = ("0.13.470", "0.13.798")


def _purge() -> None:
    for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
        del sys.modules[name]


class _PurgeOnUndo(dict):
    """monkeypatch undoes an item it added by deleting it; that deletion purges the fake's modules, so no test leaves
    a `transformers_neuronx` in sys.modules for the next (importlib.util.find_spec would report it installed)."""

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        _purge()


_INSTALLED = _PurgeOnUndo()


def install_tnx(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, version: str = "0.13.798") -> ModuleType:
    """Put the fake transformers_neuronx of `version` on sys.path for this test; returns the imported package."""
    _purge()
    monkeypatch.setitem(_INSTALLED, "version", version)
    site = Path(tmp_path) / f"fake-tnx-{version}"
    info = site / f"{PACKAGE}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {version}\n")
    link = site / PACKAGE
    if not link.exists():
        link.symlink_to(HERE / PACKAGE, target_is_directory=True)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    package = importlib.import_module(PACKAGE)
    for module in pkgutil.walk_packages(package.__path__, PACKAGE + "."):  # every submodule now, fresh
        importlib.import_module(module.name)
    return package


__all__ = ["RELEASES", "install_tnx"]
