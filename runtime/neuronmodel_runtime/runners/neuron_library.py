"""The installed Neuron library (NxDI or TNx): importing it, its version, whether it is a release the runner was
written against, and whether AWS still supports that release line (`releases.py` holds the facts).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from types import ModuleType
from typing import Any, Mapping, Optional

from neuronmodel_runtime.config import env as env_names
from neuronmodel_runtime.frameworks import NEURON_INSTALL_HINT
from neuronmodel_runtime.releases import known, release_of, support_facts
from neuronmodel_runtime.runners.base import RunnerError


def import_library(framework: str, module: str, dist: str) -> tuple[ModuleType, str]:
    """Import a Neuron library and return it with its distribution version (the package's `__version__` when the
    distribution metadata is missing).

    Raises:
        RunnerError: not installed (with the install hint).
    """
    try:
        library = importlib.import_module(module)
    except ImportError as exc:
        raise RunnerError(f"framework {framework!r}: cannot import {module} ({exc}): {NEURON_INSTALL_HINT}") from exc
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        version = str(getattr(library, "__version__", "unknown"))
    return library, version


def release_warning(framework: str, version: str) -> str | None:
    """A warning when the installed release is not one the runner was written against (it may still work)."""
    if release_of(framework, version) is not None:
        return None
    return (f"{framework} {version} is not a release this runner was written against ({known(framework)}); "
            "it may work, but only those were checked against the library's source")


def aws_support(framework: str, version: str, env: Mapping[str, str] = os.environ) -> Optional[dict[str, Any]]:
    """Whether AWS still patches this release line on this pod's instance family (the operator sets
    $NEURONMODEL_INSTANCE_FAMILY), for runner.info(); None for a version the runner was not written against."""
    return support_facts(framework, version, env.get(env_names.INSTANCE_FAMILY) or None)


__all__ = ["aws_support", "import_library", "release_warning"]
