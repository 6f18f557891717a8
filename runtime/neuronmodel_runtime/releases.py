"""The Neuron library releases the NxDI and TNx runners were written against, by version.

Each runner branches on the installed version where the library's API differs between releases; this table says
which versions those branches cover. `neuronmodel-runtime info` and /v1/info report whether the version found is one
of them. This module is pure data (no torch, no Neuron import): framework detection uses it.

Sources: the release commits of aws-neuron/neuronx-distributed-inference (2.23 -> 2.29; 2.30/2.31 shipped 0.10.x with
no public source: maintenance releases of 0.9's API) and transformers-neuronx 0.13.x (last shipped with SDK 2.25).

Each line also carries what AWS says about fixing it (`Support`, per instance family): the operator warns about a
model whose image is on a line AWS no longer patches. Sources (../shared/research/neuron-2026.md §0 and §8,
operator-anchors.md §0): NxDI and NxD Core entered maintenance with SDK 2.30 (2026-05-20) and from 2.31 NxDI 0.10
gets only critical and security fixes; the 2026-10-16 announcement keeps it so on inf2/trn1, and the 2026-11-17 one
(announce-eos-nxdi-nxd-core-inference) ends NxDI / NxD Core inference on trn2/trn3 from SDK 2.34 (2026-11-30: no
releases, fixes or security patches; vLLM Neuron is the supported stack there). Earlier NxDI lines get nothing (AWS
patches the maintenance line only). transformers-neuronx's support ended 2025-09-16.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Support:
    """What AWS says about fixes for a release line on some instance families."""

    patched: bool  # AWS still ships fixes for the line there (critical and security ones at least)
    says: str  # what AWS says, with its date, for messages: "in maintenance: critical and security fixes only ..."
    families: tuple[str, ...] = ()  # the instance families (inf2, trn1, trn2, trn3) it is about; (): every family


#: NxDI 0.10 (SDK 2.30/2.31), the maintenance line.
NXDI_UNSUPPORTED_ON_TRN = Support(
    False, "AWS supports no NxDI on trn2/trn3 from Neuron SDK 2.34 (2026-11-30): no releases, fixes or security "
    "patches; vLLM Neuron is the supported stack there", ("trn2", "trn3"))
NXDI_MAINTENANCE = Support(
    True, "NxDI is in maintenance on inf2/trn1 at Neuron SDK 2.31: critical and security fixes only, no new releases",
    ("inf2", "trn1"))
#: Every earlier NxDI line.
NXDI_SUPERSEDED = Support(
    False, "AWS patches no NxDI line before 0.10 (SDK 2.31, the maintenance line) and no new NxDI release is planned")
TNX_END_OF_SUPPORT = Support(False, "transformers-neuronx reached end of support on 2025-09-16 (last in Neuron SDK "
                                    "2.25)")


@dataclass(frozen=True)
class Release:
    """One minor release line of a Neuron library."""

    minor: tuple[int, int]  # (major, minor) of the distribution's version, e.g. (0, 9) for 0.9.17334
    sdk: str  # Neuron SDK release(s) that shipped it
    source: str  # what the runner was written against: the release commit, or why there is none
    support: tuple[Support, ...] = ()  # what AWS says about fixing it; the first whose families match applies

    def support_on(self, family: Optional[str]) -> Optional[Support]:
        """What AWS says about this line on instance `family` (None: a statement about every family, if any)."""
        return next((s for s in self.support if not s.families or family in s.families), None)


#: neuronx-distributed-inference: minor -> release. The runner's version branches are cited against these.
NXDI_RELEASES = (
    Release((0, 3), "2.23", "5de79de (Release 2.23.0)", (NXDI_SUPERSEDED,)),
    Release((0, 4), "2.24", "98c0fea (v0.4.7422)", (NXDI_SUPERSEDED,)),
    Release((0, 5), "2.25", "f9e99f9 (v0.5.9230)", (NXDI_SUPERSEDED,)),
    Release((0, 6), "2.26", "e07f056 (v0.6.10598)", (NXDI_SUPERSEDED,)),
    Release((0, 7), "2.27", "fcb5a86 (v0.7.14366)", (NXDI_SUPERSEDED,)),
    Release((0, 8), "2.28", "cd3abf3", (NXDI_SUPERSEDED,)),
    Release((0, 9), "2.29", "ef2731e (release-2.29-v2)", (NXDI_SUPERSEDED,)),
    Release((0, 10), "2.30-2.31", "no public source: maintenance releases of 0.9 (NxDI is maintenance-only)",
            (NXDI_UNSUPPORTED_ON_TRN, NXDI_MAINTENANCE)),
)
#: transformers-neuronx: the 0.13 line (end of support 2025-09-16).
TNX_RELEASES = (Release((0, 13), "2.22-2.25", "1ade6d7 (0.13.x)", (TNX_END_OF_SUPPORT,)),)

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


def support_of(framework: str, version: Optional[str], family: Optional[str]) -> Optional[Support]:
    """What AWS says about fixes for `framework` `version` on instance `family` (inf2, trn1, trn2, trn3); None when
    the version is not a line of this table."""
    release = release_of(framework, version)
    return release.support_on(family) if release is not None else None


def support_facts(framework: str, version: Optional[str], family: Optional[str]) -> Optional[dict[str, object]]:
    """For `info`, /v1/info and the start-up log: whether AWS still patches `framework` `version` on `family`
    (None when that depends on a family not known here), and what it says (every statement of the line when the
    family is unknown); None for a version not in this table."""
    release = release_of(framework, version)
    if release is None or not release.support:
        return None
    said = [s for s in release.support if family is None or not s.families or family in s.families]
    verdicts = {s.patched for s in said}
    return {"patched": verdicts.pop() if len(verdicts) == 1 else None, "aws_says": "; ".join(s.says for s in said),
            "family": family}


def known(framework: str) -> str:
    """The versions a runner was written against, for messages: `0.3-0.10 (SDK 2.23-2.30-2.31)`."""
    releases = RELEASES[framework]
    first, last = releases[0], releases[-1]
    return (f"{'.'.join(map(str, first.minor))}-{'.'.join(map(str, last.minor))} "
            f"(SDK {first.sdk.split('-')[0]}-{last.sdk.split('-')[-1]})")


__all__ = ["NXDI_MAINTENANCE", "NXDI_RELEASES", "NXDI_SUPERSEDED", "NXDI_UNSUPPORTED_ON_TRN", "RELEASES",
           "TNX_END_OF_SUPPORT", "TNX_RELEASES", "Release", "Support", "known", "parse_version", "release_of",
           "support_facts", "support_of"]
