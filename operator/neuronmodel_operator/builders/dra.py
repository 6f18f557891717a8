"""The ResourceClaimTemplate of a model on the Neuron DRA driver (spec.deviceAllocation: dra), resource.k8s.io/v1.

With DRA the pods request no extended resources: each pod gets a ResourceClaim made from this template (the pod's
`resourceClaims` names it, the runtime container's `resources.claims` uses it), which the scheduler allocates from
the driver's ResourceSlices. One request, `neuron`, of exactly the pod's devices from DeviceClass `neuron.aws.com`;
4, 8 or 16 devices must form a connected group (`matchAttribute` on the driver's `resource.aws.com/devicegroup<N>_id`
attribute, as the driver documents; other counts have no group attribute); on trn2 the logical NeuronCore config
goes to the driver in an opaque `NeuronConfig` (vllm-neuron.md §7, the Neuron SDK's deploy/eks/dra.rst).

A ResourceClaimTemplate's spec is immutable, so its name carries a hash of its spec: a change of device count or
LNC is a new template (and a new pod template that names it, which rolls the pods), never a rejected update, and
a pod of the older revision that restarts still finds its own.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Optional

from neuronmodel_operator.builders.common import COMPONENT_SERVER, Target, metadata

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceClaimTemplate"
DEVICE_CLASS = "neuron.aws.com"
DRIVER = "neuron.aws.com"
#: The name of the claim in the pod (spec.resourceClaims) and of the request in the claim.
CLAIM = "neuron"
#: Device counts the driver publishes a connected-group attribute for: resource.aws.com/devicegroup<N>_id.
CONNECTED_GROUPS = (4, 8, 16)


def _claim_spec(target: Target) -> dict[str, Any]:
    """The ResourceClaimSpec: the devices, their connected group, the LNC (trn2)."""
    count = target.resolved.devices_per_pod
    devices: dict[str, Any] = {"requests": [{"name": CLAIM, "exactly": {
        "deviceClassName": DEVICE_CLASS, "allocationMode": "ExactCount", "count": count}}]}
    if count in CONNECTED_GROUPS:
        devices["constraints"] = [{"requests": [CLAIM], "matchAttribute": f"resource.aws.com/devicegroup{count}_id"}]
    if target.resolved.logical_core_config is not None:
        devices["config"] = [{"requests": [CLAIM], "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig",
            "logicalNeuronCore": target.resolved.logical_core_config}}}]
    return {"devices": devices}


def uses_dra(target: Target) -> bool:
    """Pods get their Neuron devices from the DRA driver: spec.deviceAllocation dra on a Neuron runner."""
    return target.spec.device_allocation == "dra" and target.resolved.devices_per_pod > 0


def claim_template_name(target: Target) -> str:
    """`<name>-neuron-<hash of the claim spec>` (see the module docstring: the spec is immutable)."""
    digest = hashlib.sha256(json.dumps(_claim_spec(target), sort_keys=True).encode()).hexdigest()
    return f"{target.name}-neuron-{digest[:10]}"


def resource_claim_template(target: Target) -> Optional[dict[str, Any]]:
    """The ResourceClaimTemplate the pods' claims are made from; None unless `uses_dra`."""
    if not uses_dra(target):
        return None
    return {"apiVersion": API_VERSION, "kind": KIND,
            "metadata": metadata(target, claim_template_name(target), COMPONENT_SERVER),
            "spec": {"spec": _claim_spec(target)}}
