"""The NeuronModel CRD on a real API server: it installs, the samples are accepted, defaults are filled in, the
columns, `kubectl explain` and the scale subresource work, and a broad set of invalid specs is refused at admission
with a message that says how to fix it (the assertions are on the message the user sees).

No operator runs here: these are the API server's own checks of crds/neuronmodels.neuronmodel.dev.yaml.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from kubernetes import client as kube

from neuronmodel_operator import api

pytestmark = pytest.mark.slow  # the session's control plane takes ~10 s to start

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / f"{api.CRD_NAME}.yaml"
SAMPLES = sorted((ROOT / "crds" / "samples").glob("*.yaml"))
TINY = ROOT / "tests" / "assets" / "tiny" / "target"
DELETE = object()  # in an override: remove the key

CPU = {"model": {"source": "/models/tiny"}, "framework": "torch", "replicas": 1}
INF2 = {"model": {"source": "hf://org/model"}, "instanceType": "inf2.48xlarge",
        "parallelism": {"tensorParallelDegree": 8}, "replicas": 1}
TRN1 = {"model": {"source": "hf://org/model"}, "instanceType": "trn1.32xlarge",
        "parallelism": {"tensorParallelDegree": 32}, "replicas": 1}
TRN2 = {"model": {"source": "hf://org/model"}, "instanceType": "trn2.48xlarge",
        "parallelism": {"tensorParallelDegree": 64}, "replicas": 1}

AT_MOST_ONE = "set at most one of spec.replicas (a fixed count) or spec.autoscaling"
NEEDS_DRAFT = "speculation.draftModel is required by mode draft and eagle"
SOURCE = "model.source must be hf://org/name, s3://bucket/prefix, pvc://claim/path or an absolute path"
INF2_TP = "on inf2 tensorParallelDegree / nodes (NeuronCores per node) must be one of [1, 2, 4, 8, 24]"
TRN1_TP = "on trn1 tensorParallelDegree / nodes (NeuronCores per node) must be one of [1, 2, 8, 16, 32]"
TRN2_LNC2_TP = "on trn2 at logicalCoreConfig 2 tensorParallelDegree / nodes (NeuronCores per node) must be one of"
TOO_MANY_CORES = "at most the instance type's NeuronCores"
TOP_K = ("sampling.globalTopK must be 256 or less with sampling.onDevice true: Neuron's on-device sampler takes a "
         "global top-k of at most 256; set sampling.globalTopK to 256 or less, or sampling.onDevice false")
TORCH_OVERRIDES = "framework torch (the reference runner) has no NeuronConfig: remove spec.neuronConfigOverrides"
VLLM = {"engine": "vllm"}
VLLM_FRAMEWORK = "framework must be auto with engine vllm"
VLLM_SPECULATION = ("speculation.mode draft and promptLookup are not served by engine vllm: vLLM Neuron speculates "
                    "with EAGLE drafts only")
VLLM_SHARDED = ("compileCache.shardedWeights must be false with engine vllm: vLLM Neuron loads the weights from the "
                "checkpoint and stores compiled graphs only; remove shardedWeights, or use engine neuronmodel")
VLLM_NODES = "parallelism.nodes must be 1 with engine vllm"
VLLM_HOST_SAMPLING = "sampling.onDevice must be true with engine vllm and speculation"
NOTHING_REPLACED = "rollout.maxUnavailable and rollout.maxSurge must not both be 0"
DRA_ON_KARPENTER = "deviceAllocation dra is not supported on Karpenter or EKS Auto Mode nodes"


def _merge(base: dict, override: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if value is DELETE:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _body(name: str, spec: dict) -> dict:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name}, "spec": spec}


@pytest.fixture(scope="module")
def crd(control_plane, install_crds):
    install_crds(CRD_FILE)
    return control_plane


@pytest.fixture(scope="module")
def shared_namespace(crd, admin_client):
    """One namespace for the (many) cases that must create nothing."""
    core = kube.CoreV1Api(admin_client)
    core.create_namespace({"metadata": {"name": "crd-admission"}})
    yield "crd-admission"
    core.delete_namespace("crd-admission")


def apply(plane, namespace: str, body: dict, server_side: bool = True):
    """`kubectl apply --server-side` (or plain client-side `kubectl apply`) of one object; never raises."""
    flags = ("--server-side", "--field-manager=neuronmodel-tests") if server_side else ()
    return plane.kubectl("apply", *flags, "-n", namespace, "-f", "-", stdin=json.dumps(body), check=False)


def get(plane, namespace: str, name: str) -> dict:
    return json.loads(plane.kubectl("get", "nm", name, "-n", namespace, "-o", "json").stdout)


def patch_status(plane, namespace: str, name: str, status: dict) -> None:
    plane.kubectl("patch", "nm", name, "-n", namespace, "--subresource=status", "--type=merge",
                  "-p", json.dumps({"status": status}))


def _sample(path: Path) -> dict:
    body = yaml.safe_load(path.read_text())
    if body["spec"]["model"]["source"] == "/var/lib/neuronmodel/models/tiny":
        body["spec"]["model"]["source"] = str(TINY)  # the tiny model as the tests have it
    return body


# --- installed, samples, defaults -----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_every_sample_is_accepted_and_comes_back_as_written(crd, namespace, path):
    body = _sample(path)
    applied = apply(crd, namespace, body)
    assert applied.returncode == 0, applied.stderr
    stored = get(crd, namespace, body["metadata"]["name"])
    # What the API server stored (its defaults filled in) is what the operator's parser makes of the sample.
    assert api.parse_spec(stored["spec"]) == api.parse_spec(body["spec"])


def test_the_api_server_applies_the_defaults(crd, namespace):
    assert apply(crd, namespace, _body("defaults", {"model": {"source": "hf://org/model"}, "replicas": 1})
                 ).returncode == 0
    spec = get(crd, namespace, "defaults")["spec"]
    assert spec["framework"] == "auto"
    assert spec["engine"] == "neuronmodel"
    assert spec["parallelism"] == {"tensorParallelDegree": 1, "nodes": 1}
    assert spec["batching"] == {"maxBatchSize": 8, "maxContextLength": 1024, "maxSeqLen": 2048}
    assert spec["sampling"] == {"onDevice": True, "globalTopK": 256}
    assert spec["speculation"] == {"mode": "none", "numSpeculativeTokens": 4, "promptLookupMin": 2,
                                   "promptLookupMax": 4}
    assert spec["compileCache"] == {"policy": "IfNotCached", "shardedWeights": False}
    assert spec["rollout"] == {}  # unset: by parallelism.nodes (placement.rollout), so no default is written
    assert spec["server"] == {"port": 8000}
    assert spec["model"] == {"source": "hf://org/model", "dtype": "auto"}
    assert spec["neuronResource"] == "neuroncore"
    assert "autoscaling" not in spec and "instanceType" not in spec
    assert "neuronConfigOverrides" not in spec  # no default: has() in the CEL rules means the user wrote it
    # A block given in part gets the rest of its defaults.
    assert apply(crd, namespace, _body("partial", {**CPU, "batching": {"maxSeqLen": 4096},
                                                   "model": {"source": "/m", "tokenSecretRef": {"name": "s"}}})
                 ).returncode == 0
    partial = get(crd, namespace, "partial")["spec"]
    assert partial["batching"] == {"maxBatchSize": 8, "maxContextLength": 1024, "maxSeqLen": 4096}
    assert partial["model"]["tokenSecretRef"] == {"name": "s", "key": "token"}


def test_neuron_config_overrides_come_back_as_written(crd, namespace):
    """Any JSON values, nested ones too, kept (not pruned) and parsed by the operator as they were written."""
    overrides = {"fused_qkv": True, "cc_pipeline_tiling_factor": 2, "context_encoding_buckets": [128, 512],
                 "on_device_sampling_config": {"deterministic": True, "global_topk": 64}, "lora_ckpt_json": None}
    body = _body("overrides", _merge(TRN1, {"neuronConfigOverrides": overrides}))
    applied = apply(crd, namespace, body)
    assert applied.returncode == 0, applied.stderr
    stored = get(crd, namespace, "overrides")["spec"]
    assert stored["neuronConfigOverrides"] == overrides
    assert api.parse_spec(stored).neuron_config_overrides == overrides


def test_kubectl_get_shows_the_columns(crd, namespace):
    assert apply(crd, namespace, _body("tiny", _merge(CPU, {"parallelism": {"tensorParallelDegree": 2}}))
                 ).returncode == 0
    patch_status(crd, namespace, "tiny", {
        "phase": "Ready", "resolved": {"framework": "torch"}, "ready": "1/1", "replicas": 1, "readyReplicas": 1,
        "endpoint": f"http://tiny.{namespace}.svc:8000/v1"})
    header, row = crd.kubectl("get", "nm", "-n", namespace).stdout.splitlines()
    assert header.split() == ["NAME", "PHASE", "ENGINE", "FRAMEWORK", "TP", "READY", "ENDPOINT", "AGE"]
    assert row.split()[:7] == ["tiny", "Ready", "neuronmodel", "torch", "2", "1/1",
                               f"http://tiny.{namespace}.svc:8000/v1"]
    # The status subresource is the only way to write status: a status in a spec apply is ignored.
    assert apply(crd, namespace, {**_body("tiny", CPU), "status": {"phase": "Failed"}}).returncode == 0
    assert get(crd, namespace, "tiny")["status"]["phase"] == "Ready"
    # The category and the full names work too.
    assert "tiny" in crd.kubectl("get", "neuronmodel", "-n", namespace, "-o", "name").stdout
    assert "tiny" in crd.kubectl("get", "neuronmodels.neuronmodel.dev", "-n", namespace, "-o", "name").stdout


def test_kubectl_explain_prints_the_descriptions(crd, wait_until):
    # The CRD reaches the OpenAPI document kubectl explain reads a moment after it is Established.
    explained = wait_until("kubectl explain to know NeuronModel", lambda: (out := crd.kubectl(
        "explain", "neuronmodel.spec.parallelism.tensorParallelDegree", check=False)).returncode == 0 and out)
    assert "NeuronCores the model is sharded over" in explained.stdout
    assert "<integer>" in explained.stdout
    spec = crd.kubectl("explain", "nm.spec").stdout
    for field in ("model", "framework", "parallelism", "batching", "speculation", "compileCache", "replicas",
                  "autoscaling", "instanceType"):
        assert f"{field}\t" in spec or f"{field} " in spec, field
    assert "exclusive with autoscaling" in crd.kubectl("explain", "nm.spec.replicas").stdout


def test_kubectl_scale_and_the_scale_subresource(crd, namespace, admin_client):
    assert apply(crd, namespace, _body("scaled", CPU)).returncode == 0
    crd.kubectl("scale", "nm", "scaled", "-n", namespace, "--replicas=3")
    assert get(crd, namespace, "scaled")["spec"]["replicas"] == 3
    selector = f"{api.LABEL_NAME}=scaled,{api.LABEL_COMPONENT}=server"
    # Three serving pods exist, one of them ready: an HPA must see 3, not 1, or it over-scales.
    patch_status(crd, namespace, "scaled", {"replicas": 3, "readyReplicas": 1, "ready": "1/3", "selector": selector})
    scale = kube.CustomObjectsApi(admin_client).get_namespaced_custom_object_scale(
        api.GROUP, api.VERSION, namespace, api.PLURAL, "scaled")
    assert scale["spec"]["replicas"] == 3
    assert scale["status"]["replicas"] == 3
    assert scale["status"]["selector"] == selector
    # Writing the scale subresource (what an HPA or `kubectl scale` does) changes spec.replicas.
    kube.CustomObjectsApi(admin_client).patch_namespaced_custom_object_scale(
        api.GROUP, api.VERSION, namespace, api.PLURAL, "scaled", {"spec": {"replicas": 2}})
    assert get(crd, namespace, "scaled")["spec"]["replicas"] == 2


# --- accepted: one valid spec per family and feature, so the rules do not simply refuse everything ---------------

ACCEPTED = {
    "torch-any-node": CPU,
    "torch-m5": {**CPU, "instanceType": "m5.xlarge"},
    "auto-no-instance": {"model": {"source": "s3://my-bucket/llama"}, "replicas": 0},
    "inf2-xlarge-tp2": _merge(INF2, {"instanceType": "inf2.xlarge", "parallelism": {"tensorParallelDegree": 2}}),
    "inf2-48xlarge-tp24": _merge(INF2, {"parallelism": {"tensorParallelDegree": 24}}),
    "inf2-tnx": _merge(INF2, {"framework": "tnx"}),
    "trn1-tp32": TRN1,
    "trn1-2xlarge-tp2": _merge(TRN1, {"instanceType": "trn1.2xlarge", "parallelism": {"tensorParallelDegree": 2}}),
    "trn1n-tp16": _merge(TRN1, {"instanceType": "trn1n.32xlarge", "parallelism": {"tensorParallelDegree": 16}}),
    "trn1-two-nodes": _merge(TRN1, {"parallelism": {"tensorParallelDegree": 64, "nodes": 2}}),
    "trn1-two-nodes-efa-own-topology": _merge(TRN1, {"parallelism": {
        "tensorParallelDegree": 64, "nodes": 2, "efa": True, "groupTopologyKey": "karpenter.sh/nodepool"}}),
    "inf2-two-nodes-no-efa-no-topology": _merge(INF2, {"parallelism": {
        "tensorParallelDegree": 48, "nodes": 2, "efa": False, "groupTopologyKey": ""}}),
    "trn2-tp64": TRN2,
    "trn2-lnc1-tp128": _merge(TRN2, {"parallelism": {"tensorParallelDegree": 128, "logicalCoreConfig": 1}}),
    "trn2-3xlarge-tp4": _merge(TRN2, {"instanceType": "trn2.3xlarge", "parallelism": {"tensorParallelDegree": 4}}),
    "draft": _merge(INF2, {"speculation": {"mode": "draft", "draftModel": {"source": "hf://org/small"}}}),
    "eagle": _merge(TRN2, {"speculation": {"mode": "eagle", "draftModel": {"source": "pvc://models/eagle"}}}),
    "prompt-lookup": _merge(INF2, {"speculation": {"mode": "promptLookup", "promptLookupMin": 3,
                                                   "promptLookupMax": 3}}),
    "autoscaling": _merge(TRN2, {"replicas": DELETE, "autoscaling": {"minReplicas": 2, "maxReplicas": 2}}),
    "caches": _merge(TRN1, {"compileCache": {"url": "/var/cache/neuron", "policy": "Never"}}),
    "int-or-string": _merge(CPU, {"rollout": {"maxUnavailable": "25%", "maxSurge": 0},
                                  "resources": {"requests": {"cpu": 2, "memory": "4Gi"}}}),
    "top-k-256-on-device": _merge(INF2, {"sampling": {"globalTopK": 256}}),
    "top-k-1000-on-the-host": _merge(INF2, {"sampling": {"onDevice": False, "globalTopK": 1000}}),
    "top-k-1000-torch": _merge(CPU, {"sampling": {"globalTopK": 1000}}),
    "neuron-config-overrides": _merge(TRN1, {"neuronConfigOverrides": {f"key_{i}": i for i in range(64)}}),
    "vllm-trn2-eagle": _merge(TRN2, {**VLLM, "parallelism": {"tensorParallelDegree": 8}, "speculation": {
        "mode": "eagle", "draftModel": {"source": "hf://org/eagle3"}}}),
    "vllm-inf2-host-sampling": _merge(INF2, {**VLLM, "sampling": {"onDevice": False, "globalTopK": 1000},
                                             "neuronConfigOverrides": {"fused_qkv": True}}),
    "vllm-autoscaling": _merge(TRN1, {**VLLM, "replicas": DELETE, "autoscaling": {"minReplicas": 1,
                                                                                  "maxReplicas": 3}}),
    "vllm-no-instance": {"model": {"source": "s3://my-bucket/llama"}, "engine": "vllm", "replicas": 1},
    "vllm-compile-cache": _merge(TRN1, {**VLLM, "compileCache": {"url": "s3://cache/prod", "policy": "Always"}}),
    "vllm-compile-cache-never": _merge(TRN2, {**VLLM, "compileCache": {"url": "pvc://cache/vllm", "policy": "Never"}}),
    "vllm-inf2-eagle3": _merge(INF2, {**VLLM, "speculation": {"mode": "eagle", "draftModel": {
        "source": "hf://org/eagle3", "eagle3": True}}}),
    # unset fields of a group default to 1 / 0 (placement.rollout): either one alone may be 0
    "group-in-place": _merge(TRN1, {"parallelism": {"tensorParallelDegree": 64, "nodes": 2},
                                    "rollout": {"maxSurge": 0}}),
    "group-surge": _merge(TRN1, {"parallelism": {"tensorParallelDegree": 64, "nodes": 2},
                                 "rollout": {"maxUnavailable": 0, "maxSurge": 1}}),
    "one-node-in-place": _merge(CPU, {"rollout": {"maxUnavailable": 1}}),
    "dra-on-a-node-group": _merge(TRN1, {"deviceAllocation": "dra",
                                         "nodeSelector": {"eks.amazonaws.com/compute-type": "ec2"}}),
}


@pytest.mark.parametrize("case", ACCEPTED)
def test_valid_specs_are_accepted(crd, shared_namespace, case):
    applied = apply(crd, shared_namespace, _body(f"ok-{case}", ACCEPTED[case]))
    assert applied.returncode == 0, applied.stderr


def test_a_name_of_exactly_the_limit_is_accepted(crd, namespace):
    name = "n" * api.MAX_NAME_LENGTH
    applied = apply(crd, namespace, _body(name, CPU))
    assert applied.returncode == 0, applied.stderr


# --- the invalid set -------------------------------------------------------------------------------------------------

REJECTED = [
    # (id, spec, what the user must read)
    ("replicas-and-autoscaling", _merge(CPU, {"autoscaling": {"maxReplicas": 2}}), AT_MOST_ONE),
    ("draft-without-draft-model", _merge(INF2, {"speculation": {"mode": "draft"}}), NEEDS_DRAFT),
    ("eagle-without-draft-model", _merge(TRN2, {"speculation": {"mode": "eagle"}}), NEEDS_DRAFT),
    ("prompt-lookup-with-draft-model", _merge(INF2, {"speculation": {
        "mode": "promptLookup", "draftModel": {"source": "hf://org/small"}}}),
     "must be absent for none and promptLookup"),
    ("none-with-draft-model", _merge(INF2, {"speculation": {"draftModel": {"source": "hf://org/small"}}}),
     "must be absent for none and promptLookup"),
    ("prompt-lookup-min-above-max", _merge(INF2, {"speculation": {
        "mode": "promptLookup", "promptLookupMin": 5, "promptLookupMax": 3}}),
     "speculation.promptLookupMin must be <= speculation.promptLookupMax"),
    ("too-many-speculative-tokens", _merge(INF2, {"speculation": {"mode": "promptLookup",
                                                                  "numSpeculativeTokens": 17}}),
     "spec.speculation.numSpeculativeTokens: Invalid value: 17: spec.speculation.numSpeculativeTokens in body "
     "should be less than or equal to 16"),
    ("nodes-not-dividing-tp", _merge(TRN1, {"parallelism": {"tensorParallelDegree": 32, "nodes": 3}}),
     "parallelism.nodes must divide parallelism.tensorParallelDegree"),
    ("zero-nodes", _merge(TRN1, {"parallelism": {"nodes": 0}}), "spec.parallelism.nodes in body should be greater "
     "than or equal to 1"),
    ("efa-on-one-node", _merge(TRN1, {"parallelism": {"efa": True}}), "parallelism.efa applies to nodes > 1"),
    ("efa-on-inf2", _merge(INF2, {"parallelism": {"tensorParallelDegree": 48, "nodes": 2, "efa": True}}),
     "parallelism.efa: the instanceType has no EFA devices; EFA is on trn1.32xlarge, trn1n.32xlarge"),
    ("group-topology-on-one-node", _merge(TRN1, {"parallelism": {"groupTopologyKey": "x"}}),
     "parallelism.groupTopologyKey applies to nodes > 1"),
    ("group-topology-not-a-label-key", _merge(TRN1, {"parallelism": {
        "tensorParallelDegree": 64, "nodes": 2, "groupTopologyKey": "not a key"}}),
     "spec.parallelism.groupTopologyKey in body should match"),
    ("tp3-on-inf2", _merge(INF2, {"parallelism": {"tensorParallelDegree": 3}}), INF2_TP),
    ("tp32-on-inf2-24xlarge", _merge(INF2, {"instanceType": "inf2.24xlarge",
                                            "parallelism": {"tensorParallelDegree": 32}}), INF2_TP),
    ("tp24-on-inf2-24xlarge-too-many-cores", _merge(INF2, {"instanceType": "inf2.24xlarge",
                                                           "parallelism": {"tensorParallelDegree": 24}}),
     TOO_MANY_CORES),
    ("tp4-on-trn1-torus", _merge(TRN1, {"parallelism": {"tensorParallelDegree": 4}}), TRN1_TP),
    ("tp64-on-one-trn1-node", _merge(TRN1, {"parallelism": {"tensorParallelDegree": 64}}), TOO_MANY_CORES),
    ("tp128-on-trn2-lnc2", _merge(TRN2, {"parallelism": {"tensorParallelDegree": 128, "logicalCoreConfig": 2}}),
     TRN2_LNC2_TP),
    ("tp128-on-trn2-default-lnc", _merge(TRN2, {"parallelism": {"tensorParallelDegree": 128}}), TRN2_LNC2_TP),
    ("tp8-on-trn2-3xlarge-lnc2", _merge(TRN2, {"instanceType": "trn2.3xlarge",
                                               "parallelism": {"tensorParallelDegree": 8}}), TOO_MANY_CORES),
    ("logical-core-config-on-inf2", _merge(INF2, {"parallelism": {"logicalCoreConfig": 1}}),
     "parallelism.logicalCoreConfig applies to trn2 only: remove it or set a trn2 instanceType"),
    ("logical-core-config-3", _merge(TRN2, {"parallelism": {"logicalCoreConfig": 3}}),
     'spec.parallelism.logicalCoreConfig: Unsupported value: 3: supported values: "1", "2"'),
    ("context-longer-than-sequence", _merge(CPU, {"batching": {"maxContextLength": 4096, "maxSeqLen": 2048}}),
     "batching.maxContextLength (longest prompt) must be <= batching.maxSeqLen (prompt + output)"),
    ("framework-vllm", _merge(CPU, {"framework": "vllm"}),
     'spec.framework: Unsupported value: "vllm": supported values: "auto", "nxdi", "tnx", "torch"'),
    ("tnx-on-trn2", _merge(TRN2, {"framework": "tnx"}),
     "transformers-neuronx (framework tnx) never supported trn2: use framework nxdi (or auto)"),
    ("nxdi-on-m5", _merge(CPU, {"framework": "nxdi", "instanceType": "m5.xlarge"}),
     "framework nxdi and tnx run on Neuron instances: set instanceType to an inf2, trn1 or trn2 type, or "
     "framework torch"),
    ("unknown-neuron-type", _merge(INF2, {"instanceType": "inf2.96xlarge"}),
     "instanceType is not a Neuron instance type this operator knows: use one of inf2.xlarge"),
    ("source-ftp", _merge(CPU, {"model": {"source": "ftp://x"}}), SOURCE),
    ("source-hf-without-org", _merge(CPU, {"model": {"source": "hf://noslash"}}), SOURCE),
    ("source-relative-path", _merge(CPU, {"model": {"source": "models/tiny"}}), SOURCE),
    ("source-missing", _merge(CPU, {"model": {"source": DELETE, "revision": "main"}}),
     "spec.model.source: Required value"),
    ("model-missing", _merge(CPU, {"model": DELETE}), "spec.model: Required value"),
    ("draft-source-http", _merge(INF2, {"speculation": {"mode": "draft", "draftModel": {
        "source": "http://example.com/draft"}}}), "draftModel.source must be hf://org/name"),
    ("compile-cache-http", _merge(TRN1, {"compileCache": {"url": "http://x"}}),
     "compileCache.url must be s3://bucket/prefix, pvc://claim/path or an absolute path"),
    ("compile-cache-policy", _merge(TRN1, {"compileCache": {"policy": "Sometimes"}}),
     'spec.compileCache.policy: Unsupported value: "Sometimes": supported values: "IfNotCached", "Always", "Never"'),
    ("min-replicas-above-max", _merge(CPU, {"replicas": DELETE, "autoscaling": {"minReplicas": 5,
                                                                               "maxReplicas": 2}}),
     "autoscaling.minReplicas must be <= autoscaling.maxReplicas"),
    ("rollout-that-replaces-nothing", _merge(CPU, {"rollout": {"maxUnavailable": 0, "maxSurge": "0%"}}),
     "rollout.maxUnavailable and rollout.maxSurge must not both be 0"),
    ("autoscaling-without-max", _merge(CPU, {"replicas": DELETE, "autoscaling": {"minReplicas": 1}}),
     "spec.autoscaling.maxReplicas: Required value"),
    ("negative-replicas", _merge(CPU, {"replicas": -1}),
     "spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0"),
    ("parameters-not-a-count", _merge(INF2, {"model": {"parameters": "8 billion"}}),
     "spec.model.parameters in body should match"),
    ("dtype-int8", _merge(INF2, {"model": {"dtype": "int8"}}), 'spec.model.dtype: Unsupported value: "int8"'),
    ("top-k-257-on-device", _merge(INF2, {"sampling": {"globalTopK": 257}}), TOP_K),
    ("top-k-on-trn2", _merge(TRN2, {"sampling": {"globalTopK": 1000}}), TOP_K),
    # auto without instanceType is placed on a Neuron instance (resolve.py): a Neuron runner, not the CPU one
    ("top-k-auto-no-instance", {"model": {"source": "s3://my-bucket/llama"}, "sampling": {"globalTopK": 1000}},
     TOP_K),
    ("overrides-with-torch", _merge(CPU, {"neuronConfigOverrides": {"fused_qkv": True}}), TORCH_OVERRIDES),
    ("empty-overrides-with-torch", _merge(CPU, {"neuronConfigOverrides": {}}), TORCH_OVERRIDES),  # has(): written
    ("too-many-overrides", _merge(INF2, {"neuronConfigOverrides": {f"key_{i}": i for i in range(65)}}),
     "spec.neuronConfigOverrides: Too many: 65: must have at most 64 items"),
    ("engine-unknown", _merge(INF2, {"engine": "tgi"}),
     'spec.engine: Unsupported value: "tgi": supported values: "neuronmodel", "vllm"'),
    ("vllm-framework-nxdi", _merge(INF2, {**VLLM, "framework": "nxdi"}), VLLM_FRAMEWORK),
    ("vllm-framework-torch", _merge(CPU, VLLM), VLLM_FRAMEWORK),
    ("vllm-draft", _merge(INF2, {**VLLM, "speculation": {"mode": "draft", "draftModel": {
        "source": "hf://org/small"}}}), VLLM_SPECULATION),
    ("vllm-prompt-lookup", _merge(INF2, {**VLLM, "speculation": {"mode": "promptLookup"}}), VLLM_SPECULATION),
    ("vllm-sharded-weights", _merge(TRN1, {**VLLM, "compileCache": {"url": "s3://cache/prod",
                                                                     "shardedWeights": True}}), VLLM_SHARDED),
    ("vllm-two-nodes", _merge(TRN1, {**VLLM, "parallelism": {"tensorParallelDegree": 64, "nodes": 2}}),
     VLLM_NODES),
    ("vllm-on-m5", _merge(INF2, {**VLLM, "instanceType": "m5.xlarge", "parallelism": {"tensorParallelDegree": 1}}),
     "instanceType must be a Neuron instance type with engine vllm"),
    ("vllm-eagle-host-sampling", _merge(INF2, {**VLLM, "sampling": {"onDevice": False}, "speculation": {
        "mode": "eagle", "draftModel": {"source": "hf://org/eagle3"}}}), VLLM_HOST_SAMPLING),
    ("vllm-trn2-eagle-host-sampling", _merge(TRN2, {**VLLM, "parallelism": {"tensorParallelDegree": 8},
                                                    "sampling": {"onDevice": False}, "speculation": {
        "mode": "eagle", "draftModel": {"source": "hf://org/eagle3"}}}), VLLM_HOST_SAMPLING),
    ("eagle3-draft-of-mode-draft", _merge(INF2, {"speculation": {"mode": "draft", "draftModel": {
        "source": "hf://org/small", "eagle3": True}}}),
     "speculation.draftModel.eagle3 applies to speculation.mode eagle"),
    ("tnx-two-nodes", _merge(TRN1, {"framework": "tnx", "parallelism": {"tensorParallelDegree": 64, "nodes": 2}}),
     "parallelism.nodes must be 1 with framework tnx: the transformers-neuronx image (Neuron SDK 2.25) has no EFA"),
    ("one-node-surge-0-alone", _merge(CPU, {"rollout": {"maxSurge": 0}}), NOTHING_REPLACED),
    ("group-unavailable-0-alone", _merge(TRN1, {"parallelism": {"tensorParallelDegree": 64, "nodes": 2},
                                                "rollout": {"maxUnavailable": "0%"}}), NOTHING_REPLACED),
    ("dra-on-karpenter", _merge(TRN1, {"deviceAllocation": "dra", "nodeSelector": {"karpenter.sh/nodepool": "x"}}),
     DRA_ON_KARPENTER),
    ("dra-on-auto-mode", _merge(TRN1, {"deviceAllocation": "dra",
                                       "nodeSelector": {"eks.amazonaws.com/compute-type": "auto"}}), DRA_ON_KARPENTER),
]


@pytest.mark.parametrize(("spec", "message"), [pytest.param(spec, message, id=case)
                                               for case, spec, message in REJECTED])
def test_invalid_specs_are_rejected_with_how_to_fix(crd, shared_namespace, request, spec, message):
    name = f"bad-{request.node.callspec.id}"[:api.MAX_NAME_LENGTH].rstrip("-")
    rejected = apply(crd, shared_namespace, _body(name, spec))
    assert rejected.returncode != 0, f"accepted: {json.dumps(spec)}"
    assert message in rejected.stderr
    assert crd.kubectl("get", "nm", name, "-n", shared_namespace, check=False).returncode != 0  # nothing stored


@pytest.mark.parametrize(("name", "message"), [
    ("n" * (api.MAX_NAME_LENGTH + 1), "metadata.name must be at most 40 characters: the operator appends suffixes"),
    ("1-starts-with-a-digit", "metadata.name must be a DNS-1035 label"),
    ("has.dots", "metadata.name must be a DNS-1035 label"),
])
def test_names_the_children_cannot_carry_are_rejected(crd, shared_namespace, name, message):
    rejected = apply(crd, shared_namespace, _body(name, CPU))
    assert rejected.returncode != 0, f"accepted the name {name}"
    assert message in rejected.stderr


MISSPELT = [
    ("parallelism-tensorParalelDegree", _merge(INF2, {"parallelism": {"tensorParalelDegree": 8}}),
     "spec.parallelism.tensorParalelDegree"),
    ("replica", _merge(CPU, {"replica": 2}), "spec.replica"),
    ("speculation-draft_model", _merge(INF2, {"speculation": {"mode": "none", "draft_model": {"source": "/x"}}}),
     "spec.speculation.draft_model"),
]


@pytest.mark.parametrize(("spec", "field"), [pytest.param(s, f, id=i) for i, s, f in MISSPELT])
@pytest.mark.parametrize("how", ["server-side", "client-side"])
def test_a_misspelt_field_is_rejected_not_pruned(crd, shared_namespace, spec, field, how):
    rejected = apply(crd, shared_namespace, _body(f"misspelt-{how}", spec), server_side=how == "server-side")
    assert rejected.returncode != 0, f"{field} was accepted (pruned silently?)"
    # Server-side apply: "field not declared in schema"; client-side apply: "strict decoding error: unknown field".
    expected = f".{field}: field not declared in schema" if how == "server-side" else f'unknown field "{field}"'
    assert expected in rejected.stderr


@pytest.mark.parametrize("how", ["server-side", "client-side"])
def test_a_wrong_type_is_rejected(crd, shared_namespace, how):
    spec = _merge(INF2, {"parallelism": {"tensorParallelDegree": "eight"}})
    rejected = apply(crd, shared_namespace, _body(f"wrong-type-{how}", spec), server_side=how == "server-side")
    assert rejected.returncode != 0
    assert "tensorParallelDegree" in rejected.stderr
    expected = "expected numeric (int or float), got string" if how == "server-side" else \
        'Invalid value: "string": spec.parallelism.tensorParallelDegree in body must be of type integer'
    assert expected in rejected.stderr
