"""Fake nodes for kwok, shaped like EKS Neuron nodes (labels, taint, extended resources) plus one CPU node.

Device and NeuronCore counts follow the Neuron device plugin: `aws.amazon.com/neuron` counts chips and
`aws.amazon.com/neuroncore` counts logical cores (trn2.48xlarge: 128 physical, 64 at the default LNC=2).
"""

from __future__ import annotations

from k8s.install import K8S_VERSION

NEURON_TAINT = {"key": "aws.amazon.com/neuron", "value": "true", "effect": "NoSchedule"}
KWOK_SELECTOR = "type=kwok"  # kwok manages only the nodes with this label
NODE_INFO = {"kubeletVersion": K8S_VERSION, "kubeProxyVersion": K8S_VERSION, "osImage": "Amazon Linux 2023",
             "operatingSystem": "linux", "architecture": "amd64", "kernelVersion": "6.1.141-amzn2023",
             "containerRuntimeVersion": "containerd://1.7", "machineID": "", "systemUUID": "", "bootID": ""}

# instance type -> (Neuron devices, NeuronCores, vCPU, memory GiB)
SHAPES = {
    "inf2.xlarge": (1, 2, 4, 16),
    "inf2.48xlarge": (12, 24, 192, 768),
    "trn1.32xlarge": (16, 32, 128, 512),
    "trn2.48xlarge": (16, 64, 192, 2048),
    "m5.xlarge": (0, 0, 4, 16),  # CPU-only
}
#: EFA devices the EFA device plugin advertises (vpc.amazonaws.com/efa), where the instance type has them.
EFA = {"trn1.32xlarge": 8, "trn2.48xlarge": 16}
#: The label EKS managed node groups put on their nodes (a multi-node group's default exclusive topology).
NODEGROUP_LABEL = "eks.amazonaws.com/nodegroup"


def node_name(instance_type: str) -> str:
    return "kwok-" + instance_type.replace(".", "-")


#: Local disk of a Neuron node: the operator's pods request the ephemeral storage their downloads, artifacts and
#: compiler caches may fill (tens of GiB each by default), as Neuron node groups are sized for (a large EBS root
#: volume or the trn instances' NVMe); the CPU node keeps EKS's usual small root volume.
NEURON_NODE_DISK = "2Ti"
CPU_NODE_DISK = "100Gi"


def node(instance_type: str, name: str = "", nodegroup: str = "") -> dict:
    """A kwok node of `instance_type`, named `name` (default node_name's), in EKS managed node group `nodegroup`
    (default: one of its own, as each of the harness's nodes is)."""
    devices, cores, cpu, mem_gib = SHAPES[instance_type]
    family = instance_type.split(".")[0]
    name = name or node_name(instance_type)
    nodegroup = nodegroup or name
    resources = {"cpu": str(cpu), "memory": f"{mem_gib}Gi", "pods": "110",
                 "ephemeral-storage": NEURON_NODE_DISK if devices else CPU_NODE_DISK}
    if devices:
        resources |= {"aws.amazon.com/neuron": str(devices), "aws.amazon.com/neuroncore": str(cores)}
    if instance_type in EFA:
        resources["vpc.amazonaws.com/efa"] = str(EFA[instance_type])
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {
                NODEGROUP_LABEL: nodegroup,
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": instance_type,
                "karpenter.k8s.aws/instance-family": family,
                "karpenter.sh/capacity-type": "on-demand",
                "topology.kubernetes.io/region": "us-west-2",
                "topology.kubernetes.io/zone": "us-west-2a",
            },
        },
        "spec": {"taints": [NEURON_TAINT]} if devices else {},
        "status": {"capacity": resources, "allocatable": resources,
                   "nodeInfo": NODE_INFO},
    }


def nodes() -> list[dict]:
    return [node(instance_type) for instance_type in SHAPES]
