"""Fixtures of the chart tests: the Helm binaries (Helm 4 `helm`, Helm 3 `helm3`) from the control plane's cache
(`make k8s-bin`; without them these tests skip with the reason) and the chart rendered for each values file
tests/chart/values/<case>.yaml, through scripts/chart_sync.py (which also writes the golden renders)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import chart_sync  # noqa: E402
from chart_objects import objects  # noqa: E402

HELM_MAJORS = ("helm", "helm3")


def need_helm(binary: str) -> Path:
    try:
        return chart_sync.helm(binary)
    except FileNotFoundError as missing:
        pytest.skip(f"HELM NOT INSTALLED: {missing}")


@pytest.fixture(params=HELM_MAJORS)
def helm(request) -> str:
    """Each Helm major in turn (skips the one that is not installed)."""
    need_helm(request.param)
    return request.param


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[dict]]:
    """case -> the objects Helm 4 renders for tests/chart/values/<case>.yaml."""
    need_helm("helm")
    return {case: objects(chart_sync.golden_text(values)) for case, values in chart_sync.cases().items()}
