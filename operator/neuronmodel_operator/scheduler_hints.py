"""What to do when a multi-node serving group cannot be placed, read from the scheduler's refusal of its pods.

Pure; status.py appends `hint(pods)` to the scheduler's message. With an exclusive-topology key, LeaderWorkerSet's
pod webhook (SetExclusiveAffinities) gives every group pod a required pod affinity to the pods of its own group and
a required anti-affinity to the pods of every other group, both on that key: each value of the key (an EKS managed
node group by default) hosts one group. Read from the message alone, so no node needs reading (no RBAC for nodes):
- "... didn't match pod anti-affinity rules" (or "... didn't satisfy existing pods anti-affinity rules"): other
  groups hold every value of the key the pod may use. A group more than the node groups, or a rollout's surge group:
  it needs a whole free node group, which the documented sizing (one node group per replica) never has.
- "... didn't match pod affinity rules" on a group's leader: the leader is its group's first pod, so no pod of its
  group runs anywhere yet, and the scheduler passes its own affinity on every node that carries the key: the key
  is on none of those nodes (Karpenter and EKS Auto Mode nodes have no eks.amazonaws.com/nodegroup label).
"""

from __future__ import annotations

import re
from typing import Mapping, Optional, Sequence

#: The label LeaderWorkerSet's exclusive affinities select groups by.
GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
#: kube-scheduler's InterPodAffinity filter reasons (pkg/scheduler/framework/plugins/interpodaffinity).
ANTI_AFFINITY = ("didn't match pod anti-affinity rules", "didn't satisfy existing pods anti-affinity rules")
AFFINITY = re.compile(r"(\d+) node\(s\) didn't match pod affinity rules")


def _exclusive_key(pod: Mapping) -> Optional[str]:
    """The topology key of the pod's exclusive-topology affinity (LeaderWorkerSet's), None without one."""
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("podAffinity") or {}
    for term in affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or []:
        expressions = (term.get("labelSelector") or {}).get("matchExpressions") or []
        if any(e.get("key") == GROUP_KEY_LABEL for e in expressions):
            return term.get("topologyKey")
    return None


def _refusal(pod: Mapping) -> str:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return condition.get("message") or ""
    return ""


def hint(pods: Sequence[Mapping]) -> Optional[str]:
    """What to do about the first group pod the scheduler refused for its exclusive topology, None for none."""
    for pod in pods:
        key, refusal = _exclusive_key(pod), _refusal(pod)
        if key is None or not refusal:
            continue
        if any(reason in refusal for reason in ANTI_AFFINITY):
            return (f"each serving group needs a node group of its own (LeaderWorkerSet exclusive topology on {key}) "
                    f"and every one is taken: a rollout's extra (surge) group needs a free one, so set "
                    f"spec.rollout.maxSurge 0 and maxUnavailable 1 (groups are replaced one at a time), or add a "
                    f"node group (one per replica, and one more for a surge)")
        leader = ((pod.get("metadata") or {}).get("labels") or {}).get(WORKER_INDEX_LABEL) == "0"
        if leader and (found := AFFINITY.search(refusal)):
            return (f"the exclusive-topology key {key} is a label on none of the {found.group(1)} node(s) the "
                    f"scheduler tried (Karpenter and EKS Auto Mode nodes carry no eks.amazonaws.com/nodegroup): set "
                    f"spec.parallelism.groupTopologyKey, or the operator's chart value multiNode.groupTopologyKey, to "
                    f"a label that the nodes of one group share and no other group's do, or '' for none")
    return None
