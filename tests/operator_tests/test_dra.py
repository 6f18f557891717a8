"""spec.deviceAllocation dra: the ResourceClaimTemplate (builders/dra.py) and the pods that use it.

Facts, from ../shared/research/vllm-neuron.md §7 (the Neuron SDK's deploy/eks/dra.rst and the EKS user guide):
DeviceClass and driver `neuron.aws.com`; connected subsets of 1/4/8/16 devices through
`matchAttribute: resource.aws.com/devicegroup{N}_id`; the LNC per workload in an opaque
`{apiVersion: neuron.aws.com/v1, kind: NeuronConfig, logicalNeuronCore: N}`; resource.k8s.io/v1 field names
(ExactDeviceRequest under `exactly`, allocationMode ExactCount) from kubernetes staging/src/k8s.io/api/resource/v1.
The apiserver's own validation of these objects runs in tests/integration/test_placement.py (a dry run).
"""

from __future__ import annotations

from typing import Any

import pytest

from neuronmodel_operator import builders, crdgen, devices
from neuronmodel_operator.api import SpecError
from neuronmodel_operator.builders import dra, pod
from operator_tests import golden


def dra_target(case: str, **changes: Any) -> builders.Target:
    return golden.target(case, deviceAllocation="dra", **changes)


def trn1_target(**changes: Any) -> builders.Target:
    """The draft-hf case (TP 8) on trn1.32xlarge, which publishes the connected-group attributes: 4 devices."""
    return dra_target("draft-hf", **{"instanceType": "trn1.32xlarge", **changes})


def claim_spec(target: builders.Target) -> dict[str, Any]:
    template = dra.resource_claim_template(target)
    assert template["apiVersion"] == "resource.k8s.io/v1" and template["kind"] == "ResourceClaimTemplate"
    return template["spec"]["spec"]


def test_the_device_plugin_needs_no_template():
    for case in golden.CASES:
        t = golden.target(case)
        assert (dra.resource_claim_template(t) is None) == (t.spec.device_allocation == "devicePlugin"), case
    assert dra.resource_claim_template(dra_target("tiny-torch")) is None  # the CPU runner has no devices


def test_one_request_of_exactly_the_pods_devices():
    # TP 8 on trn1.32xlarge: 8 NeuronCores = 4 devices, a connected group of 4
    (request,) = claim_spec(trn1_target())["devices"]["requests"]
    assert request == {"name": "neuron", "exactly": {"deviceClassName": "neuron.aws.com",
                                                     "allocationMode": "ExactCount", "count": 4}}


@pytest.mark.parametrize("instance, tp, devices_, group", [
    ("inf2.48xlarge", 2, 1, None),  # one device: connected by itself, no attribute needed
    ("trn1.2xlarge", 2, 1, None),
    ("trn1.32xlarge", 16, 8, "resource.aws.com/devicegroup8_id"),
    ("trn1.32xlarge", 32, 16, "resource.aws.com/devicegroup16_id"),
    ("trn2.48xlarge", 64, 16, "resource.aws.com/devicegroup16_id"),
])
def test_connected_group_constraint_for_4_8_16_devices(instance, tp, devices_, group):
    t = dra_target("draft-hf", instanceType=instance, parallelism={"tensorParallelDegree": tp})
    devices = claim_spec(t)["devices"]
    assert devices["requests"][0]["exactly"]["count"] == devices_
    expected = [{"requests": ["neuron"], "matchAttribute": group}] if group else None
    assert devices.get("constraints") == expected


@pytest.mark.parametrize("tp, devices_", [(4, 2), (8, 4), (24, 12)])
def test_several_devices_where_the_driver_publishes_no_group_attribute_are_refused(tp, devices_):
    """dra.rst: resource.aws.com/devicegroup{1,4,8,16}_id only on EFA-enabled instances. On inf2 a claim of 4 with
    devicegroup4_id never allocates (Pending forever), and one without a constraint gets devices that need not be
    connected, which NxDI cannot use."""
    with pytest.raises(SpecError, match=rf"^spec.deviceAllocation: dra gives each pod {devices_} Neuron devices of one "
                                        r"inf2.48xlarge, which must be connected.*only on EFA-enabled instances "
                                        r"\(trn1.32xlarge, trn1n.32xlarge, trn2.48xlarge, trn2u.48xlarge\); use "
                                        r"deviceAllocation devicePlugin"):
        dra_target("draft-hf", parallelism={"tensorParallelDegree": tp})
    assert [name for name, t in devices.INSTANCE_TYPES.items() if not t.dra_device_groups] == [
        "inf2.xlarge", "inf2.8xlarge", "inf2.24xlarge", "inf2.48xlarge", "trn1.2xlarge", "trn2.3xlarge"]


@pytest.mark.parametrize("selector", [{"karpenter.sh/nodepool": "neuron"}, {"eks.amazonaws.com/compute-type": "auto"}])
def test_dra_on_karpenter_or_auto_mode_nodes_is_refused(selector):
    """EKS supports the Neuron DRA driver on managed and self-managed node groups only (device-management-neuron)."""
    with pytest.raises(SpecError, match=r"^spec.deviceAllocation dra is not supported on Karpenter or EKS Auto Mode "
                                        r"nodes .*use deviceAllocation devicePlugin there"):
        trn1_target(nodeSelector=selector)
    assert golden.target("draft-hf", nodeSelector=selector).spec.device_allocation == "devicePlugin"
    trn1_target(nodeSelector={"eks.amazonaws.com/compute-type": "ec2"})  # a managed node group's nodes
    rule = next(r for r in crdgen.spec_schema()["x-kubernetes-validations"]
                if r["rule"].startswith("self.deviceAllocation != 'dra'"))
    assert rule["message"].startswith("deviceAllocation dra is not supported on Karpenter or EKS Auto Mode nodes")


def test_lnc_goes_to_the_driver_on_trn2_only():
    trn2 = dra_target("trn2-lnc-autoscale")  # LNC 1, TP 32: 4 devices
    assert claim_spec(trn2)["devices"]["config"] == [{"requests": ["neuron"], "opaque": {
        "driver": "neuron.aws.com",
        "parameters": {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 1}}}]
    assert "config" not in claim_spec(trn1_target())["devices"]


def test_pods_claim_instead_of_requesting_extended_resources():
    t = trn1_target()
    template = dra.resource_claim_template(t)
    for spec in (pod.pod_spec(t, pod.SERVE_COMMAND, "serve", "cm"),
                 pod.pod_spec(t, pod.COMPILE_COMMAND, "compile", "cm")):
        assert spec["resourceClaims"] == [{"name": "neuron",
                                           "resourceClaimTemplateName": template["metadata"]["name"]}]
        (container,) = spec["containers"]
        resources = container["resources"]
        assert resources["claims"] == [{"name": "neuron"}]
        assert not any(key.startswith("aws.amazon.com/") for key in resources["requests"])
        assert "limits" not in resources
        assert "schedulerName" not in spec  # the DRA driver places the devices, no scheduler extension
        assert float(resources["requests"]["cpu"].removesuffix("m")) > 0  # still its share of the node
    assert "resourceClaims" not in pod.pod_spec(golden.target("draft-hf"), pod.SERVE_COMMAND, "serve", "cm")


def test_the_dra_case_serves_with_its_template_first():
    children = builders.serving_children(golden.target("trn2-dra"))
    kinds = [c["kind"] for c in children]
    assert kinds.index("ResourceClaimTemplate") < kinds.index("Deployment")
    template = next(c for c in children if c["kind"] == "ResourceClaimTemplate")
    deployment = next(c for c in children if c["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["resourceClaims"] == [
        {"name": "neuron", "resourceClaimTemplateName": template["metadata"]["name"]}]
    devices = template["spec"]["spec"]["devices"]  # TP 16 at LNC 2: 4 devices, connected
    assert devices["requests"][0]["exactly"]["count"] == 4
    assert devices["constraints"][0]["matchAttribute"] == "resource.aws.com/devicegroup4_id"
    assert devices["config"][0]["opaque"]["parameters"]["logicalNeuronCore"] == 2


def test_template_is_owned_labelled_and_named_by_its_content():
    """Its spec is immutable: a new device count or LNC must be a new template, never a rejected update."""
    t = trn1_target()
    meta = dra.resource_claim_template(t)["metadata"]
    assert meta["namespace"] == "models" and meta["labels"]["neuronmodel.dev/name"] == "llama-8b-spec"
    assert meta["ownerReferences"][0]["kind"] == "NeuronModel" and meta["ownerReferences"][0]["controller"] is True
    assert meta["name"].startswith("llama-8b-spec-neuron-") and len(meta["name"]) <= 63
    bigger = trn1_target(parallelism={"tensorParallelDegree": 16})
    assert dra.resource_claim_template(bigger)["metadata"]["name"] != meta["name"]
    assert dra.resource_claim_template(trn1_target(replicas=3))["metadata"]["name"] == meta["name"]
