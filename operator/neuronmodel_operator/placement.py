"""How a model's pods are replaced and where they may get their devices: the rollout a spec leaves unset, and what
the placement fields refuse or warn about beyond the CRD's rules. Pure.

Rollout. A Deployment's surge pod needs spare NeuronCores on some node; a LeaderWorkerSet's surge group needs far
more where the group has an exclusive-topology key (resolve.group_topology_key): LWS's pod webhook gives every pod of
a group a required anti-affinity against other groups' pods on that key, so a surge group needs a whole free node
group (or whatever the key's value stands for). Sized as the docs size it, with one node group per replica, none is
free, the surge group stays Pending and, with maxUnavailable 0, the rollout never lands. So an unset rollout is
maxUnavailable 0 / maxSurge 1 on one node (serving capacity kept) and maxUnavailable 1 / maxSurge 0 for nodes > 1
(a group replaced in place), LeaderWorkerSet's own defaults. A maxSurge the user sets is the user's word that a spare
domain exists: never refused (as LWS and KServe take it), but warned about, since models created before this default
carry maxSurge 1 written into their spec by the older CRD.

DRA. EKS supports the Neuron DRA driver on managed and self-managed node groups, not on Karpenter or Auto Mode nodes
(the device plugin runs there): a nodeSelector naming those is refused (DRA_RULES, and dra_refusal for a spec
admitted under an older CRD). The driver publishes its connected-group attributes
(resource.aws.com/devicegroup{1,4,8,16}_id) on EFA-enabled instances only (aws-neuron-sdk deploy/eks/dra.rst,
"EFA-Enabled Instance Attributes"). A pod of more than one device needs them (builders/dra.py's matchAttribute):
NxDI needs connected devices, a ring segment on inf2, a group of the torus on trn. Dropping the constraint there
would let the driver hand out any devices, which the device plugin with the Neuron scheduler extension does right;
so such a claim is refused (dra_refusal), naming that fix. resolve.py raises what this module finds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

from neuronmodel_operator import devices

if TYPE_CHECKING:  # api.py imports this module, through spec_rules.py, for its CEL rules
    from neuronmodel_operator.api import NeuronModelSpec

#: The rollout of an unset spec.rollout field: (maxUnavailable, maxSurge) by whether a serving group spans nodes.
ROLLOUT_DEFAULTS = {False: (0, 1), True: (1, 0)}
_ZERO = "string(self.rollout.{0}) in ['0', '0%']"
#: The CRD's rule (on the spec): refused is a pair that, with ROLLOUT_DEFAULTS for the unset field, replaces no pod.
ROLLOUT_RULE = (
    f"self.parallelism.nodes == 1 ? !(has(self.rollout.maxSurge) && {_ZERO.format('maxSurge')} && "
    f"(!has(self.rollout.maxUnavailable) || {_ZERO.format('maxUnavailable')})) : "
    f"!(has(self.rollout.maxUnavailable) && {_ZERO.format('maxUnavailable')} && "
    f"(!has(self.rollout.maxSurge) || {_ZERO.format('maxSurge')}))",
    "rollout.maxUnavailable and rollout.maxSurge must not both be 0 (a rollout could replace no pod; unset, they "
    "are 0 and 1 on one node, 1 and 0 for nodes > 1): set maxSurge 1 (needs spare NeuronCores, for nodes > 1 a spare "
    "node group) or maxUnavailable 1")

#: Node labels that select Karpenter or EKS Auto Mode nodes: Karpenter's NodePool label (Auto Mode's nodes carry it
#: too) and Auto Mode's compute type.
KARPENTER_NODEPOOL_LABEL = "karpenter.sh/nodepool"
COMPUTE_TYPE_LABEL = "eks.amazonaws.com/compute-type"
_NOT_ON_KARPENTER = (
    "deviceAllocation dra is not supported on Karpenter or EKS Auto Mode nodes (nodeSelector "
    f"{KARPENTER_NODEPOOL_LABEL} or {COMPUTE_TYPE_LABEL}: auto), which run the Neuron device plugin: use "
    "deviceAllocation devicePlugin there, or select nodes of a managed or self-managed node group")
#: The CRD's rules of deviceAllocation dra.
DRA_RULES = (
    (f"self.deviceAllocation != 'dra' || !has(self.nodeSelector) || !('{KARPENTER_NODEPOOL_LABEL}' in "
     f"self.nodeSelector || ('{COMPUTE_TYPE_LABEL}' in self.nodeSelector && "
     f"self.nodeSelector['{COMPUTE_TYPE_LABEL}'] == 'auto'))", _NOT_ON_KARPENTER),
)


def rollout(spec: NeuronModelSpec) -> dict[str, Union[int, str]]:
    """maxUnavailable / maxSurge of the workload: spec.rollout's, each unset one ROLLOUT_DEFAULTS'."""
    unavailable, surge = ROLLOUT_DEFAULTS[spec.parallelism.nodes > 1]
    asked = spec.rollout
    return {"maxUnavailable": unavailable if asked.max_unavailable is None else asked.max_unavailable,
            "maxSurge": surge if asked.max_surge is None else asked.max_surge}


def _zero(value: Union[int, str]) -> bool:
    return str(value) in ("0", "0%")


def surge_warning(spec: NeuronModelSpec, topology_key: Optional[str]) -> Optional[str]:
    """A message when a multi-node model surges while each group has a topology domain to itself, else None."""
    surge = rollout(spec)["maxSurge"]
    if spec.parallelism.nodes == 1 or topology_key is None or _zero(surge):
        return None
    return (f"rollout.maxSurge is {surge} while each serving group of {spec.parallelism.nodes} nodes has a "
            f"{topology_key} value (a node group) to itself: a rollout's surge group needs a whole free one, and "
            "without it stays Pending and the rollout never completes; keep a spare node group, or set "
            "rollout.maxSurge 0 and rollout.maxUnavailable 1 (or remove spec.rollout: the default for nodes > 1)")


def dra_refusal(spec: NeuronModelSpec, instance: devices.InstanceType, devices_per_pod: int) -> Optional[str]:
    """Why deviceAllocation dra cannot place the pods (the module docstring; the spec field and the fix named), or
    None."""
    if spec.device_allocation != "dra":
        return None
    selector = spec.node_selector
    if KARPENTER_NODEPOOL_LABEL in selector or selector.get(COMPUTE_TYPE_LABEL) == "auto":
        return f"spec.{_NOT_ON_KARPENTER}"
    if devices_per_pod <= 1 or instance.dra_device_groups:
        return None
    having = ", ".join(name for name, t in devices.INSTANCE_TYPES.items() if t.dra_device_groups)
    return (f"spec.deviceAllocation: dra gives each pod {devices_per_pod} Neuron devices of one {instance.name}, which "
            "must be connected, and the Neuron DRA driver publishes its connected-group attributes "
            f"(resource.aws.com/devicegroupN_id) only on EFA-enabled instances ({having}); use deviceAllocation "
            "devicePlugin (with the Neuron scheduler extension), or one of those instance types")


__all__ = ["COMPUTE_TYPE_LABEL", "DRA_RULES", "KARPENTER_NODEPOOL_LABEL", "ROLLOUT_DEFAULTS", "ROLLOUT_RULE",
           "dra_refusal", "rollout", "surge_warning"]
