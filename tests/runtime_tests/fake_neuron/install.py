"""Install the fake NxDI of one release for one test (see the package docstring)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parent
PACKAGE = "neuronx_distributed_inference"
DIST = "neuronx-distributed-inference"
#: Shipped versions (SDK manifest): 2.23 0.3.5591, 2.26 0.6.10598, 2.28 0.8.16251, 2.29 0.9.17334, 2.30 0.10.17970.
RELEASES = ("0.3.5591", "0.4.7422", "0.5.9230", "0.6.10598", "0.7.14366", "0.8.16251", "0.9.17334", "0.10.17970")


def _purge() -> None:
    for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
        del sys.modules[name]


class _PurgeOnUndo(dict):
    """monkeypatch restores an item it added by deleting it: that deletion purges the fake's modules, so a test that
    installed the fake leaves no `neuronx_distributed_inference` behind for the next one."""

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        _purge()


_INSTALLED = _PurgeOnUndo()


def install_nxdi(monkeypatch: pytest.MonkeyPatch, version: str, tmp_path: Path) -> ModuleType:
    """Make `import neuronx_distributed_inference` give the fake of `version` ("0.3.5591", "0.9.17334", ...) and
    `importlib.metadata.version("neuronx-distributed-inference")` return `version`; returns the package."""
    major, minor = (int(x) for x in version.split(".")[:2])
    if (major, minor) < (0, 3) or (major, minor) > (0, 10):
        raise ValueError(f"the fake NxDI models releases 0.3 .. 0.10, not {version}")
    _purge()
    monkeypatch.setitem(_INSTALLED, "version", version)
    # A site folder of its own: the metadata and a link to the package, so that the other fakes beside it in
    # fake_neuron/ (transformers_neuronx) do not become importable too.
    site = Path(tmp_path) / f"fake-nxdi-{version}"
    info = site / f"{PACKAGE}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {version}\n")
    link = site / PACKAGE
    if not link.exists():
        link.symlink_to(HERE / PACKAGE, target_is_directory=True)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    return importlib.import_module(PACKAGE)


__all__ = ["RELEASES", "install_nxdi"]
