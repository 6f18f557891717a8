"""resolve.py: the instance, cores and resources a spec gets, the SpecErrors a user sees, and the compile key."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from typing import Any

import pytest

from neuronmodel_operator import api, crdgen
from neuronmodel_operator.api import SpecError, parse_spec
from neuronmodel_operator.resolve import OperatorDefaults, resolve

DEFAULTS = OperatorDefaults(image="registry.example/neuronmodel-runtime:1.0", hpa_metric="queue")


def spec(**fields: Any) -> dict:
    base: dict[str, Any] = {"model": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct"}, "replicas": 1}
    base.update(fields)
    return base


def resolved(body: dict, defaults: OperatorDefaults = DEFAULTS):
    return resolve(parse_spec(body), defaults)


def refused(body: dict) -> str:
    with pytest.raises(SpecError) as err:
        resolved(body)
    return str(err.value)


# --- instance, cores, resources ------------------------------------------------------------------------------

@pytest.mark.parametrize("tp, instance, family, cores_per_device", [
    (2, None, "inf2", 2), (24, "inf2.48xlarge", "inf2", 2), (32, "trn1.32xlarge", "trn1", 2),
    (64, "trn2.48xlarge", "trn2", 4),
])
def test_instance_chosen_when_unset(tp, instance, family, cores_per_device):
    r = resolved(spec(parallelism={"tensorParallelDegree": tp}))
    assert r.instance_family == family
    if instance:
        assert r.instance_type == instance
    assert r.cores_per_pod == tp
    assert r.neuron_resources == {"aws.amazon.com/neuroncore": str(tp)}
    assert r.devices_per_pod == tp // cores_per_device


def test_tp_2_unset_gets_a_two_core_instance():
    r = resolved(spec(parallelism={"tensorParallelDegree": 2}))
    assert r.instance_type in ("inf2.xlarge", "inf2.8xlarge", "trn1.2xlarge")


def test_explicit_instance_is_respected():
    # TP 2 fits inf2.xlarge, yet the user asked for inf2.48xlarge.
    r = resolved(spec(instanceType="inf2.48xlarge", parallelism={"tensorParallelDegree": 2}))
    assert (r.instance_type, r.instance_family, r.cores_per_pod, r.devices_per_pod) == ("inf2.48xlarge", "inf2", 2, 1)
    r = resolved(spec(instanceType="trn1n.32xlarge", parallelism={"tensorParallelDegree": 32}))
    assert r.instance_type == "trn1n.32xlarge"


def test_trn2_lnc():
    default = resolved(spec(instanceType="trn2.48xlarge", parallelism={"tensorParallelDegree": 8}))
    assert default.logical_core_config == 2 and default.devices_per_pod == 2
    lnc1 = resolved(spec(instanceType="trn2.48xlarge", parallelism={"tensorParallelDegree": 128,
                                                                    "logicalCoreConfig": 1}))
    assert lnc1.logical_core_config == 1 and lnc1.devices_per_pod == 16 and lnc1.cores_per_pod == 128
    inf2 = resolved(spec(instanceType="inf2.xlarge", parallelism={"tensorParallelDegree": 2}))
    assert inf2.logical_core_config is None  # LNC is a trn2 setting only


def test_whole_device_mode():
    r = resolved(spec(instanceType="inf2.48xlarge", neuronResource="neuron", parallelism={"tensorParallelDegree": 8}))
    assert r.neuron_resources == {"aws.amazon.com/neuron": "4"}
    assert (r.cores_per_pod, r.devices_per_pod) == (8, 4)


def test_multi_node_requests_the_per_node_share():
    r = resolved(spec(instanceType="trn1.32xlarge", parallelism={"tensorParallelDegree": 64, "nodes": 2}))
    assert r.neuron_resources == {"aws.amazon.com/neuroncore": "32"} and r.cores_per_pod == 32


@pytest.mark.parametrize("instance", [None, "inf2.xlarge", "trn2.48xlarge", "m5.xlarge"])
def test_torch_requests_no_neuron_resources(instance):
    fields = {"framework": "torch"}
    if instance:
        fields["instanceType"] = instance
    r = resolved(spec(**fields, parallelism={"tensorParallelDegree": 1}))
    assert r.neuron_resources == {}
    assert (r.cores_per_pod, r.devices_per_pod) == (0, 0)
    assert r.instance_type == instance
    assert r.logical_core_config is None


def test_image_from_spec_else_the_operators():
    assert resolved(spec()).image == DEFAULTS.image
    assert resolved(spec(image="mine:2")).image == "mine:2"


def test_as_status_is_camel_case_and_valid():
    r = resolved(spec(instanceType="trn2.48xlarge", parallelism={"tensorParallelDegree": 8}))
    shown = api.ResolvedStatus.model_validate(r.as_status())
    assert shown.neuron_cores_per_pod == 8 and shown.neuron_devices_per_pod == 2
    assert shown.logical_core_config == 2 and shown.instance_family == "trn2" and shown.compile_key == r.compile_key


def test_fit_warning_reaches_resolved():
    big = resolved(spec(model={"source": "hf://org/m", "parameters": "70B"}, instanceType="inf2.48xlarge",
                        parallelism={"tensorParallelDegree": 8}))
    assert len(big.warnings) == 1 and "tensorParallelDegree" in big.warnings[0]
    small = resolved(spec(model={"source": "hf://org/m", "parameters": "8B"}, parallelism={"tensorParallelDegree": 2}))
    assert small.warnings == ()


# --- SpecError: each names the field and how to fix it -------------------------------------------------------

def test_no_instance_holds_the_tp():
    message = refused(spec(parallelism={"tensorParallelDegree": 128}))
    assert message.startswith("spec.parallelism")
    assert "128" in message and re.search(r"nodes|TP degree", message)


def test_tnx_on_trn2():
    message = refused(spec(framework="tnx", instanceType="trn2.48xlarge", parallelism={"tensorParallelDegree": 8}))
    assert message.startswith("spec.framework")
    assert "nxdi" in message  # the fix


def test_tnx_with_sharded_weights():
    message = refused(spec(framework="tnx", compileCache={"url": "s3://bucket/cache", "shardedWeights": True}))
    assert message.startswith("spec.compileCache.shardedWeights") and "nxdi" in message


def test_tnx_tp_only_trn2_holds():
    message = refused(spec(framework="tnx", parallelism={"tensorParallelDegree": 64}))
    assert message.startswith("spec.parallelism") and "64" in message


@pytest.mark.parametrize("instance", ["inf2.48xlarge", "trn1.32xlarge"])
def test_lnc_on_non_trn2(instance):
    message = refused(spec(instanceType=instance, parallelism={"tensorParallelDegree": 8, "logicalCoreConfig": 2}))
    assert message.startswith("spec.parallelism.logicalCoreConfig")
    assert "trn2" in message
    assert re.search(r"remove it|set a trn2 instanceType", message), message  # the fix


@pytest.mark.parametrize("instance, tp", [("trn1.32xlarge", 4), ("inf2.xlarge", 4), ("inf2.48xlarge", 16),
                                          ("trn2.3xlarge", 8), ("inf2.24xlarge", 24)])
def test_illegal_tp_on_the_chosen_instance(instance, tp):
    message = refused(spec(instanceType=instance, parallelism={"tensorParallelDegree": tp}))
    assert message.startswith("spec.parallelism")
    assert instance in message and str(tp) in message
    legal = re.search(r"legal: ([\d, ]+)", message)
    assert legal, message  # the fix: the degrees that work here
    assert tp not in [int(x) for x in legal.group(1).split(",")]


def test_unknown_neuron_instance_type():
    message = refused(spec(instanceType="inf2.96xlarge", parallelism={"tensorParallelDegree": 2}))
    assert message.startswith("spec.instanceType") and "inf2.48xlarge" in message


def test_nodes_must_divide_tp():
    message = refused(spec(instanceType="trn1.32xlarge", parallelism={"tensorParallelDegree": 32, "nodes": 3}))
    assert "spec.parallelism.nodes" in message


@pytest.mark.parametrize("fields", [{"instanceType": "inf2.xlarge"}, {"framework": "tnx"}, {}],
                         ids=["auto-inf2", "tnx", "auto-no-instance-type"])
def test_a_global_top_k_above_the_device_limit_is_refused_on_a_neuron_runner(fields):
    # framework auto without instanceType is placed on a Neuron instance: a Neuron runner too
    message = refused(spec(**fields, sampling={"globalTopK": 257}))
    assert message.startswith("spec.sampling.globalTopK: 257 is above 256")
    assert "256 or less" in message and "spec.sampling.onDevice false" in message
    assert resolved(spec(**fields, sampling={"globalTopK": 256})).compile_key
    assert resolved(spec(**fields, sampling={"globalTopK": 1000, "onDevice": False})).compile_key  # host sampling


@pytest.mark.parametrize("instance", [None, "m5.xlarge", "inf2.xlarge"])
def test_the_reference_runner_takes_any_global_top_k(instance):
    fields = {"instanceType": instance} if instance else {}
    assert resolved(spec(framework="torch", sampling={"globalTopK": 1000}, **fields)).cores_per_pod == 0


def test_neuron_config_overrides_are_refused_with_the_reference_runner():
    message = refused(spec(framework="torch", neuronConfigOverrides={"fused_qkv": True}))
    assert message.startswith("spec.neuronConfigOverrides: framework torch") and "nxdi" in message
    assert resolved(spec(framework="torch", neuronConfigOverrides={})).cores_per_pod == 0  # none: nothing to refuse
    for framework in ("auto", "nxdi", "tnx"):
        assert resolved(spec(framework=framework, neuronConfigOverrides={"fused_qkv": True})).compile_key


# --- support: AWS's patches of the image's line (warnings, never refusals) ------------------------------------------

RELEASED = OperatorDefaults(image_version="0.1.0")
SDK228 = "ghcr.io/neuronmodel/neuronmodel-runtime:0.1.0-runtime-nxdi-sdk2.28"


def reasons(body: dict, defaults: OperatorDefaults = RELEASED) -> list[str]:
    return [w.reason for w in resolved(body, defaults).warnings]


@pytest.mark.parametrize("body", [
    spec(instanceType="inf2.xlarge"), spec(instanceType="trn1.32xlarge", parallelism={"tensorParallelDegree": 32}),
    spec(instanceType="trn1n.32xlarge", framework="nxdi", parallelism={"tensorParallelDegree": 32}),
    spec(framework="torch"), spec(framework="torch", instanceType="trn2.48xlarge"),
    spec(instanceType="inf2.xlarge", image="mine.example/rt:7"),  # an image the table does not know: not judged
    spec(instanceType="trn2.3xlarge", image="mine.example/rt:7"),  # auto on it: maybe not NxDI
])
def test_no_support_warning_where_aws_patches_the_line_or_nothing_is_known(body):
    assert reasons(body) == []


@pytest.mark.parametrize("body", [
    spec(instanceType="trn2.48xlarge", parallelism={"tensorParallelDegree": 64}),
    spec(instanceType="trn2u.48xlarge", framework="nxdi"),
    spec(instanceType="trn2.3xlarge", framework="nxdi", image="mine.example/rt:7"),  # NxDI, whatever the image
])
def test_nxdi_on_trn2_is_served_with_a_warning(body):
    r = resolved(body, RELEASED)
    (warning,) = r.warnings
    assert warning.reason == "NxdiUnsupportedOnTrn2" and r.image  # served all the same
    assert "NxDI on trn2" in warning and "SDK 2.34 (2026-11-30)" in warning
    assert "vLLM Neuron is the supported stack there" in warning and "move to vLLM Neuron (engine: vllm)" in warning
    assert "while these pods keep serving" in warning


def test_the_sdk_2_28_image_by_spec_image_is_served_with_a_warning_and_the_fix():
    r = resolved(spec(instanceType="inf2.xlarge", image=SDK228), RELEASED)
    assert r.image == SDK228
    (warning,) = r.warnings
    assert warning.reason == "UnpatchedRuntime"
    assert warning.startswith("The runtime-nxdi-sdk2.28 image (NxDI 0.8.16251, Neuron SDK 2.28.0) is on a line AWS "
                              "no longer patches: ")
    assert "Remove spec.image, for the runtime-nxdi-sdk2.31 image (NxDI 0.10.18399, Neuron SDK 2.31.1), the " \
           "default, which AWS patches on inf2" in warning
    assert "keep this image only for NKI kernels on NeuronCore-v2" in warning and "driver older than 2.29" in warning
    # the same image as the operator's --runtime-image: that is what to remove
    (warning,) = resolved(spec(instanceType="trn1.2xlarge"), OperatorDefaults(image=SDK228)).warnings
    assert "Remove the operator's --runtime-image (chart value runtimeImage.image)" in warning and "trn1" in warning


def test_tnx_is_served_with_its_end_of_support():
    (warning,) = resolved(spec(instanceType="inf2.xlarge", framework="tnx"), RELEASED).warnings
    assert warning.reason == "UnpatchedRuntime" and "end of support on 2025-09-16" in warning
    assert "Use framework nxdi (or auto), for the runtime-nxdi-sdk2.31 image" in warning
    # auto on the TNx image runs the NxDI it carries (0.5), which AWS does not patch either
    tnx_image = spec(instanceType="inf2.xlarge", image="r.example/nm:1-runtime-tnx-sdk2.25")
    (warning,) = resolved(tnx_image, RELEASED).warnings
    assert warning.startswith("The runtime-tnx-sdk2.25 image (NxDI 0.5.9230, Neuron SDK 2.25.0)")
    assert "Remove spec.image" in warning


# --- compile key ---------------------------------------------------------------------------------------------

BASE = spec(model={"source": "hf://meta-llama/Llama-3.1-8B-Instruct", "revision": "abc123", "dtype": "bfloat16"},
            instanceType="inf2.48xlarge", parallelism={"tensorParallelDegree": 8},
            compileCache={"url": "s3://cache/prod"})
TRN2 = spec(model={"source": "hf://meta-llama/Llama-3.1-8B-Instruct"}, instanceType="trn2.48xlarge",
            parallelism={"tensorParallelDegree": 8})


def key(body: dict, defaults: OperatorDefaults = DEFAULTS) -> str:
    return resolved(body, defaults).compile_key


def changed(body: dict, path: str, value: Any) -> dict:
    out = copy.deepcopy(body)
    *parents, last = path.split(".")
    node = out
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return out


def test_compile_key_is_a_stable_sha256():
    first = key(BASE)
    assert re.fullmatch(r"[0-9a-f]{64}", first)
    assert key(copy.deepcopy(BASE)) == first
    # Key order and spelled-out defaults do not matter: the same spec is the same key.
    reordered = dict(reversed(list(copy.deepcopy(BASE).items())))
    assert key(reordered) == first
    assert key(changed(BASE, "batching", {"maxBatchSize": 8, "maxContextLength": 1024, "maxSeqLen": 2048})) == first


@pytest.mark.parametrize("path, value", [
    ("model.source", "hf://meta-llama/Llama-3.1-8B"),
    ("model.revision", "def456"),
    ("model.dtype", "float16"),
    ("parallelism.tensorParallelDegree", 24),
    ("batching.maxBatchSize", 4),
    ("batching.maxContextLength", 512),
    ("batching.maxSeqLen", 4096),
    ("sampling.onDevice", False),
    ("sampling.globalTopK", 64),
    ("speculation", {"mode": "promptLookup"}),
    ("image", "registry.example/neuronmodel-runtime:1.1"),
    ("instanceType", "trn1.32xlarge"),  # another family: other compiled graphs
    ("framework", "tnx"),
    ("compileCache.shardedWeights", True),  # the artifacts then hold the weights too
])
def test_compile_key_changes_with_what_changes_the_graphs(path, value):
    assert key(changed(BASE, path, value)) != key(BASE)


def test_compile_key_changes_with_the_operator_default_image():
    other = OperatorDefaults(image="registry.example/neuronmodel-runtime:2.0", hpa_metric="queue")
    assert key(BASE, other) != key(BASE)


def test_compile_key_changes_with_lnc():
    lnc1 = changed(TRN2, "parallelism.logicalCoreConfig", 1)
    assert key(lnc1) != key(TRN2)
    assert key(changed(TRN2, "parallelism.logicalCoreConfig", 2)) == key(TRN2)  # 2 is trn2's default


def test_compile_key_same_within_a_family():
    # The graphs depend on the family (NeuronCore generation), not on how many chips the node has.
    assert key(changed(BASE, "instanceType", "inf2.24xlarge")) == key(BASE)


@pytest.mark.parametrize("path, value", [
    ("replicas", 5),
    ("replicas", 0),
    ("resources", {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "96Gi"}}),
    ("nodeSelector", {"karpenter.sh/capacity-type": "spot"}),
    ("tolerations", [{"key": "dedicated", "operator": "Exists"}]),
    ("server", {"port": 9000, "apiKeySecretRef": {"name": "key"}}),
    ("rollout", {"maxUnavailable": 1, "maxSurge": 0}),
    ("schedulerName", "my-scheduler"),
    ("serviceAccountName", "irsa"),
    ("neuronResource", "neuron"),
    ("compileCache", {"url": "s3://other-cache/x", "policy": "Always"}),
    ("model.servedModelName", "llama"),
    ("model.tokenSecretRef", {"name": "hf"}),
    ("model.parameters", "8B"),
])
def test_compile_key_ignores_what_does_not_change_the_graphs(path, value):
    assert key(changed(BASE, path, value)) == key(BASE)


def test_compile_key_ignores_autoscaling_vs_replicas():
    body = copy.deepcopy(BASE)
    del body["replicas"]
    body["autoscaling"] = {"minReplicas": 1, "maxReplicas": 4}
    assert key(body) == key(BASE)


# --- compile Job ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cache, job", [
    (None, False),
    ({"url": "s3://cache/prod"}, True),  # IfNotCached by default
    ({"url": "s3://cache/prod", "policy": "IfNotCached"}, True),
    ({"url": "pvc://claim/cache", "policy": "Always"}, True),
    ({"url": "pvc://claim/cache", "policy": "Never"}, False),
    ({"policy": "Always"}, False),  # nowhere to put the artifacts
])
def test_compile_job_only_with_a_cache_url_and_policy_not_never(cache, job):
    body = copy.deepcopy(BASE)
    body.pop("compileCache")
    if cache is not None:
        body["compileCache"] = cache
    assert resolved(body).compile_job is job


# --- runtime image -------------------------------------------------------------------------------------------

PER_FAMILY = OperatorDefaults(image_repository="registry.example/nm", image_version="1.0")


@pytest.mark.parametrize("body, target", [
    (spec(instanceType="inf2.xlarge"), "runtime-nxdi-sdk2.31"),  # auto is NxDI where NxDI serves the family
    (spec(instanceType="inf2.48xlarge", framework="nxdi", parallelism={"tensorParallelDegree": 24}),
     "runtime-nxdi-sdk2.31"),
    (spec(instanceType="trn1.32xlarge", parallelism={"tensorParallelDegree": 32}), "runtime-nxdi-sdk2.31"),
    (spec(instanceType="trn1n.32xlarge", parallelism={"tensorParallelDegree": 32}), "runtime-nxdi-sdk2.31"),
    (spec(parallelism={"tensorParallelDegree": 2}), "runtime-nxdi-sdk2.31"),  # no instanceType: the smallest
    (spec(instanceType="trn2.48xlarge", parallelism={"tensorParallelDegree": 64}), "runtime-nxdi-sdk2.31"),
    (spec(instanceType="trn2u.48xlarge", framework="nxdi"), "runtime-nxdi-sdk2.31"),
    (spec(instanceType="trn2.3xlarge"), "runtime-nxdi-sdk2.31"),
    (spec(parallelism={"tensorParallelDegree": 64}), "runtime-nxdi-sdk2.31"),  # only trn2 holds 64 cores
    (spec(instanceType="inf2.xlarge", framework="tnx"), "runtime-tnx-sdk2.25"),
    (spec(instanceType="trn1.2xlarge", framework="tnx"), "runtime-tnx-sdk2.25"),
    (spec(framework="torch"), "runtime-cpu"),
    (spec(framework="torch", instanceType="inf2.xlarge"), "runtime-cpu"),  # the reference runner, on any node
])
def test_image_chosen_per_family_and_framework(body, target):
    assert resolved(body, PER_FAMILY).image == f"registry.example/nm:1.0-{target}"
    assert resolved(body, PER_FAMILY).as_status()["image"] == f"registry.example/nm:1.0-{target}"


def test_spec_image_then_the_operator_image_override_the_table():
    body = spec(instanceType="trn2.48xlarge")
    assert resolved(body, PER_FAMILY).image.endswith("-runtime-nxdi-sdk2.31")
    override = OperatorDefaults(image="neuronmodel-runtime:dev", image_repository="registry.example/nm")
    assert resolved(body, override).image == "neuronmodel-runtime:dev"
    assert resolved(spec(framework="torch"), override).image == "neuronmodel-runtime:dev"
    own = spec(instanceType="trn2.48xlarge", image="mine.example/rt:7")
    assert resolved(own, override).image == resolved(own, PER_FAMILY).image == "mine.example/rt:7"


def test_default_version_is_the_package_version():
    assert OperatorDefaults().image_version == "0.1.0"
    assert resolved(spec(framework="torch"), OperatorDefaults()).image == \
        "ghcr.io/neuronmodel/neuronmodel-runtime:0.1.0-runtime-cpu"


def _key_before_overrides(body: dict, defaults: OperatorDefaults = DEFAULTS) -> str:
    """compile_key as operators before spec.neuronConfigOverrides computed it (copied, not imported)."""
    s, r = parse_spec(body), resolved(body, defaults)
    inputs = {
        "model": {"source": s.model.source, "revision": s.model.revision, "dtype": s.model.dtype},
        "framework": s.framework, "image": r.image, "instanceFamily": r.instance_family,
        "logicalCoreConfig": r.logical_core_config,
        "parallelism": {"tensorParallelDegree": s.parallelism.tensor_parallel_degree, "nodes": s.parallelism.nodes},
        "batching": s.batching.model_dump(mode="json", by_alias=True),
        "sampling": s.sampling.model_dump(mode="json", by_alias=True),
        "speculation": s.speculation.model_dump(mode="json", by_alias=True),
        "shardedWeights": s.compile_cache.sharded_weights,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@pytest.mark.parametrize("body", [BASE, TRN2, spec(framework="torch"), changed(BASE, "neuronConfigOverrides", {})],
                         ids=["inf2", "trn2", "torch", "empty-overrides"])
def test_without_overrides_the_compile_key_is_the_one_before_the_field(body):
    # An operator upgrade must not change the key (and recompile) of a model that sets no overrides.
    assert key(body) == _key_before_overrides(body)
    assert key(body, PER_FAMILY) == _key_before_overrides(body, PER_FAMILY)


def test_neuron_config_overrides_are_in_the_compile_key():
    fused = changed(BASE, "neuronConfigOverrides", {"fused_qkv": True})
    assert key(fused) != key(BASE)
    assert key(changed(BASE, "neuronConfigOverrides", {"fused_qkv": False})) != key(fused)
    assert key(changed(BASE, "neuronConfigOverrides", {"fused_qkv": True, "mlp_kernel_enabled": True})) != key(fused)
    nested = {"a": 1, "quantization_config": {"dtype": "f8e4m3", "modules": ["mlp"]}}
    reordered = {"quantization_config": {"modules": ["mlp"], "dtype": "f8e4m3"}, "a": 1}
    assert key(changed(BASE, "neuronConfigOverrides", nested)) == key(changed(BASE, "neuronConfigOverrides",
                                                                                reordered))


def test_compile_key_changes_with_the_image_chosen():
    # Another target is another SDK and compiler: other graphs. Another tag version: maybe another runner too.
    assert key(BASE, PER_FAMILY) != key(changed(BASE, "framework", "tnx"), PER_FAMILY)
    newer = OperatorDefaults(image_repository="registry.example/nm", image_version="1.1")
    assert key(BASE, PER_FAMILY) != key(BASE, newer)
    assert key(BASE, PER_FAMILY) == key(copy.deepcopy(BASE), PER_FAMILY)


# --- placement: the Neuron scheduler extension, host RAM, node paths -------------------------------------------

def test_partial_node_pods_get_the_neuron_scheduler():
    partial = resolved(spec(instanceType="inf2.48xlarge", parallelism={"tensorParallelDegree": 8}))
    assert partial.scheduler_name == "my-scheduler" and partial.warnings == ()
    assert api.ResolvedStatus.model_validate(partial.as_status()).scheduler_name == "my-scheduler"
    devices_ = resolved(spec(instanceType="trn1.32xlarge", parallelism={"tensorParallelDegree": 8},
                             neuronResource="neuron"))
    assert (devices_.neuron_resources, devices_.scheduler_name) == ({"aws.amazon.com/neuron": "4"}, "my-scheduler")


@pytest.mark.parametrize("body", [
    spec(instanceType="inf2.xlarge", parallelism={"tensorParallelDegree": 2}),  # the whole node
    spec(instanceType="inf2.48xlarge", parallelism={"tensorParallelDegree": 24}),
    spec(instanceType="trn2.48xlarge", parallelism={"tensorParallelDegree": 64}),
    spec(instanceType="trn1.32xlarge", parallelism={"tensorParallelDegree": 64, "nodes": 2}),  # 32 per node: all
    spec(instanceType="inf2.48xlarge"),  # one NeuronCore is always contiguous
    spec(instanceType="trn2.48xlarge", parallelism={"tensorParallelDegree": 4}, neuronResource="neuron"),  # 1 device
    spec(framework="torch"),
    spec(instanceType="trn1.32xlarge", parallelism={"tensorParallelDegree": 8}, deviceAllocation="dra"),
])
def test_no_scheduler_where_the_device_plugin_has_no_choice_to_make(body):
    r = resolved(body)
    assert r.scheduler_name is None and "schedulerName" not in r.as_status() and r.warnings == ()


def test_spec_scheduler_name_always_wins():
    for body in (spec(instanceType="inf2.48xlarge", parallelism={"tensorParallelDegree": 8}),
                 spec(instanceType="inf2.xlarge", parallelism={"tensorParallelDegree": 2}), spec(framework="torch")):
        assert resolved({**body, "schedulerName": "volcano"}).scheduler_name == "volcano"


def test_without_a_neuron_scheduler_partial_pods_carry_a_warning():
    off = OperatorDefaults(image="registry.example/neuronmodel-runtime:1.0", neuron_scheduler_name=None)
    r = resolved(spec(instanceType="inf2.48xlarge", parallelism={"tensorParallelDegree": 8}), off)
    assert r.scheduler_name is None
    (warning,) = r.warnings
    assert "8 of the 24 NeuronCores" in warning and "contiguous" in warning
    assert "--neuron-scheduler-name" in warning and "spec.schedulerName" in warning
    assert resolved(spec(instanceType="inf2.xlarge", parallelism={"tensorParallelDegree": 2}), off).warnings == ()
    named = resolved(spec(instanceType="inf2.48xlarge", parallelism={"tensorParallelDegree": 8},
                          schedulerName="my-scheduler"), off)
    assert (named.scheduler_name, named.warnings) == ("my-scheduler", ())


def test_automatic_instance_holds_the_weights_in_host_ram():
    # TP 2: inf2.xlarge has the NeuronCores, but 16 GiB of RAM cannot load an 8B checkpoint (~15 GiB in bf16).
    assert resolved(spec(parallelism={"tensorParallelDegree": 2})).instance_type == "inf2.xlarge"
    assert resolved(spec(model={"source": "hf://org/m", "parameters": "1B"},
                         parallelism={"tensorParallelDegree": 2})).instance_type == "inf2.xlarge"
    eight = resolved(spec(model={"source": "hf://org/m", "parameters": "8B"}, parallelism={"tensorParallelDegree": 2}))
    assert eight.instance_type == "inf2.8xlarge" and eight.warnings == ()


def test_no_instance_has_the_host_ram():
    message = refused(spec(model={"source": "hf://org/m", "parameters": "2T"}, parallelism={"tensorParallelDegree": 8}))
    assert message.startswith("spec.model.parameters") and "host RAM" in message and "nodes" in message


def test_an_explicit_instance_short_of_host_ram_is_warned_about():
    r = resolved(spec(model={"source": "hf://org/m", "parameters": "8B"}, instanceType="inf2.xlarge",
                      parallelism={"tensorParallelDegree": 2}))
    (warning,) = r.warnings
    assert "host RAM" in warning and "inf2.xlarge" in warning and "inf2.8xlarge" in warning
    # 405B over two trn1.32xlarge: ~940 GiB to load whole on each node, and pre-sharded weights cannot help across
    # nodes (refused): more nodes can
    big = spec(model={"source": "hf://org/m", "parameters": "405B"}, instanceType="trn1.32xlarge",
               parallelism={"tensorParallelDegree": 64, "nodes": 2}, compileCache={"url": "s3://c/p"})
    (warning,) = resolved(big).warnings
    assert "raise parallelism.nodes" in warning and "shardedWeights" not in warning
    # on one node, pre-sharded weights are the fix offered
    one = spec(model={"source": "hf://org/m", "parameters": "405B"}, instanceType="trn1.32xlarge",
               parallelism={"tensorParallelDegree": 32}, compileCache={"url": "s3://c/p"})
    assert "shardedWeights" in resolved(one).warnings[-1]


@pytest.mark.parametrize("body, field", [
    (spec(model={"source": "/var/lib/models/tiny"}, framework="torch"), "spec.model.source"),
    (spec(compileCache={"url": "/var/cache/neuron"}), "spec.compileCache.url"),
    (spec(speculation={"mode": "draft", "draftModel": {"source": "/var/lib/models/draft"}}),
     "spec.speculation.draftModel.source"),
])
def test_node_paths_need_the_operator_flag(body, field):
    message = refused(body)
    assert message.startswith(f"{field}: ") and "--allow-host-path" in message and "allowHostPath" in message
    allowed = OperatorDefaults(image="registry.example/neuronmodel-runtime:1.0", allow_host_path=True)
    assert resolved(body, allowed).image == allowed.image


def test_dra_requests_no_extended_resources_and_whole_devices():
    r = resolved(spec(instanceType="inf2.48xlarge", parallelism={"tensorParallelDegree": 2}, deviceAllocation="dra"))
    assert (r.neuron_resources, r.devices_per_pod, r.cores_per_pod) == ({}, 1, 2)
    half = resolved(spec(instanceType="trn2.48xlarge", deviceAllocation="dra"))  # 1 of a device's 4 cores
    assert (half.devices_per_pod, half.cores_per_pod) == (1, 4)


# --- EFA of multi-node groups -------------------------------------------------------------------------------------

def _efa(instance_type: str, nodes: int, tp: int, **parallelism) -> int:
    spec = {"model": {"source": "hf://org/m"}, "instanceType": instance_type,
            "parallelism": {"tensorParallelDegree": tp, "nodes": nodes, **parallelism}}
    return resolve(parse_spec(spec), OperatorDefaults()).efa_per_pod


@pytest.mark.parametrize("instance_type,tp,efa", [("trn1.32xlarge", 64, 8), ("trn1n.32xlarge", 64, 16),
                                                   ("trn2.48xlarge", 128, 16), ("trn2u.48xlarge", 128, 16)])
def test_a_multi_node_group_requests_every_efa_device_of_its_nodes(instance_type, tp, efa):
    # trn1: "trn1.32xlarge has 8 EFA devices, trn1n.32xlarge has 16" (Neuron SDK, setup-trn1-multi-node-execution)
    assert _efa(instance_type, 2, tp) == efa
    assert _efa(instance_type, 2, tp, efa=False) == 0
    assert _efa(instance_type, 1, tp // 2) == 0  # one node: no collectives between nodes


def test_efa_where_there_is_none_is_refused_naming_the_field():
    assert _efa("inf2.48xlarge", 2, 48) == 0  # unset: what the instance has, none on inf2
    with pytest.raises(api.SpecError, match=r"^spec.parallelism.efa: inf2.48xlarge has no EFA devices .*"
                                            r"trn1.32xlarge.*set parallelism.efa false"):
        _efa("inf2.48xlarge", 2, 48, efa=True)


def test_pre_sharded_weights_across_nodes_are_refused_on_neuron():
    spec = {"model": {"source": "hf://org/m"}, "instanceType": "trn1.32xlarge",
            "parallelism": {"tensorParallelDegree": 64, "nodes": 2},
            "compileCache": {"url": "s3://b/p", "shardedWeights": True}}
    with pytest.raises(api.SpecError, match=r"^spec.compileCache.shardedWeights with parallelism.nodes > 1"):
        resolve(parse_spec(spec), OperatorDefaults())
    torch_group = {**spec, "framework": "torch", "instanceType": None}
    assert resolve(parse_spec({k: v for k, v in torch_group.items() if v is not None}),
                   OperatorDefaults()).cores_per_pod == 0  # the torch runner's ranks keep their shards


def test_transformers_neuronx_across_nodes_is_refused_since_its_image_has_no_efa_userspace():
    """The TNx image's SDK 2.25 DLC never runs efa_installer.sh (the NxDI DLCs do): no libfabric EFA provider, so the
    first collective between the nodes fails at load. Refused on every family, for framework tnx and for auto on a
    TNx image (which runs its NxDI 0.5, no better off); one node and the NxDI images go through."""
    group = {"model": {"source": "hf://org/m"}, "framework": "tnx", "instanceType": "trn1.32xlarge",
             "parallelism": {"tensorParallelDegree": 64, "nodes": 2}}
    with pytest.raises(api.SpecError, match=r"^spec.parallelism.nodes: 2 nodes on the transformers-neuronx image: "
                                            r"it \(Neuron SDK 2.25\) has no EFA userspace.*use framework nxdi \(or "
                                            r"auto\)"):
        resolve(parse_spec(group), OperatorDefaults())
    tnx_image = {**group, "framework": "auto", "image": "registry.example/runtime:1.0-runtime-tnx-sdk2.25"}
    with pytest.raises(api.SpecError, match=r"no EFA userspace.*remove spec.image"):
        resolve(parse_spec(tnx_image), OperatorDefaults())
    assert resolve(parse_spec({**group, "framework": "nxdi"}), OperatorDefaults()).efa_per_pod == 8
    assert resolve(parse_spec({**group, "framework": "auto"}), OperatorDefaults()).efa_per_pod == 8
    one = {**group, "parallelism": {"tensorParallelDegree": 32}}
    assert resolve(parse_spec(one), OperatorDefaults()).cores_per_pod == 32
    rules = {r["rule"]: r["message"] for r in crdgen.spec_schema()["x-kubernetes-validations"]}
    assert rules["self.framework != 'tnx' || self.parallelism.nodes == 1"].startswith(
        "parallelism.nodes must be 1 with framework tnx")
