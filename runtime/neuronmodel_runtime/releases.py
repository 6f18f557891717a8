"""The Neuron library releases the NxDI and TNx runners were written against, by version.

Each runner branches on the installed version where the library's API differs between releases; this table says
which versions those branches cover. `neuronmodel-runtime info` and /v1/info report whether the version found is one
of them. This module is pure data (no torch, no Neuron import): framework detection uses it.

Sources: the release commits of aws-neuron/neuronx-distributed-inference (2.23 -> 2.29; 2.30/2.31 shipped 0.10.x with
no public source: maintenance releases of 0.9's API) and transformers-neuronx 0.13.x (last shipped with SDK 2.25).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Release:
    """One minor release line of a Neuron library."""

    minor: tuple[int, int]  # (major, minor) of the distribution's version, e.g. (0, 9) for 0.9.17334
    sdk: str  # Neuron SDK release(s) that shipped it
    source: str  # what the runner was written against: the release commit, or why there is none


#: neuronx-distributed-inference: minor -> release. The runner's version branches are cited against these.
NXDI_RELEASES = (
    Release((0, 3), "2.23", "5de79de (Release 2.23.0)"),
    Release((0, 4), "2.24", "98c0fea (v0.4.7422)"),
    Release((0, 5), "2.25", "f9e99f9 (v0.5.9230)"),
    Release((0, 6), "2.26", "e07f056 (v0.6.10598)"),
    Release((0, 7), "2.27", "fcb5a86 (v0.7.14366)"),
    Release((0, 8), "2.28", "cd3abf3"),
    Release((0, 9), "2.29", "ef2731e (release-2.29-v2)"),
    Release((0, 10), "2.30-2.31", "no public source: maintenance releases of 0.9 (NxDI is maintenance-only)"),
)
#: transformers-neuronx: the 0.13 line (end of support 2025-09-16).
TNX_RELEASES = (Release((0, 13), "2.22-2.25", "1ade6d7 (0.13.x)"),)

RELEASES = {"nxdi": NXDI_RELEASES, "tnx": TNX_RELEASES}


def parse_version(version: str) -> Optional[tuple[int, ...]]:
    """`0.9.17334` -> (0, 9, 17334); `0.13.798+abc` -> (0, 13, 798); None when it has no leading number."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(part) for part in match.group(0).split(".")) if match else None


def release_of(framework: str, version: Optional[str]) -> Optional[Release]:
    """The release line `version` of `framework` belongs to, or None when the runner was not written against it."""
    parsed = parse_version(version or "")
    if parsed is None or len(parsed) < 2:
        return None
    return next((r for r in RELEASES.get(framework, ()) if r.minor == parsed[:2]), None)


def known(framework: str) -> str:
    """The versions a runner was written against, for messages: `0.3-0.10 (SDK 2.23-2.30-2.31)`."""
    releases = RELEASES[framework]
    first, last = releases[0], releases[-1]
    return (f"{'.'.join(map(str, first.minor))}-{'.'.join(map(str, last.minor))} "
            f"(SDK {first.sdk.split('-')[0]}-{last.sdk.split('-')[-1]})")


__all__ = ["NXDI_RELEASES", "RELEASES", "TNX_RELEASES", "Release", "known", "parse_version", "release_of"]
