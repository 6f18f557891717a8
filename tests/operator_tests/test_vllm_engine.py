"""Engine vllm without a cluster: the spec field and its CEL rules, what resolve refuses and decides (the image per
family, the fetch image, the warnings, the compile key), and the pod builders' translation (args, env, volumes,
probes). vLLM's own parser reading the args back: test_vllm_args.py; the rules on a real API server:
tests/integration/test_crd_admission.py."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timezone

import pytest

from neuronmodel_operator import api, builders, crdgen, devices, images, resolve, status, vllm_flags
from neuronmodel_operator.api import SpecError
from neuronmodel_operator.builders import pod, vllm
from neuronmodel_runtime.artifacts.key import artifact_key
from neuronmodel_runtime.config import keys
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
    assert len(vllm_rules) == 6
    for message in vllm_rules.values():  # each names the field, says why, and how to fix it
        assert "with engine vllm" in message or "by engine vllm" in message, message
        assert "or engine neuronmodel" in message or "or use engine neuronmodel" in message, message
    sharded = next(m for r, m in vllm_rules.items() if "compileCache" in r)
    assert sharded.startswith("compileCache.shardedWeights must be false") and "compiled graphs only" in sharded
    assert not any("has(self.compileCache.url)" in rule for rule in vllm_rules)  # a cache is welcome


@pytest.mark.parametrize("change, field", [
    ({"framework": "nxdi"}, "spec.framework"),
    ({"speculation": {"mode": "draft", "draftModel": {"source": "pvc://models/small"}}}, "spec.speculation.mode"),
    ({"speculation": {"mode": "promptLookup"}}, "spec.speculation.mode"),
    ({"compileCache": {"url": "s3://cache/prod", "shardedWeights": True}}, "spec.compileCache.shardedWeights"),
    ({"parallelism": {"tensorParallelDegree": 64, "nodes": 2}, "instanceType": "trn1.32xlarge"},
     "spec.parallelism.nodes"),
    ({"instanceType": "m5.xlarge", "parallelism": {"tensorParallelDegree": 1}}, "spec.instanceType"),
])
def test_resolve_refuses_what_the_crd_refuses(change, field):
    """For a spec admitted under an older CRD (revision 3 had no engine rules)."""
    with pytest.raises(SpecError, match=field.replace(".", r"\.")) as refused:
        _resolve(_spec(TRN2, **change))
    assert "engine neuronmodel" in str(refused.value)


def test_speculation_without_on_device_sampling_is_refused_on_both_lines():
    """vllm-neuron 0.5 reads the fused speculation's tokens only with on-device sampling (NeuronCausalLM.forward);
    the native line refuses to speculate without it. The CRD refuses it too (its rule, below)."""
    eagle = {"speculation": {"mode": "eagle", "draftModel": {"source": "pvc://models/eagle"}},
             "sampling": {"onDevice": False}}
    for base in (TRN2, INF2):
        with pytest.raises(SpecError, match=r"spec\.sampling\.onDevice must be true with engine vllm and speculation"):
            _resolve(_spec(base, **eagle))
    rule = next(r for r in crdgen.spec_schema()["x-kubernetes-validations"] if "self.sampling.onDevice" in r["rule"]
                and r["rule"].startswith("self.engine != 'vllm'"))
    assert rule["message"].startswith("sampling.onDevice must be true with engine vllm and speculation")


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
    (INF2, "is_eagle3", "speculation.draftModel.eagle3"),
])
def test_overrides_of_what_the_flags_set_are_refused_per_line(base, key, field):
    with pytest.raises(SpecError, match=f"spec.neuronConfigOverrides: {key} is set by {field}") as refused:
        _resolve(_spec(base, neuronConfigOverrides={key: 1}))
    assert str(refused.value).endswith("remove the key; where a field is named, set that field instead")
    other = "fused_qkv" if base is INF2 else "num_seqs_buckets"
    _resolve(_spec(base, neuronConfigOverrides={other: True}))  # the line's other keys go through


@pytest.mark.parametrize("key", ["fused_qkv", "enable_bucketing", "num_seq_buckets"])
def test_the_native_line_refuses_keys_its_neuron_config_drops(key):
    """vllm_neuron's NeuronConfig.from_dict reads a fixed list of keys and drops any other silently: an NxDI keyword
    or a typo would compile as if it were not there."""
    with pytest.raises(SpecError, match=f"spec.neuronConfigOverrides: {key} is not a key of vLLM Neuron's native "
                                        "NeuronConfig \\(engine vllm on trn2\\)") as refused:
        _resolve(_spec(TRN2, neuronConfigOverrides={key: True, "ep_degree": 2}))
    assert "remove it; the keys it reads are " in str(refused.value)
    assert "num_seqs_buckets" in str(refused.value) and "enable_structured_outputs" in str(refused.value)
    _resolve(_spec(INF2, neuronConfigOverrides={key: True}))  # the NxDI line's NeuronConfig takes any keyword
    _resolve(_spec(TRN2, neuronConfigOverrides={"enable_structured_outputs": True, "num_seqs_buckets": [1, 8]}))


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


def test_no_nxdi_end_of_support_warning_and_the_operators_cache_for_both_engines():
    defaults = resolve.OperatorDefaults(compile_cache=api.CompileCache(url="s3://cluster-cache"),
                                        allow_host_path=True)
    resolved = _resolve(_spec(TRN2), defaults)
    assert resolved.compile_job and resolved.warnings == ()
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


def test_the_container_runs_vllm_serve_as_its_command_in_a_writable_directory():
    """The command, never args: the DLC's ENTRYPOINT (python vllm_entrypoint.py, subprocess.check_call of its args)
    would be PID 1 without a SIGTERM handler, so vLLM would never get the kubelet's SIGTERM and never drain."""
    t = _target(TRN2)
    container = _container(t)
    assert "args" not in container and container["command"][:3] == ["vllm", "serve", "/mnt/model/llama"]
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
    assert nxdi["NEURON_COMPILE_CACHE_URL"] == pod.NEURON_COMPILE_CACHE  # libneuronxla's, NxDI's compiler


def test_the_native_line_keeps_its_graphs_and_waits_under_both_names():
    """The native compile library may cache its NEFFs under NEURON_LIBTORCH_CACHE_ROOT (default under HOME) rather
    than VLLM_CACHE_ROOT/neuron/compile_cache: both are inside the folder the store hands out; its compile timeout
    has the plugin's name and the library's."""
    env = _env(_target(TRN2))
    assert env["NEURON_LIBTORCH_CACHE_ROOT"].startswith(env["VLLM_CACHE_ROOT"] + "/")
    assert env["NEURON_LIBTORCH_CACHE_ROOT"] == f"{vllm.VLLM_CACHE_ROOT}/{vllm.NATIVE_GRAPH_FOLDERS[1]}"
    assert env["VLLM_NEURON_COMPILATION_TIMEOUT"] == env["NEURON_LIBTORCH_COMPILATION_TIMEOUT"] == str(
        pod.BUDGET_COMPILE_IN_POD_S)
    assert "NEURON_COMPILE_CACHE_URL" not in env  # libneuronxla's: unused on the native line


def test_downloads_run_our_runtime_image():
    t = _target(TRN2, model={"source": "s3://models/llama"})
    (fetch,) = builders.deployment(t)["spec"]["template"]["spec"]["initContainers"]
    assert fetch["image"] == t.resolved.fetch_image != t.resolved.image
    assert fetch["command"][:2] == ["neuronmodel-runtime", "fetch"]
    assert _container(t)["command"][2] == "/models/model"


def test_the_nxdi_lines_translation():
    t = _target(INF2, batching={"maxBatchSize": 4, "maxContextLength": 700, "maxSeqLen": 2048},
                model={"source": "pvc://models/llama", "dtype": "bfloat16"}, neuronConfigOverrides={"fused_qkv": True})
    args = vllm.serve_command(t)
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
    host = vllm_flags.additional_config(_spec(INF2, sampling={"onDevice": False}), "nxdi")
    assert host["override_neuron_config"]["on_device_sampling_config"] is None


def test_the_native_lines_translation():
    t = _target(TRN2, batching={"maxBatchSize": 2, "maxContextLength": 512, "maxSeqLen": 1000},
                sampling={"globalTopK": 50})
    args = vllm.serve_command(t)
    assert _flag(args, "--max-num-batched-tokens") == "512" and _flag(args, "--block-size") == "32"
    assert _flag(args, "--num-gpu-blocks-override") == str(2 * 32 + 1)  # ceil(1000 / 32) each, and the null block
    assert "--no-async-scheduling" not in args and "--dtype" not in args
    assert json.loads(_flag(args, "--additional-config")) == {
        "neuron_config": {"on_device_sampling_config": {"max_top_k": 50}}}
    host = vllm.serve_command(_target(TRN2, sampling={"onDevice": False}))
    assert "--no-async-scheduling" in host  # async execution needs on-device sampling
    assert json.loads(_flag(host, "--additional-config")) == {"neuron_config": {"on_device_sampling_config": None}}



def test_the_native_line_drains_in_flight_requests_on_sigterm_and_the_nxdi_line_cannot():
    """vLLM aborts its in-flight requests on SIGTERM unless --shutdown-timeout is above 0 (0.29's arg_utils: "0 =
    abort, >0 = wait"); the native line waits as long as our runtime drains, inside the pod's grace period. vLLM 0.16
    (the NxDI line) has no such flag: its parser would refuse it (test_vllm_args runs both parsers)."""
    native = vllm.serve_command(_target(TRN2))
    assert int(_flag(native, "--shutdown-timeout")) == pod.DRAIN_TIMEOUT_S < pod.TERMINATION_GRACE_S
    assert "--shutdown-timeout" not in vllm.serve_command(_target(INF2))
    assert "--shutdown-timeout" not in vllm_flags.shape_args(_spec(TRN2), "native")  # not in the compile key

@pytest.mark.parametrize("base, method", [(TRN2, "eagle3"), (INF2, "eagle")])
def test_eagle_is_the_lines_method_with_the_drafts_local_path(base, method):
    t = _target(base, speculation={"mode": "eagle", "numSpeculativeTokens": 5,
                                   "draftModel": {"source": "hf://org/eagle-draft"}})
    args = vllm.serve_command(t)
    assert json.loads(_flag(args, "--speculative-config")) == {"method": method, "model": "/models/draft",
                                                               "num_speculative_tokens": 5}
    assert vllm.speculative_config(_target(base)) is None and "--speculative-config" not in vllm.serve_command(
        _target(base))
    if method == "eagle3":  # the draft's lookahead is in the pinned KV blocks
        assert _flag(args, "--num-gpu-blocks-override") == str(8 * 65 + 1)


def test_an_eagle3_draft_on_the_nxdi_line_is_compiled_as_eagle3():
    """vllm-neuron 0.5.0 never sets NxDI's is_eagle3 (default False): the operator does, for a draft the spec says is
    EAGLE3, or NxDI builds the EAGLE-1 draft graph (hidden_size * 2 inputs instead of * 3)."""
    def neuron_config(base: dict, eagle3) -> dict:
        draft = {"source": "hf://org/eagle-draft", **({} if eagle3 is None else {"eagle3": eagle3})}
        args = vllm.serve_command(_target(base, speculation={"mode": "eagle", "draftModel": draft}))
        return json.loads(_flag(args, "--additional-config"))
    assert neuron_config(INF2, True)["override_neuron_config"]["is_eagle3"] is True
    assert "is_eagle3" not in neuron_config(INF2, None)["override_neuron_config"]  # an EAGLE (v1) draft
    assert "is_eagle3" not in neuron_config(INF2, False)["override_neuron_config"]
    assert "is_eagle3" not in json.dumps(neuron_config(TRN2, True))  # the native line's method eagle3 says it
    # not without speculation, whatever the draft says
    assert "is_eagle3" not in vllm_flags.additional_config(_spec(INF2), "nxdi")["override_neuron_config"]
    eagle = {"mode": "eagle", "draftModel": {"source": "hf://org/eagle-draft"}}
    eagle3 = {"mode": "eagle", "draftModel": {"source": "hf://org/eagle-draft", "eagle3": True}}
    assert _resolve(_spec(INF2, speculation=eagle)).compile_key != _resolve(_spec(INF2, speculation=eagle3)).compile_key
    rules = {r["rule"]: r["message"] for r in crdgen.spec_schema()["x-kubernetes-validations"]}
    assert rules["!has(self.speculation.draftModel) || !has(self.speculation.draftModel.eagle3) || "
                 "self.speculation.mode == 'eagle'"].startswith("speculation.draftModel.eagle3 applies to "
                                                                "speculation.mode eagle")


def test_the_served_name_host_and_port():
    args = vllm.serve_command(_target(TRN2, server={"port": 9000}, model={"source": "pvc://m/x",
                                                                       "servedModelName": "x"}))
    assert (_flag(args, "--served-model-name"), _flag(args, "--host"), _flag(args, "--port")) == ("x", "0.0.0.0",
                                                                                                 "9000")
    assert _flag(vllm.serve_command(_target(TRN2)), "--served-model-name") == "m"  # the NeuronModel's name


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


# --- the compile cache: key, Job, fail-fast pods ---------------------------------------------------------------------

CACHED = {**TRN2, "compileCache": {"url": "pvc://neuron-cache/vllm"}}


def _key(base: dict, **changes) -> str:
    return _target(base, **changes).resolved.compile_key


def _inits(template: dict) -> dict:
    return {c["name"]: c for c in template["spec"].get("initContainers", [])}


def test_the_compile_key_is_the_digest_of_what_the_pods_compile_with():
    t = _target(CACHED)
    inputs = vllm.key_inputs(t)
    assert t.resolved.compile_key == keys.digest(inputs)
    assert inputs["flags"] == vllm_flags.shape_args(t.spec, "native")  # the flags as the pods get them
    assert inputs["flags"] == vllm.serve_command(t)[11:]  # after the path, name, host, port and shutdown timeout
    assert (inputs["vllm"], inputs["plugin"], inputs["sdk"], inputs["target"], inputs["logicalCoreConfig"]) == \
        ("0.29.0", "0.29.0.1.2.0", "2.33.0", "trn2", 2)
    template = builders.deployment(t)["spec"]["template"]
    fetch = _inits(template)["fetch-artifacts"]
    handed = next(e["value"] for e in fetch["env"] if e["name"] == "NEURONMODEL_ARTIFACT_KEY_INPUTS")
    assert artifact_key(json.loads(handed)).digest == t.resolved.compile_key  # the runtime names the same entry
    assert template["metadata"]["annotations"]["neuronmodel.dev/compile-key"] == t.resolved.compile_key


@pytest.mark.parametrize("change", [
    {"parallelism": {"tensorParallelDegree": 16}},
    {"parallelism": {"tensorParallelDegree": 8, "logicalCoreConfig": 1}},
    {"batching": {"maxBatchSize": 4}},
    {"batching": {"maxSeqLen": 4096}},
    {"batching": {"maxContextLength": 512}},
    {"sampling": {"globalTopK": 64}},
    {"sampling": {"onDevice": False}},
    {"speculation": {"mode": "eagle", "draftModel": {"source": "pvc://models/eagle3"}}},
    {"speculation": {"mode": "eagle", "numSpeculativeTokens": 2, "draftModel": {"source": "pvc://models/eagle3"}}},
    {"model": {"source": "pvc://models/llama", "dtype": "bfloat16"}},
    {"model": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct", "revision": "0e9e39f249a16976918f6564b8830bc894c89659"}},
    {"image": "mirror.example/vllm-neuronx:0.29"},
    {"neuronConfigOverrides": {"num_seqs_buckets": [1, 4]}},
])
def test_whatever_changes_the_compiled_shape_changes_the_key(change):
    assert _key(CACHED, **change) != _key(CACHED)


@pytest.mark.parametrize("change", [
    {"replicas": 3}, {"server": {"port": 9000}}, {"model": {"source": "pvc://models/llama", "servedModelName": "x"}},
    {"resources": {"requests": {"memory": "300Gi"}}}, {"compileCache": {"url": "s3://other", "policy": "Always"}},
    {"server": {"apiKeySecretRef": {"name": "keys"}}}, {"instanceType": "trn2.48xlarge", "nodeSelector": {"a": "b"}},
])
def test_what_does_not_change_the_compiled_shape_keeps_the_key(change):
    assert _key(CACHED, **change) == _key(CACHED)


def test_one_chip_or_sixteen_compile_the_same_trn2_graphs_at_one_tp():
    assert _key(CACHED, instanceType="trn2.3xlarge", parallelism={"tensorParallelDegree": 4}) == \
        _key(CACHED, parallelism={"tensorParallelDegree": 4})
    assert _key(INF2, compileCache={"url": "pvc://c"}) != _key(CACHED)  # another line, target and image


def test_serving_pods_fetch_the_entry_and_never_compile():
    t = _target(CACHED, compileCache={"url": "pvc://neuron-cache/vllm", "policy": "Never"})
    assert builders.compile_children(t) == []  # policy Never: no Job
    template = builders.deployment(t)["spec"]["template"]
    fetch = list(_inits(template).values())[-1]  # after the downloads, before vLLM starts
    assert fetch["name"] == "fetch-artifacts" and fetch["image"] == t.resolved.fetch_image
    assert fetch["command"] == ["neuronmodel-runtime", "artifacts", "fetch", vllm.VLLM_CACHE_ROOT, "--store",
                                "/mnt/compile-cache/vllm", "--required"]
    assert {m["name"] for m in fetch["volumeMounts"]} == {"cache", "tmp", "compile-cache"}
    assert fetch["securityContext"] == pod.security_context()
    container = template["spec"]["containers"][0]
    assert _env(t)["VLLM_NEURON_DISABLE_WARMUP_COMPILE"] == "1"  # a graph missing from the entry is an error
    assert "compile-cache" not in {m["name"] for m in container["volumeMounts"]}  # vLLM never touches the store
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == pod.BUDGET_CACHED_S
    nxdi = _target(INF2, compileCache={"url": "s3://cache/vllm", "policy": "Never"})
    fetch = _inits(builders.deployment(nxdi)["spec"]["template"])["fetch-artifacts"]
    assert fetch["command"][3:6] == [vllm.NXDI_ARTIFACTS, "--store", "s3://cache/vllm"]  # s3://: no volume
    assert _env(nxdi)["NEURON_COMPILED_ARTIFACTS"] == vllm.NXDI_ARTIFACTS
    assert "VLLM_NEURON_DISABLE_WARMUP_COMPILE" not in _env(nxdi)  # the NxDI line has no such switch
    assert "VLLM_NEURON_DISABLE_WARMUP_COMPILE" not in _env(_target(TRN2))  # no cache: it compiles at start


@pytest.mark.parametrize("policy", ["IfNotCached", "Always"])
def test_the_compile_jobs_vllm_is_a_container_whose_exit_fails_the_pod(policy):
    """Never a restartable sidecar (an init container with restartPolicy Always): the kubelet restarts those whatever
    the pod's restartPolicy, so a vLLM that always fails would crash-loop until the Job's deadline, uncounted."""
    t = _target(CACHED, compileCache={"url": "pvc://neuron-cache/vllm", "policy": policy})
    (job,) = builders.compile_children(t)  # no ConfigMap: vLLM reads none
    assert job["kind"] == "Job" and job["metadata"]["annotations"]["neuronmodel.dev/compile-key"] == \
        t.resolved.compile_key
    spec = job["spec"]["template"]["spec"]
    inits = _inits(job["spec"]["template"])
    assert not [c["name"] for c in spec["initContainers"] + spec["containers"] if "restartPolicy" in c]
    assert spec["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 4
    engine, store = spec["containers"]
    assert engine["name"] == "runtime" and engine["image"] == t.resolved.image
    # exactly the serving pods' vllm serve, under the supervisor that the init container before it installs
    assert engine["command"] == ["python", vllm.SUPERVISOR, vllm.HANDOFF_DIR, "--", *vllm.serve_command(t)]
    assert list(inits)[-1] == "install-supervisor" and inits["install-supervisor"]["command"] == [
        "neuronmodel-runtime", "artifacts", "supervisor", vllm.SUPERVISOR]
    assert vllm.HANDOFF_DIR.startswith("/tmp/")  # the tmp emptyDir, which all three mount
    for container in (engine, store, inits["install-supervisor"]):
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert engine["terminationMessagePolicy"] == "FallbackToLogsOnError"  # vLLM's last lines say why it exited
    assert "startupProbe" not in engine and "ports" not in engine
    env = {e["name"]: e.get("value") for e in engine["env"]}
    assert "VLLM_NEURON_DISABLE_WARMUP_COMPILE" not in env and env["VLLM_ENGINE_READY_TIMEOUT_S"] == str(
        pod.BUDGET_COMPILE_IN_POD_S)
    assert ("fetch-artifacts" in inits) == (policy == "IfNotCached")  # a hit starts it warm; Always recompiles
    if policy == "IfNotCached":
        assert "--required" not in inits["fetch-artifacts"]["command"]
    assert store["name"] == "store-artifacts" and store["command"] == [
        "neuronmodel-runtime", "artifacts", "store", vllm.VLLM_CACHE_ROOT, "--store", "/mnt/compile-cache/vllm",
        "--policy", policy, "--ready-url", "http://127.0.0.1:8000/health", "--engine-dir", vllm.HANDOFF_DIR,
        "--neff-in", "neuron/compile_cache", "--neff-in", "neuron-libtorch"]
    assert engine["resources"] == _container(t)["resources"]  # the NeuronCores are vLLM's
    nxdi = _target(INF2, compileCache={"url": "pvc://neuron-cache/vllm"})
    (job,) = builders.compile_children(nxdi)
    assert "--neff-in" not in job["spec"]["template"]["spec"]["containers"][1]["command"]  # NxDI: another layout


def test_a_serving_pod_whose_entry_is_missing_fails_with_the_key():
    key = "ab" * 32
    message = (f"neuronmodel-runtime: {keys.ARTIFACTS_MISSING}: no compiled artifacts for key {key} in "
               "/mnt/compile-cache/vllm, and a serving pod never compiles: ...")
    pod_status = {"metadata": {"name": "m-1"}, "status": {
        "phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}],
        "initContainerStatuses": [{"name": "fetch-artifacts", "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                   "lastState": {"terminated": {"exitCode": 2, "message": message}}}]}}
    t = _target(CACHED, compileCache={"url": "pvc://neuron-cache/vllm", "policy": "Never"})
    workload = {"kind": "Deployment", "metadata": {"generation": 1}, "spec": {"replicas": 1},
                "status": {"observedGeneration": 1, "replicas": 1}}
    now = datetime(2026, 12, 3, tzinfo=timezone.utc)
    observed = status.Observed(generation=1, created=now, previous={}, resolved=t.resolved, spec_error=None,
                               desired_replicas=1, workload=workload, compile_job=None, compile_required=False,
                               rollout_held=False, pods=[pod_status], endpoint="http://m:8000", selector="a=b",
                               now=now, compile_cache_url="pvc://neuron-cache/vllm")
    current = status.status(observed)
    ready = next(c for c in current["conditions"] if c["type"] == "Ready")
    assert (current["phase"], ready["reason"]) == ("Failed", "ArtifactsMissing") and key in ready["message"]
    assert ("Warning", "ArtifactsMissing") in {(kind, reason) for kind, reason, _ in status.events({}, current)}


def test_the_jobs_vllm_and_the_serving_pods_have_one_environment_but_the_no_compile_switch():
    """vLLM's compile cache hashes its known variables into its keys (vllm/envs.py compile_factors: every one but an
    ignore list, and VLLM_ENGINE_READY_TIMEOUT_S is hashed): a Job that compiled under other values would leave the
    replicas a cache they miss."""
    t = _target(CACHED)
    (job,) = builders.compile_children(t)
    compiling = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    serving = {e["name"]: e.get("value") for e in _container(t)["env"]}
    assert serving.pop("VLLM_NEURON_DISABLE_WARMUP_COMPILE") == "1"  # the plugin's variable, not vLLM's
    assert compiling == serving
