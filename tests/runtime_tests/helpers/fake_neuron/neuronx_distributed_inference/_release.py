"""The installed release, read once from the distribution metadata the installer writes. The fake branches on it
only where the real releases differ, through `at_least`."""

from __future__ import annotations

import importlib.metadata
import os

try:
    _DIST_VERSION = importlib.metadata.version("neuronx-distributed-inference")
except importlib.metadata.PackageNotFoundError as exc:  # pragma: no cover - guard against a bare import
    raise ImportError("the fake NxDI needs its distribution metadata: install it with fake_neuron.install") from exc

VERSION = tuple(int(x) for x in _DIST_VERSION.split(".")[:2])


def at_least(release: tuple[int, int]) -> bool:
    """Whether the installed release is `release` (major, minor) or later; 0.10 follows 0.9's rules (no public
    source exists for 0.10)."""
    return VERSION >= release


def platform_target() -> str:
    """torch_neuronx.utils.get_platform_target(): the fake has no Neuron device, so NEURON_PLATFORM_TARGET_OVERRIDE
    (which the real honours first) or "inf2"."""
    return os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "inf2")
