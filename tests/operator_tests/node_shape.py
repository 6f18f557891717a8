"""The Neuron node docs/eks.md sets up, as its kubelet reports it: what a pod may request of it (Node Allocatable).

The root volume is read from the page (its EC2NodeClass); the rest is EKS's kubelet configuration of the AL2023 AMI
(amazon-eks-ami nodeadm), which the page states in words:

- ephemeral storage: the root volume less the hard eviction threshold `nodefs.available` 10% and kubeReserved
  `ephemeral-storage` 1Gi; the images share that filesystem without counting in Allocatable, so the page's images
  allowance (IMAGES_GIB: the runtime image unpacked, and the next one during an upgrade) comes off too;
- memory: the instance's RAM less what the kernel keeps (KERNEL_SHARE), kubeReserved `11 MiB x maxPods + 255 MiB` at
  the largest max-pods nodeadm sets (250) and the eviction threshold `memory.available` 100Mi;
- cpu: kubeReserved 6% of the first core, 1% of the second, 0.5% of the next two, 0.25% of every further one;
- Neuron: every NeuronCore and device of the instance type (devices.py, from AWS's instance pages), EFA devices as
  the EFA device plugin advertises them.

A sample, a sizing rule or a page change that no longer fits fails tests/operator_tests/test_samples_fit.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from neuronmodel_operator import devices

DOC = Path(__file__).resolve().parents[2] / "docs" / "eks.md"
EVICTION_NODEFS_SHARE = 0.10
KUBE_RESERVED_EPHEMERAL_GIB = 1
IMAGES_GIB = 30
KERNEL_SHARE = 0.03
MAX_PODS = 250
EVICTION_MEMORY_MIB = 100


def root_volume_gib() -> int:
    """The EC2NodeClass's root volume in docs/eks.md (`ebs: {volumeSize: <N>Gi}`)."""
    text = DOC.read_text()
    for block in re.findall(r"^```yaml\n(.*?)^```", text, flags=re.S | re.M):
        for doc in yaml.safe_load_all(block):
            if doc and doc.get("kind") == "EC2NodeClass":
                (mapping,) = doc["spec"]["blockDeviceMappings"]
                return int(mapping["ebs"]["volumeSize"].removesuffix("Gi"))
    raise LookupError(f"{DOC} has no EC2NodeClass")


def ephemeral_gib() -> float:
    """What the pods' ephemeral-storage requests may add up to on one node."""
    volume = root_volume_gib()
    return volume * (1 - EVICTION_NODEFS_SHARE) - KUBE_RESERVED_EPHEMERAL_GIB - IMAGES_GIB


def memory_mib(instance: devices.InstanceType) -> float:
    reserved = 11 * MAX_PODS + 255 + EVICTION_MEMORY_MIB
    return instance.memory_gib * 1024 * (1 - KERNEL_SHARE) - reserved


def cpu_m(instance: devices.InstanceType) -> float:
    shares = [60, 10, 5, 5] + [2.5] * max(0, instance.vcpus - 4)
    return instance.vcpus * 1000 - sum(shares[:instance.vcpus])


def allocatable(instance: devices.InstanceType, lnc: int) -> dict[str, float]:
    """The node's Allocatable, in millicores, MiB, GiB and counts."""
    return {"cpu": cpu_m(instance), "memory": memory_mib(instance), "ephemeral-storage": ephemeral_gib(),
            devices.NEURONCORE_RESOURCE: instance.cores(lnc), devices.NEURON_DEVICE_RESOURCE: instance.devices,
            devices.EFA_RESOURCE: instance.efa_interfaces}
