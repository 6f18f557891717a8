"""Whether kopf's peering has paused this replica: the retries check it, since kopf's pause does not stop them.

With --peering, kopf pauses a replica while another one of higher priority lives (a Deployment of several replicas;
`kopf freeze`), but it pauses only its own watch streams and hands its pause toggle to no handler; our retries run
on `loop.call_later` (handlers.py) and would go on reconciling failing models beside the active replica.

kopf's rule (kopf/_core/engines/peering.py, process_peering_event), read from its peering object: paused while the
object's status lists another peer that is alive (lastseen + lifetime still ahead) with a higher priority, or with
the same one (kopf then pauses both). The object is the ClusterKopfPeering `name` for a cluster-wide operator, else
the KopfPeering `name` in each watched namespace: any one that pauses pauses the operator, as kopf's do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Mapping, Optional

from neuronmodel_operator.k8s import ApiError, Kube

log = logging.getLogger(__name__)


def paused_by(peering: Optional[Mapping], identity: str, priority: int, now: datetime) -> bool:
    """Does this peering object pause the peer `identity` of `priority` (kopf's rule, above)?"""
    for peer, info in ((peering or {}).get("status") or {}).items():
        if peer == identity or not isinstance(info, Mapping):
            continue
        seen = info.get("lastseen")
        seen = datetime.fromisoformat(str(seen).replace("Z", "+00:00")) if seen else now
        if seen.tzinfo is None:
            seen = seen.replace(tzinfo=timezone.utc)
        if seen + timedelta(seconds=int(info.get("lifetime", 60))) > now and int(info.get("priority", 0)) >= priority:
            return True
    return False


@dataclass(frozen=True)
class Peering:
    """This replica in kopf's peering `name`: called (on a worker thread) before each retry."""

    kube: Kube
    name: str
    namespaces: tuple[str, ...]  # () for a cluster-wide operator
    identity: str  # the id this replica gave kopf
    priority: int  # the priority this replica gave kopf

    def __call__(self) -> bool:
        try:
            found = [self.kube.get_peering(self.name, namespace) for namespace in self.namespaces or (None,)]
        except ApiError as exc:  # a retry is no worse than kopf's own state unknown
            log.warning("could not read kopf's peering %s (%s): retrying as if not paused", self.name, exc)
            return False
        now = datetime.now(timezone.utc)
        return any(paused_by(peering, self.identity, self.priority, now) for peering in found)
