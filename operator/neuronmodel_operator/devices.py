"""Neuron instance types: devices, NeuronCores, HBM, legal tensor-parallel degrees, and what a pod requests.

Sources (see ../shared/research/neuron-apis.md §4.2-4.3 and operator-anchors.md §4):
- device and core counts, device memory: the AWS instance pages for Inf2, Trn1 and Trn2 as tabulated in
  neuron-apis.md §4.3; trn2.3xlarge (1 Trainium2 chip, 8 physical NeuronCore-v3, 96 GiB) from the Trn2 page
  and the Neuron DRA driver's node affinity list;
- legal TP degrees: NxDI's TP guidance (docs 2.23): "Trn2: 1,2,4,8,16,32,64 (LNC2); Inf2: 1,2,4,8,24;
  Trn1: 1,2,8,16,32"; trn1's 2D torus takes only 1, 4, 8 or 16 devices (the Neuron scheduler extension's
  rule), which is the same list in cores. Trn2 at LNC=1 doubles the logical cores: 1..128;
- HBM per core: 16 GiB per NeuronCore-v2 (inf2, trn1), 24 GiB per logical NeuronCore-v3 at LNC=2 (96 GiB per
  chip over 4 logical cores);
- resources: the Neuron device plugin registers `aws.amazon.com/neuroncore` (logical cores, as the node's LNC
  sets them) and `aws.amazon.com/neuron` (whole devices); `neurondevice` was removed in Neuron 2.20;
- vCPUs and host memory: the AWS instance-type pages (aws.amazon.com/ec2/instance-types/inf2/, /trn1/, /trn2/):
  inf2.xlarge 4 vCPU / 16 GiB, inf2.8xlarge 32 / 128, inf2.24xlarge 96 / 384, inf2.48xlarge 192 / 768,
  trn1.2xlarge 8 / 32, trn1.32xlarge and trn1n.32xlarge 128 / 512, trn2.3xlarge 12 / 128, trn2.48xlarge and
  trn2u.48xlarge 192 / 2048.

Host memory matters as much as HBM: NxDI loads the full checkpoint into host RAM before it shards it onto the
NeuronCores, and compiles are RAM-heavy, so the automatic instance choice skips a type whose RAM cannot hold the
weights (`host_fit`), and a pod requests its share of the node's CPU and RAM (`default_requests`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional

NEURONCORE_RESOURCE = "aws.amazon.com/neuroncore"
NEURON_DEVICE_RESOURCE = "aws.amazon.com/neuron"
NEURON_TAINT_KEY = "aws.amazon.com/neuron"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
#: The scheduler the Neuron Helm chart's scheduler extension registers (`--set scheduler.enabled=true`): pods
#: that take more than one but not all of a node's NeuronCores or devices ask for it, for contiguous ones.
NEURON_SCHEDULER_NAME = "my-scheduler"

NeuronResource = Literal["neuroncore", "neuron"]


@dataclass(frozen=True)
class Family:
    """An instance family: one NeuronCore generation, one topology rule."""

    name: str  # "inf2", "trn1", "trn2"
    core_version: str  # "NeuronCore-v2" / "NeuronCore-v3"
    hbm_gib_per_device: int  # device (chip) memory
    physical_cores_per_device: int
    lnc_choices: tuple[int, ...]  # logical NeuronCore configs (NEURON_LOGICAL_NC_CONFIG); (1,) where fixed
    default_lnc: int
    legal_tp: dict[int, tuple[int, ...]]  # lnc -> TP degrees per node NxDI supports
    transformers_neuronx: bool  # TNx ever supported this family (it never ran on trn2)

    def cores_per_device(self, lnc: int) -> int:
        return self.physical_cores_per_device // lnc

    def hbm_gib_per_core(self, lnc: int) -> float:
        return self.hbm_gib_per_device / self.cores_per_device(lnc)


FAMILIES = {
    "inf2": Family("inf2", "NeuronCore-v2", 32, 2, (1,), 1, {1: (1, 2, 4, 8, 24)}, True),
    "trn1": Family("trn1", "NeuronCore-v2", 32, 2, (1,), 1, {1: (1, 2, 8, 16, 32)}, True),
    "trn2": Family("trn2", "NeuronCore-v3", 96, 8, (1, 2), 2,
                   {2: (1, 2, 4, 8, 16, 32, 64), 1: (1, 2, 4, 8, 16, 32, 64, 128)}, False),
}


#: The EFA device plugin's resource (aws-efa-k8s-device-plugin): one per EFA device of the node.
EFA_RESOURCE = "vpc.amazonaws.com/efa"


@dataclass(frozen=True)
class InstanceType:
    name: str
    family: Family
    devices: int
    vcpus: int
    memory_gib: int  # host RAM
    efa_interfaces: int = 0  # EFA devices (vpc.amazonaws.com/efa); 0: none, and no multi-node collectives

    @property
    def dra_device_groups(self) -> bool:
        """The Neuron DRA driver publishes resource.aws.com/devicegroup{1,4,8,16}_id on this type's devices: on
        EFA-enabled instances only (aws-neuron-sdk deploy/eks/dra.rst, "EFA-Enabled Instance Attributes"), so not on
        inf2, trn1.2xlarge or trn2.3xlarge."""
        return self.efa_interfaces > 0

    def cores(self, lnc: int) -> int:
        """Logical NeuronCores the device plugin advertises on this node at `lnc`."""
        return self.devices * self.family.cores_per_device(lnc)

    def allocatable_cpu_m(self) -> int:
        """Millicores left to pods once the kubelet, the system and the DaemonSets have theirs (NODE_RESERVED_*)."""
        return int(self.vcpus * 1000 * (1 - NODE_RESERVED_SHARE)) - NODE_RESERVED_CPU_M

    def allocatable_memory_gib(self) -> float:
        return self.memory_gib * (1 - NODE_RESERVED_SHARE) - NODE_RESERVED_MEMORY_GIB


def _types(family: str, *shapes: tuple) -> dict[str, InstanceType]:
    return {name: InstanceType(name, FAMILIES[family], *shape) for name, *shape in shapes}


#: Every Neuron instance type the operator places pods on, smallest first within a family:
#: (name, Neuron devices, vCPUs, host memory GiB[, EFA devices]). EFA: "trn1.32xlarge has 8 EFA devices,
#: trn1n.32xlarge has 16 ... EFA is currently not available on the smaller instance sizes" (SDK 2.29.1
#: frameworks/torch/torch-neuronx/setup-trn1-multi-node-execution.rst); trn2.48xlarge and trn2u.48xlarge: 16
#: (EC2's 16 network cards of EFAv3, 3.2 Tbps; not read from a pinned source here); inf2 has none.
INSTANCE_TYPES: dict[str, InstanceType] = {
    **_types("inf2", ("inf2.xlarge", 1, 4, 16), ("inf2.8xlarge", 1, 32, 128), ("inf2.24xlarge", 6, 96, 384),
             ("inf2.48xlarge", 12, 192, 768)),
    **_types("trn1", ("trn1.2xlarge", 1, 8, 32), ("trn1.32xlarge", 16, 128, 512, 8),
             ("trn1n.32xlarge", 16, 128, 512, 16)),
    **_types("trn2", ("trn2.3xlarge", 1, 12, 128), ("trn2.48xlarge", 16, 192, 2048, 16),
             ("trn2u.48xlarge", 16, 192, 2048, 16)),
}

#: What a node keeps from its pods' requests: the kubelet's and the OS's reservations (EKS's kube-reserved is
#: about 0.1 vCPU and 0.3-8 GiB with max-pods; the kernel keeps 1-3% of RAM) and the DaemonSets (VPC CNI,
#: kube-proxy, the Neuron device plugin, monitoring agents). Generous on purpose: a default request the node
#: cannot hold leaves the pod Pending, one slightly too small only leaves a little idle.
NODE_RESERVED_CPU_M = 1000
NODE_RESERVED_MEMORY_GIB = 2
NODE_RESERVED_SHARE = 0.04  # of the vCPUs and of the RAM, on top

#: The largest global top-k Neuron's on-device sampler takes (vllm-neuron's `_MAX_NEURON_SAMPLING_TOP_K`, "NEURON has
#: an upper limit on the top_k"); the runtime refuses more at start (runners/device_sampling.py, MAX_DEVICE_TOP_K), the
#: CRD at admission. The host sampler (sampling.onDevice false) and the reference runner have no such limit.
MAX_DEVICE_TOP_K = 256

#: Prefixes of instance types that are Neuron instances (a type with one of them must be in INSTANCE_TYPES).
NEURON_PREFIXES = ("inf2.", "trn1.", "trn1n.", "trn2.", "trn2u.")


def is_neuron_instance(instance_type: str) -> bool:
    return instance_type.startswith(NEURON_PREFIXES)


def lnc_of(instance: InstanceType, requested: Optional[int]) -> int:
    return requested if requested is not None else instance.family.default_lnc


def legal_tp_degrees(instance: InstanceType, lnc: int) -> tuple[int, ...]:
    """TP degrees per node that NxDI supports and that fit on one such node."""
    return tuple(tp for tp in instance.family.legal_tp[lnc] if tp <= instance.cores(lnc))


def smallest_instance_for(cores_per_pod: int, framework: str, loading_gib: float = 0) -> Optional[InstanceType]:
    """The instance type with the fewest NeuronCores on which `cores_per_pod` is a legal TP degree, at the
    family's default LNC, and whose host RAM holds `loading_gib` (the weights while they load); None when no
    Neuron instance does. TNx never ran on trn2, so it is skipped there."""
    fits = [t for t in INSTANCE_TYPES.values()
            if cores_per_pod in legal_tp_degrees(t, t.family.default_lnc)
            and (framework != "tnx" or t.family.transformers_neuronx)
            and host_fit(t, loading_gib)]
    return min(fits, key=lambda t: t.cores(t.family.default_lnc), default=None)


@dataclass(frozen=True)
class NeuronRequest:
    """What one pod asks the device plugin for."""

    resource: str  # NEURONCORE_RESOURCE or NEURON_DEVICE_RESOURCE
    count: int
    cores: int  # logical NeuronCores the pod gets
    devices: int  # devices those cores span

    def as_resources(self) -> dict[str, str]:
        return {self.resource: str(self.count)}


def neuron_request(instance: InstanceType, lnc: int, cores_per_pod: int, mode: NeuronResource) -> NeuronRequest:
    """`aws.amazon.com/neuroncore` = the pod's share of TP, or whole `aws.amazon.com/neuron` devices covering it."""
    devices = math.ceil(cores_per_pod / instance.family.cores_per_device(lnc))
    if mode == "neuron":
        return NeuronRequest(NEURON_DEVICE_RESOURCE, devices, devices * instance.family.cores_per_device(lnc), devices)
    return NeuronRequest(NEURONCORE_RESOURCE, cores_per_pod, cores_per_pod, devices)


#: Bytes per parameter of each dtype; `auto` serves bfloat16 on Neuron.
DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "float32": 4}
#: Weights may use at most this share of HBM: the KV cache, activations and the runtime need the rest.
WEIGHT_SHARE_OF_HBM = 0.9
#: Host RAM a Neuron pod needs while it loads, per byte of weights: NxDI reads the whole checkpoint into host
#: memory, then shards it; the margin covers the process, the tokenizer and the copies made while sharding.
HOST_LOAD_FACTOR = 1.25


def weights_gib(parameters: float, dtype: str) -> float:
    return parameters * DTYPE_BYTES[dtype] / 2**30


def loading_gib(parameters: float, dtype: str) -> float:
    """Host RAM that loading `parameters` weights of `dtype` takes on a Neuron instance."""
    return weights_gib(parameters, dtype) * HOST_LOAD_FACTOR


def host_fit(instance: InstanceType, needed_gib: float) -> bool:
    """Whether the node's RAM left to pods holds `needed_gib`."""
    return needed_gib <= instance.allocatable_memory_gib()


def host_memory_warning(needed_gib: float, instance: InstanceType, sharded: bool) -> Optional[str]:
    """A message when `instance`'s host RAM clearly cannot hold `needed_gib` (the weights while they load; `sharded`:
    they are stored pre-sharded, so each node loads only its own), else None."""
    if host_fit(instance, needed_gib):
        return None
    larger = next((t.name for t in INSTANCE_TYPES.values() if t.family is instance.family
                   and host_fit(t, needed_gib)), None)
    if larger:
        advice = f"use an instanceType with more RAM, e.g. {larger}"
    elif not sharded:
        advice = "store the weights pre-sharded (spec.compileCache.shardedWeights), so each node loads only its own"
    else:
        advice = "raise parallelism.nodes"
    return (f"loading the weights takes about {needed_gib:.0f} GiB of host RAM per node (NxDI reads the checkpoint "
            f"into host memory before it shards it), more than the {instance.allocatable_memory_gib():.0f} GiB "
            f"{instance.name} leaves to pods; {advice}")


def default_requests(instance: InstanceType, lnc: int, cores_per_pod: int, loading: float = 0) -> dict[str, str]:
    """cpu and memory of a pod holding `cores_per_pod` of `instance`'s NeuronCores: its share of what the node
    leaves to pods, and at least the RAM its weights take while they load (`loading` GiB, up to all the node has,
    so that pods that each take part of a node are never packed onto it beyond what loading them all needs).
    Shared by NeuronCores: the same as by devices for pods of whole devices; two 1-core pods on one inf2 device
    get half each, not all of it twice."""
    share = cores_per_pod / instance.cores(lnc)
    allocatable = instance.allocatable_memory_gib()
    memory_gib = min(max(allocatable * share, loading), allocatable)
    return {"cpu": f"{int(instance.allocatable_cpu_m() * share)}m", "memory": f"{int(memory_gib * 1024)}Mi"}


def fit_warning(parameters: float, dtype: str, instance: InstanceType, lnc: int, total_cores: int) -> Optional[str]:
    """A message when the weights alone clearly do not fit the HBM of `total_cores`, else None."""
    weights = weights_gib(parameters, dtype)
    dtype = "bfloat16" if dtype == "auto" else dtype
    hbm_gib = total_cores * instance.family.hbm_gib_per_core(lnc)
    if weights <= WEIGHT_SHARE_OF_HBM * hbm_gib:
        return None
    needed = math.ceil(weights / WEIGHT_SHARE_OF_HBM / instance.family.hbm_gib_per_core(lnc))
    # Name a degree the user can set (the CRD refuses, say, 10 on inf2), or a multi-node shape when none holds it.
    degrees = instance.family.legal_tp[lnc]
    fix = next((tp for tp in degrees if tp >= needed), None)
    if fix is not None:
        larger = f" (on an instanceType larger than {instance.name})" if fix > instance.cores(lnc) else ""
        advice = f"raise parallelism.tensorParallelDegree to {fix}{larger}, or use nodes > 1"
    else:
        per_node = max(degrees)
        nodes = math.ceil(needed / per_node)
        advice = (f"no single {instance.family.name} node holds them: use nodes > 1, e.g. parallelism.nodes "
                  f"{nodes} with tensorParallelDegree {nodes * per_node}")
    return (f"the weights ({weights:.0f} GiB in {dtype}) do not fit {total_cores} NeuronCores x "
            f"{instance.family.hbm_gib_per_core(lnc):.0f} GiB HBM on {instance.name} (with room for the KV cache); "
            f"{advice}")
