"""Engine vllm without a cluster: the spec field and its CEL rules, what resolve refuses and decides (the image per
family, the fetch image, the warnings, the compile key), and the pod builders' translation (args, env, volumes,
probes). vLLM's own parser reading the args back: test_vllm_args.py; the rules on a real API server:
tests/integration/test_crd_admission.py."""

from __future__ import annotations

import copy
import json

import pytest

from neuronmodel_operator import api, builders, crdgen, devices, images, resolve
from neuronmodel_operator.api import SpecError
from neuronmodel_operator.builders import pod, vllm
from neuronmodel_runtime.config.buckets import context_buckets
from operator_tests import golden

TRN2 = {"model": {"source": "pvc://models/llama"}, "engine": "vllm", "instanceType": "trn2.48xlarge",
        "parallelism": {"tensorParallelDegree": 8}}
INF2 = {**TRN2, "instanceType": "inf2.48xlarge"}
NATIVE_TAG = "0.29.0.1.2.0-neuronx-py314-sdk2.33.0-ubuntu26.04"
NXDI_TAG = "0.16.0-neuronx-py312-sdk2.31.1-ubuntu24.04"


def _spec(base: dict, **changes) -> api.NeuronModelSpec:
    spec = copy.deepcopy(base)
    spec.update(changes)
    return api.parse_spec(spec)


def _resolve(spec: api.NeuronModelSpec, defaults: resolve.OperatorDefaults = golden.DEFAULTS) -> resolve.Resolved:
    return resolve.resolve(defaults.filled(spec), defaults)


def _target(base: dict, **changes) -> builders.Target:
    body = golden._body("m", {**copy.deepcopy(base), **changes})
    return builders.target_from_body(body, golden.DEFAULTS)


def _container(target: builders.Target) -> dict:
    return builders.deployment(target)["spec"]["template"]["spec"]["containers"][0]


def _env(target: builders.Target) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in _container(target)["env"]}


def _flag(args: list[str], name: str):
    return args[args.index(name) + 1] if name in args else None


# --- the field and its rules ---------------------------------------------------------------------------------------

def test_engine_defaults_to_our_runtime_and_takes_vllm():
    assert api.parse_spec({"model": {"source": "hf://a/b"}}).engine == "neuronmodel"
    assert api.parse_spec(TRN2).engine == "vllm"
    with pytest.raises(SpecError, match="spec.engine"):
        api.parse_spec({**TRN2, "engine": "tgi"})


def test_the_crd_declares_the_engine_with_its_default_and_rules():
    spec = crdgen.spec_schema()
    assert spec["properties"]["engine"]["enum"] == ["neuronmodel", "vllm"]
    assert spec["properties"]["engine"]["default"] == "neuronmodel"
    rules = {r["rule"]: r["message"] for r in spec["x-kubernetes-validations"]}
    vllm_rules = {rule: message for rule, message in rules.items() if rule.startswith("self.engine != 'vllm'")}
    assert len(vllm_rules) == 5
    for message in vllm_rules.values():  # each names the field, says why, and how to fix it
        assert "with engine vllm" in message or "by engine vllm" in message, message
        assert "or engine neuronmodel" in message or "or use engine neuronmodel" in message, message
    compile_cache = next(m for r, m in vllm_rules.items() if "compileCache" in r)
    assert "the compile Job for the vLLM engine is not built yet" in compile_cache
    assert "compile the model at start" in compile_cache


@pytest.mark.parametrize("change, field", [
    ({"framework": "nxdi"}, "spec.framework"),
    ({"speculation": {"mode": "draft", "draftModel": {"source": "pvc://models/small"}}}, "spec.speculation.mode"),
    ({"speculation": {"mode": "promptLookup"}}, "spec.speculation.mode"),
    ({"compileCache": {"url": "s3://cache/prod"}}, "spec.compileCache"),
    ({"compileCache": {"shardedWeights": True}}, "spec.compileCache"),
    ({"parallelism": {"tensorParallelDegree": 64, "nodes": 2}, "instanceType": "trn1.32xlarge"},
     "spec.parallelism.nodes"),
    ({"instanceType": "m5.xlarge", "parallelism": {"tensorParallelDegree": 1}}, "spec.instanceType"),
])
def test_resolve_refuses_what_the_crd_refuses(change, field):
    """For a spec admitted under an older CRD (revision 3 had no engine rules)."""
    with pytest.raises(SpecError, match=field.replace(".", r"\.")) as refused:
        _resolve(_spec(TRN2, **change))
    assert "engine neuronmodel" in str(refused.value)


def test_what_the_engine_serves_of_speculation_and_sampling():
    eagle = _spec(TRN2, speculation={"mode": "eagle", "draftModel": {"source": "pvc://models/eagle3"}})
    assert _resolve(eagle).image.endswith(NATIVE_TAG)
    assert _resolve(_spec(INF2, sampling={"onDevice": False})).image.endswith(NXDI_TAG)


@pytest.mark.parametrize("base, key, field", [
    (INF2, "tp_degree", "parallelism.tensorParallelDegree"),
    (INF2, "batch_size", "batching.maxBatchSize"),
    (INF2, "on_device_sampling_config", "sampling.onDevice"),
    (INF2, "pa_num_blocks", "the operator \\(the contiguous KV layout"),
    (INF2, "save_sharded_checkpoint", "the operator"),
    (TRN2, "on_device_sampling_config", "sampling.onDevice"),
])
def test_overrides_of_what_the_flags_set_are_refused_per_line(base, key, field):
    with pytest.raises(SpecError, match=f"spec.neuronConfigOverrides: {key} is set by {field}") as refused:
        _resolve(_spec(base, neuronConfigOverrides={key: 1}))
    assert str(refused.value).endswith("remove the key; where a field is named, set that field instead")
    _resolve(_spec(base, neuronConfigOverrides={"fused_qkv": True}))  # anything else goes through


def test_the_native_line_needs_a_longest_prompt_of_at_least_the_batch():
    """vLLM refuses --max-num-batched-tokens below --max-num-seqs (vllm/config/scheduler.py)."""
    with pytest.raises(SpecError, match="maxContextLength \\(4\\) must be at least batching.maxBatchSize \\(8\\)"):
        _resolve(_spec(TRN2, batching={"maxBatchSize": 8, "maxContextLength": 4}))
    _resolve(_spec(INF2, batching={"maxBatchSize": 8, "maxContextLength": 4}))  # the NxDI line has no such flag


# --- images ------------------------------------------------------------------------------------------------------

def test_every_neuron_family_maps_to_a_line():
    for instance in devices.INSTANCE_TYPES.values():
        image = images.vllm_image_for(instance.name.split(".")[0])
        assert image is images.vllm_image_for(instance.family.name)
        assert image.line == ("native" if instance.family.name == "trn2" else "nxdi"), instance.name
    with pytest.raises(LookupError):
        images.vllm_image_for("")


def test_the_image_table_has_the_researched_tags_and_pairings():
    native, nxdi = (next(i for i in images.VLLM_IMAGES if i.line == line) for line in ("native", "nxdi"))
    assert native.ref == f"{images.VLLM_DLC}:{NATIVE_TAG}" and (native.sdk, native.vllm) == ("2.33.0", "0.29.0")
    assert nxdi.ref == f"{images.VLLM_DLC}:{NXDI_TAG}" and (nxdi.sdk, nxdi.vllm) == ("2.31.1", "0.16.0")
    assert "driver 2.29 or later" in nxdi.node and "runtime is 2.33.10" in nxdi.node
    assert {f for image in images.VLLM_IMAGES for f in image.families} == \
        {name.split(".")[0] for name in devices.INSTANCE_TYPES}


def test_spec_image_overrides_the_table_and_the_operators_runtime_image_does_not():
    defaults = resolve.OperatorDefaults(image="registry.example/neuronmodel-runtime:dev", allow_host_path=True)
    resolved = _resolve(_spec(TRN2), defaults)
    assert resolved.image.endswith(NATIVE_TAG)  # the operator's image is ours, not a vLLM image
    assert resolved.fetch_image == "registry.example/neuronmodel-runtime:dev"  # it fetches the model
    mirror = "mirror.example/vllm-neuronx:0.29"
    assert _resolve(_spec(TRN2, image=mirror), defaults).image == mirror
    assert _resolve(_spec(TRN2)).fetch_image == "ghcr.io/neuronmodel/neuronmodel-runtime:0.1.0-runtime-cpu"
    assert _resolve(_spec({**TRN2, "engine": "neuronmodel"})).fetch_image is None


def test_no_nxdi_end_of_support_warning_and_no_operator_cache_for_vllm():
    defaults = resolve.OperatorDefaults(compile_cache=api.CompileCache(url="s3://cluster-cache"),
                                        allow_host_path=True)
    resolved = _resolve(_spec(TRN2), defaults)
    assert not resolved.compile_job
    assert [w.reason for w in resolved.warnings] == ["NoCompileCacheForVllm"]
    ours = _resolve(_spec({**TRN2, "engine": "neuronmodel"}), defaults)
    assert ours.compile_job and "NxdiUnsupportedOnTrn2" in [w.reason for w in ours.warnings]


def test_the_engine_enters_the_compile_key_only_when_it_is_vllm():
    neuron = _spec({**INF2, "engine": "neuronmodel"})
    image = "some/image:1"
    assert resolve.compile_key(neuron, image, "inf2", None) == \
        resolve.compile_key(neuron.model_copy(update={"engine": "neuronmodel"}), image, "inf2", None)
    assert resolve.compile_key(_spec(INF2), image, "inf2", None) != resolve.compile_key(neuron, image, "inf2", None)


# --- the pod -------------------------------------------------------------------------------------------------------

def test_the_children_have_no_config_map_and_the_pod_mounts_none():
    t = _target(TRN2, replicas=2)
    kinds = [c["kind"] for c in builders.serving_children(t)]
    assert kinds == ["Deployment", "Service", "PodDisruptionBudget"]
    assert builders.compile_children(t) == []
    spec = builders.deployment(t)["spec"]["template"]["spec"]
    assert not any("configMap" in v for v in spec["volumes"])
    assert "/etc/neuronmodel" not in [m["mountPath"] for m in spec["containers"][0]["volumeMounts"]]


def test_the_container_runs_vllm_serve_from_its_args_in_a_writable_directory():
    t = _target(TRN2)
    container = _container(t)
    assert "command" not in container and container["args"][:3] == ["vllm", "serve", "/mnt/model/llama"]
    assert container["image"] == images.vllm_image_for("trn2").ref
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    assert container["workingDir"] in mounts and vllm.VLLM_CACHE_ROOT.startswith(pod.CACHE_DIR + "/")
    assert container["securityContext"] == pod.security_context()


def test_probes_are_on_health_with_the_in_pod_compile_budget():
    container = _container(_target(TRN2))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == pod.BUDGET_COMPILE_IN_POD_S


def test_the_environment():
    env = _env(_target(TRN2, server={"apiKeySecretRef": {"name": "keys", "key": "k"}}))
    assert env["VLLM_API_KEY"] == {"secretKeyRef": {"name": "keys", "key": "k"}}  # vllm/envs.py reads it
    assert env["NEURON_LOGICAL_NC_CONFIG"] == "2" and env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CACHE_ROOT"] == vllm.VLLM_CACHE_ROOT
    assert env["VLLM_ENGINE_READY_TIMEOUT_S"] == str(pod.BUDGET_COMPILE_IN_POD_S)
    assert "PROMETHEUS_MULTIPROC_DIR" not in env  # vLLM makes a fresh one per start under /tmp (an emptyDir)
    assert not any(name.startswith("NEURONMODEL_") for name in env)  # our runtime's, not vLLM's
    nxdi = _env(_target(INF2))
    assert nxdi["NEURON_COMPILED_ARTIFACTS"].startswith(pod.CACHE_DIR + "/")
    assert "NEURON_LOGICAL_NC_CONFIG" not in nxdi and "VLLM_API_KEY" not in nxdi


def test_downloads_run_our_runtime_image():
    t = _target(TRN2, model={"source": "s3://models/llama"})
    (fetch,) = builders.deployment(t)["spec"]["template"]["spec"]["initContainers"]
    assert fetch["image"] == t.resolved.fetch_image != t.resolved.image
    assert fetch["command"][:2] == ["neuronmodel-runtime", "fetch"]
    assert _container(t)["args"][2] == "/models/model"


def test_the_nxdi_lines_translation():
    t = _target(INF2, batching={"maxBatchSize": 4, "maxContextLength": 700, "maxSeqLen": 2048},
                model={"source": "pvc://models/llama", "dtype": "bfloat16"}, neuronConfigOverrides={"fused_qkv": True})
    args = vllm.serve_args(t)
    assert _flag(args, "--num-gpu-blocks-override") == "4" and "--no-enable-prefix-caching" in args
    assert "--block-size" not in args and "--max-num-batched-tokens" not in args
    assert _flag(args, "--dtype") == "bfloat16"
    assert context_buckets(700) == [128, 256, 700]  # our runtime's rule (NxDI's autobucketing)
    assert json.loads(_flag(args, "--additional-config")) == {
        "max_prompt_length": 700,
        "override_neuron_config": {"context_encoding_buckets": [128, 256, 700], "fused_qkv": True,
                                   "save_sharded_checkpoint": False,
                                   "on_device_sampling_config": {"dynamic": True, "deterministic": False,
                                                                 "global_topk": 256}}}
    host = vllm.additional_config(_target(INF2, sampling={"onDevice": False}))
    assert host["override_neuron_config"]["on_device_sampling_config"] is None


def test_the_native_lines_translation():
    t = _target(TRN2, batching={"maxBatchSize": 2, "maxContextLength": 512, "maxSeqLen": 1000},
                sampling={"globalTopK": 50})
    args = vllm.serve_args(t)
    assert _flag(args, "--max-num-batched-tokens") == "512" and _flag(args, "--block-size") == "32"
    assert _flag(args, "--num-gpu-blocks-override") == str(2 * 32 + 1)  # ceil(1000 / 32) each, and the null block
    assert "--no-async-scheduling" not in args and "--dtype" not in args
    assert json.loads(_flag(args, "--additional-config")) == {
        "neuron_config": {"on_device_sampling_config": {"max_top_k": 50}}}
    host = vllm.serve_args(_target(TRN2, sampling={"onDevice": False}))
    assert "--no-async-scheduling" in host  # async execution needs on-device sampling
    assert json.loads(_flag(host, "--additional-config")) == {"neuron_config": {"on_device_sampling_config": None}}


@pytest.mark.parametrize("base, method", [(TRN2, "eagle3"), (INF2, "eagle")])
def test_eagle_is_the_lines_method_with_the_drafts_local_path(base, method):
    t = _target(base, speculation={"mode": "eagle", "numSpeculativeTokens": 5,
                                   "draftModel": {"source": "hf://org/eagle-draft"}})
    args = vllm.serve_args(t)
    assert json.loads(_flag(args, "--speculative-config")) == {"method": method, "model": "/models/draft",
                                                               "num_speculative_tokens": 5}
    assert vllm.speculative_config(_target(base)) is None and "--speculative-config" not in vllm.serve_args(
        _target(base))
    if method == "eagle3":  # the draft's lookahead is in the pinned KV blocks
        assert _flag(args, "--num-gpu-blocks-override") == str(8 * 65 + 1)


def test_the_served_name_host_and_port():
    args = vllm.serve_args(_target(TRN2, server={"port": 9000}, model={"source": "pvc://m/x",
                                                                       "servedModelName": "x"}))
    assert (_flag(args, "--served-model-name"), _flag(args, "--host"), _flag(args, "--port")) == ("x", "0.0.0.0",
                                                                                                 "9000")
    assert _flag(vllm.serve_args(_target(TRN2)), "--served-model-name") == "m"  # the NeuronModel's name


def test_autoscaling_scales_on_vllms_own_queue_metric():
    t = golden.target("vllm-trn1-autoscale")
    hpa = builders.hpa(t)
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "vllm:num_requests_waiting"
    assert "replicas" not in builders.deployment(t)["spec"]


def test_the_served_record_names_the_engine_and_reads_back():
    t = _target(INF2)
    record = json.loads(builders.served_record(t))
    assert record["spec"]["engine"] == "vllm" and record["resolved"]["fetch_image"] == t.resolved.fetch_image
    assert "engine" not in json.loads(builders.served_record(golden.target("inf2-hf")))["spec"]


def test_the_readme_lists_the_images_as_the_table_has_them():
    readme = (golden.GOLDEN_DIR.parents[2] / "README.md").read_text()
    for image in images.VLLM_IMAGES:
        row = next(line for line in readme.splitlines() if f"`{image.tag}`" in line)
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[1:] == [f"`{image.tag}`", cells[2], image.vllm, image.sdk, image.node], row
        assert cells[2].lower().startswith(image.line), row
