"""Deleting the children of a model that its current spec no longer wants (a model switched to multi-node, a PDB no
longer needed, the compile Job of an old key), sparing the content-named ones that an older revision still uses.

Runtime ConfigMaps and ResourceClaimTemplates are named by their content: a pod of an older revision (one
restarting mid-rollout, say) still reads its own, so one goes only once no ReplicaSet (every revision the Deployment
keeps), LeaderWorkerSet StatefulSet or pod of the model refers to it.
"""

from __future__ import annotations

import logging
from typing import Iterable, Optional

from neuronmodel_operator import api
from neuronmodel_operator.builders.common import COMPONENT_SERVER, LWS_SUFFIX, Target
from neuronmodel_operator.k8s import Kube

log = logging.getLogger(__name__)

#: Kinds of children, each listed by label when stale ones must go (a model switched to multi-node, a PDB no
#: longer needed, the compile Job of an old key).
CHILD_KINDS = ("ConfigMap", "Job", "Deployment", "LeaderWorkerSet", "Service", "PodDisruptionBudget",
               "HorizontalPodAutoscaler", "ResourceClaimTemplate")
#: Children named by their content that pods of older revisions may still use: deleted only once none does.
REFERENCED_KINDS = ("ConfigMap", "ResourceClaimTemplate")
#: What holds an old revision's references: when one is deleted (the Deployment controller prunes ReplicaSets past
#: revisionHistoryLimit long after the last reconcile; an old pod ends), what only it used can go.
REVISION_HOLDERS = ("ReplicaSet", "Pod")
#: The label LeaderWorkerSet puts on the StatefulSets (and pods) of one LeaderWorkerSet.
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"


def _references(pod_spec: Optional[dict]) -> set[tuple[str, str]]:
    """(kind, name) of the ConfigMaps and ResourceClaimTemplates a pod spec uses."""
    spec = pod_spec or {}
    return {("ConfigMap", v["configMap"]["name"]) for v in spec.get("volumes") or [] if v.get("configMap")} | \
        {("ResourceClaimTemplate", c["resourceClaimTemplateName"]) for c in spec.get("resourceClaims") or []
         if c.get("resourceClaimTemplateName")}


def _templates(workload: dict) -> Iterable[Optional[dict]]:
    """The pod specs a workload's (or a ReplicaSet's, a StatefulSet's) templates hold."""
    spec = workload.get("spec") or {}
    if "leaderWorkerTemplate" in spec:
        lwt = spec["leaderWorkerTemplate"]
        return [(lwt.get(key) or {}).get("spec") for key in ("leaderTemplate", "workerTemplate")]
    return [(spec.get("template") or {}).get("spec")]


def delete_stale(kube: Kube, target: Target, keep: set, kinds: Iterable[str], ours: set[tuple[str, str]]) -> None:
    """Children of `kinds` with our label that the current spec does not want (compile leftovers: superseded
    Jobs too, a running one of an older template, too small for the compile say, is replaced); each one deleted
    leaves `ours` (the children known to be the model's own).
    Spared: a runtime ConfigMap that a ReplicaSet, StatefulSet or pod of the model still refers to (an old pod
    restarting mid-rollout reads it)."""
    selector = f"{api.LABEL_NAME}={target.name},{api.LABEL_MANAGED_BY}={api.OPERATOR_NAME}"
    in_use: Optional[set[tuple[str, str]]] = None
    for kind in kinds:
        for child in kube.list(kind, target.namespace, selector):
            meta = child["metadata"]
            owned = any(ref.get("uid") == target.uid for ref in meta.get("ownerReferences") or [])
            if not owned or (kind, meta["name"]) in keep:
                continue
            if kind in REFERENCED_KINDS and meta["labels"].get(api.LABEL_COMPONENT) == COMPONENT_SERVER:
                if in_use is None:
                    in_use = _in_use(kube, target)
                if (kind, meta["name"]) in in_use:
                    continue
            log.info("deleting stale %s %s/%s", kind, target.namespace, meta["name"])
            kube.delete(kind, target.namespace, meta["name"])
            ours.discard((kind, meta["name"]))


def _in_use(kube: Kube, target: Target) -> set[tuple[str, str]]:
    """The content-named children (runtime ConfigMaps, ResourceClaimTemplates) that the model's ReplicaSets
    (every revision the Deployment keeps), LeaderWorkerSet StatefulSets and pods refer to."""
    pods_selector = f"{api.LABEL_NAME}={target.name},{api.LABEL_COMPONENT}={COMPONENT_SERVER}"
    found: set[tuple[str, str]] = set()
    owners = kube.list("ReplicaSet", target.namespace, pods_selector) + \
        kube.list("StatefulSet", target.namespace, f"{LWS_NAME_LABEL}={target.name}{LWS_SUFFIX}")
    for owner in owners:
        for pod_spec in _templates(owner):
            found |= _references(pod_spec)
    for pod in kube.list("Pod", target.namespace, pods_selector):
        found |= _references(pod.get("spec"))
    return found
