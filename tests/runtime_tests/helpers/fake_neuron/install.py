"""Install one of the contract fakes for one test (see the package docstring): `install_nxdi` (the fake
neuronx_distributed_inference of one release) and `install_tnx` (the fake transformers_neuronx).

Each makes `import <package>` give the fake and `importlib.metadata.version(<distribution>)` return the version, and
undoes both when the test ends. The fake is exposed through a site folder of its own in `tmp_path` (its dist-info
and a link to the package), so installing one does not also put the other fakes beside it in fake_neuron/ on
sys.path.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parent
#: NxDI's shipped versions (SDK manifest): 2.23 0.3.5591, 2.26 0.6.10598, 2.28 0.8.16251, 2.29 0.9.17334,
#: 2.30 0.10.17970.
RELEASES = ("0.3.5591", "0.4.7422", "0.5.9230", "0.6.10598", "0.7.14366", "0.8.16251", "0.9.17334", "0.10.17970")
#: TNx's shipped 0.13 versions (SDK 2.22 0.13.470, 2.23 0.13.798; the line ended with SDK 2.25).
TNX_RELEASES = ("0.13.470", "0.13.798")


def _purge(package: str) -> None:
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
        del sys.modules[name]


class _PurgeOnUndo(dict):
    """package -> installed version. monkeypatch undoes an item it added by deleting it; that deletion purges the
    fake's modules, so no test leaves a fake package in sys.modules for the next one (importlib.util.find_spec would
    report it installed)."""

    def __delitem__(self, package: str) -> None:
        super().__delitem__(package)
        _purge(package)


_INSTALLED = _PurgeOnUndo()


def _install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, package: str, dist: str, version: str,
             site_name: str) -> ModuleType:
    """Put the fake `package` on sys.path in `tmp_path`/`site_name`, with the dist-info of `dist` `version`, for
    this test; returns the freshly imported package."""
    _purge(package)
    monkeypatch.setitem(_INSTALLED, package, version)
    site = Path(tmp_path) / site_name
    info = site / f"{package}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    link = site / package
    if not link.exists():
        link.symlink_to(HERE / package, target_is_directory=True)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    return importlib.import_module(package)


def install_nxdi(monkeypatch: pytest.MonkeyPatch, version: str, tmp_path: Path) -> ModuleType:
    """Make `import neuronx_distributed_inference` give the fake of `version` ("0.3.5591", "0.9.17334", ...) and
    `importlib.metadata.version("neuronx-distributed-inference")` return `version`; returns the package."""
    major, minor = (int(x) for x in version.split(".")[:2])
    if (major, minor) < (0, 3) or (major, minor) > (0, 10):
        raise ValueError(f"the fake NxDI models releases 0.3 .. 0.10, not {version}")
    return _install(monkeypatch, tmp_path, "neuronx_distributed_inference", "neuronx-distributed-inference", version,
                    f"fake-nxdi-{version}")


def install_tnx(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, version: str = "0.13.798") -> ModuleType:
    """Make `import transformers_neuronx` give the fake and `importlib.metadata.version("transformers-neuronx")`
    return `version`; returns the package, with every submodule imported (fresh)."""
    package = _install(monkeypatch, tmp_path, "transformers_neuronx", "transformers-neuronx", version,
                       f"fake-tnx-{version}")
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(module.name)
    return package


__all__ = ["RELEASES", "TNX_RELEASES", "install_nxdi", "install_tnx"]
