"""What every builder shares: the one input (`Target`), child names, labels, selectors, ownerReferences.

Children carry only our labels (`labels`), never the owner's: Helm, Argo CD and Flux track objects by their
labels and would claim (or prune) our children as theirs. The ownerReference is built here rather than with
`kopf.adopt`, which copies every owner label onto the child and names nameless children with `generateName`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from neuronmodel_operator import api
from neuronmodel_operator.api import NeuronModelSpec
from neuronmodel_operator.resolve import OperatorDefaults, Resolved, resolve

COMPONENT_SERVER = "server"
COMPONENT_COMPILE = "compile"

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
#: The label LeaderWorkerSet puts on its pods: "0" on a group's leader, 1.. on its workers.
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
#: Suffix of the LeaderWorkerSet's name. The LWS controller creates a headless Service named exactly like the
#: LeaderWorkerSet (its pods' DNS subdomain, through which workers reach the leader); our ClusterIP Service is
#: `<name>`, so an LWS also named `<name>` would collide with it.
LWS_SUFFIX = "-lws"


@dataclass(frozen=True)
class Target:
    """The one input of every builder: a NeuronModel's identity, its typed spec and what the operator resolved.

    `hpa_metric` is the operator-wide default queue metric (OperatorDefaults.hpa_metric), used when
    spec.autoscaling.metric is unset; `target_from_body` fills it.
    """

    name: str
    namespace: str
    uid: str
    spec: NeuronModelSpec
    resolved: Resolved
    hpa_metric: str = api.DEFAULT_HPA_METRIC

    @property
    def multi_node(self) -> bool:
        return self.spec.parallelism.nodes > 1

    @property
    def runs_vllm(self) -> bool:
        """spec.engine vllm: vLLM Neuron's `vllm serve` (builders/vllm.py), not our runtime."""
        return self.spec.engine == "vllm"


def target_from_body(body: Mapping[str, Any], defaults: OperatorDefaults,
                     pin: Optional[Callable[[NeuronModelSpec], NeuronModelSpec]] = None) -> Target:
    """The Target of a NeuronModel object (as kopf or the API server hands it over). `pin` rewrites the parsed spec
    before it is resolved (reconcile pins hf:// revisions to commits with it, so the compile key has the commit).

    Raises:
        api.SpecError: the spec is invalid or cannot be served (the message names the field and the fix).
    """
    metadata = body["metadata"]
    spec = defaults.filled(api.parse_spec(body.get("spec") or {}))
    if pin is not None:
        spec = pin(spec)
    return Target(name=metadata["name"], namespace=metadata["namespace"], uid=metadata["uid"], spec=spec,
                  resolved=resolve(spec, defaults), hpa_metric=defaults.hpa_metric)


# Child names: one place, so handlers, status and tests agree.

def workload_name(target: Target) -> str:
    """The Deployment (`<name>`) or, when nodes > 1, the LeaderWorkerSet (`<name>-lws`, see LWS_SUFFIX)."""
    return target.name + LWS_SUFFIX if target.multi_node else target.name


def workload_ref(target: Target) -> dict[str, str]:
    """apiVersion/kind/name of the serving workload (the HPA's scaleTargetRef)."""
    if target.multi_node:
        return {"apiVersion": LWS_API_VERSION, "kind": LWS_KIND, "name": workload_name(target)}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": workload_name(target)}


def owner_reference(target: Target) -> dict[str, Any]:
    """The controller reference every child carries: garbage collection deletes children with their owner."""
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": target.name, "uid": target.uid,
            "controller": True, "blockOwnerDeletion": True}


def labels(target: Target, component: str) -> dict[str, str]:
    """Our labels, and only ours (never the owner's)."""
    return {
        api.LABEL_NAME: target.name,
        api.LABEL_APP_NAME: api.APP_NAME,
        api.LABEL_INSTANCE: target.name,
        api.LABEL_COMPONENT: component,
        api.LABEL_MANAGED_BY: api.OPERATOR_NAME,
    }


def selector(target: Target) -> dict[str, str]:
    """All serving pods of a model (leaders and workers): the Deployment's selector and the PDB's."""
    return {api.LABEL_NAME: target.name, api.LABEL_COMPONENT: COMPONENT_SERVER}


def serving_selector(target: Target) -> dict[str, str]:
    """The pods that answer HTTP: every serving pod, or only the groups' leaders when nodes > 1 (the Service's
    selector, and status.selector: one pod per replica, as LeaderWorkerSet's own hpaPodSelector)."""
    if target.multi_node:
        return {**selector(target), LWS_WORKER_INDEX_LABEL: "0"}
    return selector(target)


def selector_string(target: Target) -> str:
    """status.selector, the scale subresource's label selector: "k=v,k=v" (sorted, as the API server prints)."""
    return ",".join(f"{key}={value}" for key, value in sorted(serving_selector(target).items()))


def metadata(target: Target, name: str, component: str,
             annotations: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """A child's metadata: name, namespace, our labels, the ownerReference, and `annotations` when given."""
    meta: dict[str, Any] = {"name": name, "namespace": target.namespace, "labels": labels(target, component)}
    if annotations:
        meta["annotations"] = dict(annotations)
    meta["ownerReferences"] = [owner_reference(target)]
    return meta


#: Fields added after the record's first release, written only away from these defaults (a nested mapping: the
#: fields of that object): the record of a model that does not use them stays byte-identical across the
#: operator's upgrade (reading back fills the defaults).
_LATER_SPEC_DEFAULTS = {"engine": api.DEFAULT_ENGINE, "parallelism": {"efa": None, "groupTopologyKey": None},
                        "speculation": {"draftModel": {"eagle3": None}},
                        "rollout": {"maxUnavailable": None, "maxSurge": None}}
_LATER_RESOLVED_DEFAULTS = {"fetch_image": None, "efa_per_pod": 0, "group_topology_key": None}


def _without(record: dict[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in record.items():
        if isinstance(defaults.get(key), Mapping) and isinstance(value, Mapping):
            out[key] = _without(value, defaults[key])
        elif key not in defaults or value != defaults[key]:
            out[key] = value
    return out


def served_record(target: Target) -> str:
    """api.ANNOTATION_SERVED on the workload: canonical JSON of the spec its pods run and of what it resolved to
    (served.py reads it back to keep serving it while a new compile key's Job runs)."""
    spec = _without(target.spec.model_dump(mode="json", by_alias=True), _LATER_SPEC_DEFAULTS)
    resolved = _without(dataclasses.asdict(target.resolved), _LATER_RESOLVED_DEFAULTS)
    return json.dumps({"spec": spec, "resolved": resolved}, sort_keys=True, separators=(",", ":"))
