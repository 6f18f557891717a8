"""Behaviour of the builders that a user relies on (the golden files pin the rest)."""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from neuronmodel_runtime.config import RuntimeConfig

from neuronmodel_operator import api, builders
from neuronmodel_operator.api import SpecError
from neuronmodel_operator.builders import common, pod, sources
from neuronmodel_operator.resolve import OperatorDefaults
from neuronmodel_operator.served import served_target
from operator_tests import golden

CASES = sorted(golden.CASES)


def by_kind(children: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [c for c in children if c["kind"] == kind]


def one(children: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(children, kind)
    assert len(found) == 1, f"{len(found)} {kind}s"
    return found[0]


def pod_templates(children: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, pod template) of every workload child."""
    for child in children:
        if child["kind"] in ("Deployment", "Job"):
            yield child["kind"], child["spec"]["template"]
        elif child["kind"] == "LeaderWorkerSet":
            for key in ("leaderTemplate", "workerTemplate"):
                yield f"LeaderWorkerSet.{key}", child["spec"]["leaderWorkerTemplate"][key]


def serving_template(children: list[dict[str, Any]]) -> dict[str, Any]:
    return next(t for where, t in pod_templates(children) if where in ("Deployment", "LeaderWorkerSet.leaderTemplate"))


def runtime_container(template: dict[str, Any]) -> dict[str, Any]:
    """The `runtime` container: the pod's one container, or the first of engine vllm's compile Job (vLLM under its
    supervisor, beside `store-artifacts`). Never a restartable sidecar: a crash loop there is no failure the Job
    counts."""
    assert not [c for c in template["spec"].get("initContainers", []) if "restartPolicy" in c]
    container = template["spec"]["containers"][0]
    assert container["name"] == "runtime" and "restartPolicy" not in container
    return container


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def serve_spec(target: builders.Target) -> dict[str, Any]:
    """The PodSpec of a serving pod of `target`."""
    return builders.pod_spec(target, pod.SERVE_COMMAND, "serve", builders.runtime_configmap_name(target))


def config_of(children: list[dict[str, Any]], suffix: str = "-runtime") -> dict[str, Any]:
    cm = next(c for c in by_kind(children, "ConfigMap") if c["metadata"]["name"].endswith(suffix))
    return json.loads(cm["data"]["config.json"])


# The RuntimeConfig the pods read

@pytest.mark.parametrize("case", CASES)
def test_every_config_map_is_a_valid_runtime_config(case):
    """The runtime's own model accepts every config.json (unknown keys are errors there); engine vllm has none."""
    cms = by_kind(golden.children(case), "ConfigMap")
    assert bool(cms) is (golden.target(case).spec.engine == "neuronmodel")
    for cm in cms:
        assert list(cm["data"]) == ["config.json"]
        config = RuntimeConfig.model_validate_json(cm["data"]["config.json"])
        assert config.server.host == "0.0.0.0"
        assert config.server.api_key is None


def test_config_carries_the_spec():
    t = golden.target("trn1-s3-cache")
    config = RuntimeConfig.model_validate(builders.runtime_config(t))
    assert (config.max_num_seqs, config.max_context_length, config.max_model_len) == (16, 4096, 8192)
    assert config.parallelism.tensor_parallel_degree == 8 and config.dtype == "bfloat16"
    assert config.compile_cache.url == "s3://acme-neuron-cache/prod"
    assert config.server.served_model_name == "llama-8b"  # default: the NeuronModel's name
    assert builders.runtime_config(golden.target("inf2-hf"))["server"]["served_model_name"] == "llama-3.2-1b"
    assert builders.runtime_config(golden.target("replicas-3"))["server"]["port"] == 9000


def test_neuron_config_overrides_reach_the_job_and_the_pods_and_only_when_set():
    t = golden.target("trn1-s3-cache")
    overrides = {"fused_qkv": True, "sequence_parallel_enabled": True}
    for for_compile in (False, True):
        config = RuntimeConfig.model_validate(builders.runtime_config(t, for_compile))
        assert config.neuron_config_overrides == overrides
    nested = golden.target("inf2-hf", neuronConfigOverrides={"on_device_sampling_config": {"deterministic": True}})
    assert builders.runtime_config(nested)["neuron_config_overrides"] == {
        "on_device_sampling_config": {"deterministic": True}}
    # Absent when empty: a key in every config would rename every ConfigMap, and roll every model, on an upgrade.
    plain, empty = golden.target("inf2-hf"), golden.target("inf2-hf", neuronConfigOverrides={})
    assert "neuron_config_overrides" not in builders.runtime_config(plain)
    assert builders.runtime_config_json(empty) == builders.runtime_config_json(plain)
    assert builders.runtime_configmap_name(empty) == builders.runtime_configmap_name(plain)


def test_serving_pods_never_recompile_on_every_start():
    """Always compiles once, in the Job; the serving pods read the cache (IfNotCached); Never stays Never."""
    t = golden.target("trn2-lnc-autoscale")  # policy Always
    assert builders.runtime_config(t)["compile_cache"]["policy"] == "IfNotCached"
    assert builders.runtime_config(t, for_compile=True)["compile_cache"]["policy"] == "Always"
    job_cm = one(builders.compile_children(t), "ConfigMap")
    assert json.loads(job_cm["data"]["config.json"])["compile_cache"]["policy"] == "Always"
    never = golden.target("prompt-lookup")
    assert builders.runtime_config(never)["compile_cache"]["policy"] == "Never"
    assert builders.compile_children(never) == []


def test_a_compile_cache_turns_on_the_reference_runners_compiled_graphs():
    """Framework torch compiles its graphs only with RuntimeConfig compile: true; a compile cache is what sets it
    (for the Job and the serving pods alike), so the Job has something to store and replicas start from it."""
    plain = golden.target("tiny-torch")
    assert RuntimeConfig.model_validate(builders.runtime_config(plain)).compile is False
    cached = golden.target("tiny-torch", compileCache={"url": "pvc://cache/artifacts"})
    assert cached.spec.framework == "torch"
    for for_compile in (False, True):
        assert RuntimeConfig.model_validate(builders.runtime_config(cached, for_compile)).compile is True
    assert builders.runtime_config(golden.target("trn1-s3-cache"))["compile"] is True


def test_compile_job_only_when_the_cache_policy_asks():
    with_job = {case for case in CASES if builders.compile_children(golden.target(case))}
    assert with_job == {"trn1-s3-cache", "trn2-lnc-autoscale", "multinode-lws", "vllm-trn2-eagle"}
    for case in with_job:
        kinds = [c["kind"] for c in builders.compile_children(golden.target(case))]
        assert kinds == (["Job"] if case.startswith("vllm-") else ["ConfigMap", "Job"])  # vLLM reads no config


def test_a_new_config_rolls_the_pods():
    before, after = golden.target("inf2-hf"), golden.target("inf2-hf", server={"port": 8080})
    assert builders.runtime_configmap_name(before) != builders.runtime_configmap_name(after)
    for t in (before, after):  # each revision's pods read the ConfigMap named by its own content
        assert builders.configmap(t)["metadata"]["name"] == builders.runtime_configmap_name(t)
        assert {"name": "config", "configMap": {"name": builders.runtime_configmap_name(t)}} in \
            builders.deployment(t)["spec"]["template"]["spec"]["volumes"]


# Secrets

def test_api_key_reaches_the_pod_only_through_a_secret_key_ref():
    children = golden.children("inf2-hf")
    container = runtime_container(serving_template(children))
    assert env_of(container)["NEURONMODEL_API_KEY"] == {
        "name": "NEURONMODEL_API_KEY", "valueFrom": {"secretKeyRef": {"name": "llama-api-key", "key": "api-key"}}}
    for cm in by_kind(children, "ConfigMap"):
        assert "api_key" not in json.loads(cm["data"]["config.json"])["server"]
    for case in CASES:  # no case without the secret has the variable; none anywhere holds a literal value
        for _, template in pod_templates(golden.children(case)):
            for c in template["spec"]["containers"] + template["spec"].get("initContainers", []):
                for e in c.get("env", []):
                    if e["name"] in ("NEURONMODEL_API_KEY", "HF_TOKEN"):
                        assert "value" not in e and set(e["valueFrom"]) == {"secretKeyRef"}
                        assert e["name"] != "NEURONMODEL_API_KEY" or case == "inf2-hf"


def test_hf_token_only_in_the_download_init_containers():
    for case in ("inf2-hf", "draft-hf", "trn2-lnc-autoscale"):
        template = serving_template(golden.children(case))
        assert "HF_TOKEN" not in env_of(runtime_container(template))
        inits = template["spec"]["initContainers"]
        ref = golden.CASES[case]["spec"]["model"]["tokenSecretRef"]
        for init in inits:
            assert env_of(init)["HF_TOKEN"]["valueFrom"] == {
                "secretKeyRef": {"name": ref["name"], "key": ref.get("key", "token")}}
    s3 = serving_template(golden.children("trn1-s3-cache"))
    (init,) = s3["spec"]["initContainers"]
    assert "HF_TOKEN" not in env_of(init)  # an s3:// model: credentials from the ServiceAccount (IRSA)
    assert s3["spec"]["serviceAccountName"] == "neuronmodel-s3"
    no_token = serving_template(golden.children("replicas-3"))
    assert all("HF_TOKEN" not in env_of(i) for i in no_token["spec"]["initContainers"])


# Resources and placement

@pytest.mark.parametrize("case", CASES)
def test_neuron_request_is_tp_over_nodes_neuroncores_or_whole_devices(case):
    spec = golden.CASES[case]["spec"]
    for where, template in pod_templates(golden.children(case)):
        res = runtime_container(template).get("resources", {})
        requests, limits = res.get("requests", {}), res.get("limits", {})
        neuron = {k: v for k, v in requests.items() if k.startswith("aws.amazon.com/")}
        assert neuron == {k: v for k, v in limits.items() if k.startswith("aws.amazon.com/")}, where
        tp = spec.get("parallelism", {}).get("tensorParallelDegree", 1)
        nodes = spec.get("parallelism", {}).get("nodes", 1)
        if spec.get("framework") == "torch" or spec.get("deviceAllocation") == "dra":  # dra: a claim instead
            assert neuron == {}
        elif spec.get("neuronResource") == "neuron":
            assert neuron == {"aws.amazon.com/neuron": "2"}  # TP 4 on inf2: 2 cores per device
        else:
            assert neuron == {"aws.amazon.com/neuroncore": str(tp // nodes)}, where
        for key, value in spec.get("resources", {}).get("requests", {}).items():
            assert requests[key] == str(value)


def test_placement_on_neuron_nodes():
    template = serving_template(golden.children("trn2-lnc-autoscale"))["spec"]
    assert template["nodeSelector"] == {"node.kubernetes.io/instance-type": "trn2.48xlarge",
                                        "karpenter.sh/capacity-type": "on-demand"}
    assert template["tolerations"][0] == {"key": "aws.amazon.com/neuron", "operator": "Exists",
                                          "effect": "NoSchedule"}
    assert template["tolerations"][1]["key"] == "dedicated"
    assert template["schedulerName"] == "my-scheduler"
    assert env_of(runtime_container({"spec": template}))["NEURON_LOGICAL_NC_CONFIG"]["value"] == "1"
    cpu = serving_template(golden.children("tiny-torch"))["spec"]
    assert "nodeSelector" not in cpu and "tolerations" not in cpu  # the reference runner: any CPU node
    assert "NEURON_LOGICAL_NC_CONFIG" not in env_of(runtime_container({"spec": cpu}))


def test_spec_node_selector_cannot_move_pods_off_the_resolved_instance_type():
    t = golden.target("inf2-hf", nodeSelector={"node.kubernetes.io/instance-type": "m5.large", "zone": "a"})
    assert serve_spec(t)["nodeSelector"] == {
        "node.kubernetes.io/instance-type": "inf2.xlarge", "zone": "a"}


# Replicas, rollouts, autoscaling

def test_replicas_omitted_under_autoscaling():
    children = golden.children("trn2-lnc-autoscale")
    assert "replicas" not in one(children, "Deployment")["spec"]
    hpa = one(children, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama-70b"}
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (1, 4)
    assert hpa["behavior"] == {"scaleUp": {"stabilizationWindowSeconds": 0},
                               "scaleDown": {"stabilizationWindowSeconds": 600}}
    lws = golden.target("multinode-lws", replicas=None, autoscaling={"maxReplicas": 3})
    lws_children = builders.serving_children(lws)
    assert "replicas" not in one(lws_children, "LeaderWorkerSet")["spec"]
    assert one(lws_children, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"] == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": "llama-405b-lws"}
    assert one(golden.children("replicas-3"), "Deployment")["spec"]["replicas"] == 3
    assert not by_kind(golden.children("replicas-3"), "HorizontalPodAutoscaler")


def test_hpa_metric_default_and_override():
    metric = lambda t: builders.hpa(t)["spec"]["metrics"][0]["pods"]  # noqa: E731
    default = golden.target("trn2-lnc-autoscale")
    assert metric(default) == {"metric": {"name": "vllm:num_requests_waiting"},
                               "target": {"type": "AverageValue", "averageValue": "8"}}
    operator_wide = builders.target_from_body(golden.CASES["trn2-lnc-autoscale"],
                                              OperatorDefaults(hpa_metric="queue_depth"))
    assert metric(operator_wide)["metric"]["name"] == "queue_depth"
    own = golden.target("trn2-lnc-autoscale", autoscaling={"maxReplicas": 2, "metric": "my_waiting"})
    assert metric(own)["metric"]["name"] == "my_waiting"


def test_replicas_only_change_leaves_the_pods_alone():
    one_, five = golden.target("inf2-hf"), golden.target("inf2-hf", replicas=5)
    assert builders.config_hash(one_) == builders.config_hash(five)
    assert builders.configmap(one_) == builders.configmap(five)
    a, b = builders.deployment(one_), builders.deployment(five)
    assert a["spec"]["template"] == b["spec"]["template"]
    assert (a["spec"]["replicas"], b["spec"]["replicas"]) == (1, 5)
    assert one_.resolved.compile_key == five.resolved.compile_key


def test_compile_key_change_renames_the_job():
    base = golden.target("trn1-s3-cache")
    bigger = golden.target("trn1-s3-cache", batching={"maxBatchSize": 32, "maxContextLength": 4096,
                                                      "maxSeqLen": 8192})
    more = golden.target("trn1-s3-cache", replicas=4)
    job = lambda t: one(builders.compile_children(t), "Job")  # noqa: E731
    assert job(base)["metadata"]["name"] != job(bigger)["metadata"]["name"]
    assert job(base)["metadata"]["name"] == builders.compile_name(base)
    assert job(base)["metadata"]["name"].startswith("llama-8b-compile-")
    assert job(base)["metadata"]["annotations"][api.ANNOTATION_COMPILE_KEY] == base.resolved.compile_key
    assert job(more) == job(base)  # replicas do not change the compiled graphs
    cm = one(builders.compile_children(base), "ConfigMap")
    assert cm["metadata"]["name"] == job(base)["metadata"]["name"]
    assert {"name": "config", "configMap": {"name": cm["metadata"]["name"]}} in \
        job(base)["spec"]["template"]["spec"]["volumes"]


def test_compile_job_retries_under_a_deadline_without_probes():
    job = one(golden.children("trn1-s3-cache"), "Job")
    assert job["spec"]["backoffLimit"] == 4 and job["spec"]["activeDeadlineSeconds"] == 6 * 3600
    template = job["spec"]["template"]
    assert template["metadata"]["labels"][api.LABEL_COMPONENT] == "compile"
    assert template["spec"]["restartPolicy"] == "Never"
    container = runtime_container(template)
    assert container["command"] == ["neuronmodel-runtime", "compile", "--config", "/etc/neuronmodel/config.json"]
    assert not {"startupProbe", "readinessProbe", "livenessProbe", "ports"} & set(container)
    serving = serving_template(golden.children("trn1-s3-cache"))
    assert template["spec"]["nodeSelector"] == serving["spec"]["nodeSelector"]
    assert container["resources"] == runtime_container(serving)["resources"]


def test_rollout_keeps_capacity_by_default():
    strategy = one(golden.children("inf2-hf"), "Deployment")["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    custom = one(golden.children("replicas-3"), "Deployment")["spec"]["strategy"]["rollingUpdate"]
    assert custom == {"maxUnavailable": 1, "maxSurge": 0}
    lws = one(golden.children("multinode-lws"), "LeaderWorkerSet")["spec"]["rolloutStrategy"]
    assert lws == {"type": "RollingUpdate", "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}}


def _lws_rollout(**changes: Any) -> dict[str, Any]:
    lws = one(builders.serving_children(golden.target("multinode-lws", **changes)), "LeaderWorkerSet")
    return lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]


def test_a_multi_node_group_is_replaced_in_place_by_default():
    """LWS's exclusive topology gives each group a node group to itself (its pod webhook's required anti-affinity
    against other groups on the key): a surge group needs a whole free node group, which a cluster sized one node group
    per replica never has, so a default surge would hold every rollout Pending forever. LWS's own default: 1 / 0."""
    assert _lws_rollout(rollout=None) == {"maxUnavailable": 1, "maxSurge": 0}
    assert _lws_rollout(rollout={"maxSurge": 1}) == {"maxUnavailable": 1, "maxSurge": 1}  # the user's word wins
    assert _lws_rollout(rollout={"maxUnavailable": 0, "maxSurge": 1}) == {"maxUnavailable": 0, "maxSurge": 1}
    one_node = one(builders.serving_children(golden.target("inf2-hf", rollout={"maxUnavailable": 1})), "Deployment")
    assert one_node["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 1}


def test_a_surge_with_an_exclusive_topology_key_is_warned_about_naming_the_fix():
    """Models created under the older CRD carry maxSurge 1 written into their spec: they are told how to get out."""
    surging = golden.target("multinode-lws", rollout={"maxUnavailable": 0, "maxSurge": 1}).resolved
    (warning,) = [w for w in surging.warnings if w.reason == "SurgeNeedsSpareNodeGroup"]
    assert warning.startswith("rollout.maxSurge is 1 while each serving group of 2 nodes has a "
                              "eks.amazonaws.com/nodegroup value (a node group) to itself")
    assert warning.endswith("set rollout.maxSurge 0 and rollout.maxUnavailable 1 (or remove spec.rollout: the default "
                            "for nodes > 1)")
    quiet = [golden.target("multinode-lws", rollout=None),
             golden.target("multinode-lws", rollout={"maxSurge": 1},
                           parallelism={"tensorParallelDegree": 64, "nodes": 2, "groupTopologyKey": ""}),
             golden.target("inf2-hf")]
    assert not [w for t in quiet for w in t.resolved.warnings if w.reason == "SurgeNeedsSpareNodeGroup"]


def test_pdb_when_more_than_one_replica():
    assert one(golden.children("replicas-3"), "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    assert not by_kind(golden.children("inf2-hf"), "PodDisruptionBudget")
    assert by_kind(golden.children("trn2-lnc-autoscale"), "PodDisruptionBudget")  # maxReplicas 4
    assert by_kind(builders.serving_children(golden.target("inf2-hf", replicas=2)), "PodDisruptionBudget")


# Labels, owners, determinism

@pytest.mark.parametrize("case", CASES)
def test_owner_labels_and_annotations_never_reach_children(case):
    """The NeuronModel's Helm labels stay on it: children carry exactly our labels."""
    name = golden.CASES[case]["metadata"]["name"]
    for child in golden.children(case):
        component = child["metadata"]["labels"][api.LABEL_COMPONENT]
        ours = common.labels(golden.target(case), component)
        assert child["metadata"]["labels"] == ours
        assert ours[api.LABEL_INSTANCE] == name and ours[api.LABEL_MANAGED_BY] == "neuronmodel-operator"
        text = golden.render(child)
        for key in ("helm.sh/chart", "team", "note"):
            assert f"{key}:" not in text
        assert "Helm" not in text and "release-a" not in text
    for _, template in pod_templates(golden.children(case)):
        assert template["metadata"]["labels"] == common.labels(
            golden.target(case), template["metadata"]["labels"][api.LABEL_COMPONENT])


@pytest.mark.parametrize("case", CASES)
def test_every_child_is_owned_by_its_neuron_model(case):
    body = golden.CASES[case]
    for child in golden.children(case):
        assert child["metadata"]["ownerReferences"] == [{
            "apiVersion": "neuronmodel.dev/v1alpha1", "kind": "NeuronModel", "name": body["metadata"]["name"],
            "uid": body["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
        assert child["metadata"]["namespace"] == body["metadata"]["namespace"]


@pytest.mark.parametrize("case", CASES)
def test_builders_are_deterministic_and_return_fresh_dicts(case):
    first = golden.children(case)
    snapshot = copy.deepcopy(first)
    first[0]["metadata"]["labels"]["mutated"] = "yes"
    assert golden.children(case) == snapshot
    assert "generateName" not in json.dumps(snapshot) and "creationTimestamp" not in json.dumps(snapshot)


def test_served_spec_annotation_round_trips():
    for case in CASES:
        t = golden.target(case)
        workload = next(c for c in builders.serving_children(t) if c["kind"] in ("Deployment", "LeaderWorkerSet"))
        served = json.loads(workload["metadata"]["annotations"][api.ANNOTATION_SERVED])
        assert api.parse_spec(served["spec"]) == t.spec
        back = served_target(workload, t, golden.DEFAULTS)
        assert back.spec == t.spec and back.resolved == t.resolved
        # fields added later are written only away from their defaults: older models' records keep their bytes
        recorded = json.loads(json.dumps(dataclasses.asdict(t.resolved)))
        for later, default in {"fetch_image": None, "efa_per_pod": 0, "group_topology_key": None}.items():
            if recorded[later] == default:
                del recorded[later]
        assert served["resolved"] == recorded
        assert ("engine" in served["spec"]) is (t.spec.engine == "vllm")
        multi_node = t.spec.parallelism.nodes > 1
        assert ("efa" in served["spec"]["parallelism"]) is (t.spec.parallelism.efa is not None)
        assert ("group_topology_key" in served["resolved"]) is multi_node


# Security

@pytest.mark.parametrize("case", CASES)
def test_restricted_security_context_on_every_container(case):
    for where, template in pod_templates(golden.children(case)):
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["securityContext"]["runAsUser"] == spec["securityContext"]["fsGroup"] == 1000
        assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
        assert spec["terminationGracePeriodSeconds"] == 45
        containers = spec["containers"] + spec.get("initContainers", [])
        for c in containers:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, (where, c["name"])
            assert sc["capabilities"] == {"drop": ["ALL"]} and sc["readOnlyRootFilesystem"] is True
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["shm"]["emptyDir"]["medium"] == "Memory"
        mounts = {m["mountPath"]: m["name"] for m in runtime_container(template)["volumeMounts"]}
        expected = {"/tmp": "tmp", "/dev/shm": "shm", "/var/cache/neuronmodel": "cache", "/var/tmp": "neuron-cache"}
        if golden.target(case).spec.engine == "neuronmodel":  # engine vllm reads no RuntimeConfig
            expected["/etc/neuronmodel"] = "config"
        for path, volume in expected.items():
            assert mounts[path] == volume


# Probes

def test_startup_budget_rules():
    torch, cached, in_pod = golden.target("tiny-torch"), golden.target("trn1-s3-cache"), golden.target("inf2-hf")
    never = golden.target("prompt-lookup")  # a cache read with policy Never: no Job, artifacts already there
    assert [builders.startup_budget_s(t) for t in (torch, cached, never, in_pod)] == [600, 1800, 1800, 14400]
    for t in (torch, cached, in_pod):
        deployment = builders.deployment(t)
        container = runtime_container(deployment["spec"]["template"])
        startup = container["startupProbe"]
        assert startup["httpGet"] == {"path": "/ready", "port": "http"}
        assert startup["periodSeconds"] * startup["failureThreshold"] == builders.startup_budget_s(t)
        assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
        assert container["readinessProbe"]["periodSeconds"] == 5
        assert container["livenessProbe"]["httpGet"]["path"] == "/health"
        assert (container["livenessProbe"]["periodSeconds"], container["livenessProbe"]["failureThreshold"]) == (10, 3)
        assert deployment["spec"]["progressDeadlineSeconds"] == builders.startup_budget_s(t) + 600


def test_serving_pods_expose_http_and_metrics():
    template = serving_template(golden.children("replicas-3"))
    assert runtime_container(template)["ports"] == [{"name": "http", "containerPort": 9000, "protocol": "TCP"}]
    assert runtime_container(template)["command"] == ["neuronmodel-runtime", "serve", "--config",
                                                      "/etc/neuronmodel/config.json"]
    annotations = template["metadata"]["annotations"]
    assert (annotations["prometheus.io/scrape"], annotations["prometheus.io/port"],
            annotations["prometheus.io/path"]) == ("true", "9000", "/metrics")
    assert annotations[api.ANNOTATION_COMPILE_KEY] == golden.target("replicas-3").resolved.compile_key


# Service and multi-node

def test_service_selects_leader_pods_only_for_lws():
    lws_children = golden.children("multinode-lws")
    svc = one(lws_children, "Service")["spec"]
    assert svc["selector"] == {"neuronmodel.dev/name": "llama-405b", "app.kubernetes.io/component": "server",
                               "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    assert svc["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    assert builders.selector_string(golden.target("multinode-lws")) == (
        "app.kubernetes.io/component=server,leaderworkerset.sigs.k8s.io/worker-index=0,"
        "neuronmodel.dev/name=llama-405b")
    single = one(golden.children("inf2-hf"), "Service")["spec"]["selector"]
    assert single == one(golden.children("inf2-hf"), "Deployment")["spec"]["selector"]["matchLabels"]
    assert builders.selector_string(golden.target("inf2-hf")) == \
        "app.kubernetes.io/component=server,neuronmodel.dev/name=llama-1b"
    assert builders.endpoint(golden.target("replicas-3")) == "http://smollm.models.svc.cluster.local:9000"


def test_leaderworkerset_groups():
    lws = one(golden.children("multinode-lws"), "LeaderWorkerSet")
    assert not by_kind(golden.children("multinode-lws"), "Deployment")
    # Not `<name>`: the LWS controller makes a headless Service named like the LWS, and ours is `<name>`.
    assert lws["metadata"]["name"] == "llama-405b-lws" != one(golden.children("multinode-lws"), "Service")[
        "metadata"]["name"]
    template = lws["spec"]["leaderWorkerTemplate"]
    assert (template["size"], template["restartPolicy"]) == (2, "RecreateGroupOnPodRestart")
    assert lws["spec"]["startupPolicy"] == "LeaderCreated" and lws["spec"]["replicas"] == 2
    worker = runtime_container(template["workerTemplate"])
    assert worker["command"] == ["neuronmodel-runtime", "worker", "--config", "/etc/neuronmodel/config.json"]
    assert not {"startupProbe", "readinessProbe", "livenessProbe"} & set(worker)
    assert "readinessProbe" in runtime_container(template["leaderTemplate"])
    assert worker["resources"] == runtime_container(template["leaderTemplate"])["resources"]


def _unknown_fields(value: Any, schema: dict[str, Any], path: str) -> Iterator[str]:
    """Fields of `value` that `schema` (a structural CRD schema) does not define: the API server would prune
    them silently."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if props is not None and key in props:
                yield from _unknown_fields(item, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                yield from _unknown_fields(item, extra, f"{path}.{key}")
            elif props is not None or extra is None:
                yield f"{path}.{key}"
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from _unknown_fields(item, schema["items"], f"{path}[{i}]")


def test_leaderworkerset_matches_the_installed_crd_schema():
    """Field names, types and enums against the LWS CRD the control plane installs (make k8s-bin)."""
    jsonschema = pytest.importorskip("jsonschema")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from k8s import install  # noqa: E402

    crd_path = install.lws_crd()
    if not crd_path.exists():
        pytest.skip(f"{crd_path} is not installed (make k8s-bin)")
    crd = yaml.safe_load(crd_path.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = version["schema"]["openAPIV3Schema"]
    for t in (golden.target("multinode-lws"), golden.target("multinode-lws", replicas=None,
                                                            autoscaling={"maxReplicas": 2})):
        lws = builders.leaderworkerset(t)
        assert lws["apiVersion"] == f"{crd['spec']['group']}/v1" and lws["kind"] == crd["spec"]["names"]["kind"]
        body = {k: v for k, v in lws.items() if k != "metadata"}
        assert list(_unknown_fields(body, schema, "")) == []
        jsonschema.validate(body, {**schema, "properties": {k: v for k, v in schema["properties"].items()
                                                            if k != "metadata"}})


# Sources and volumes

def test_node_path_model_is_mounted_at_the_same_path():
    """So the pod's command also runs on the host, unchanged (the integration tests do)."""
    t = golden.target("tiny-torch")
    path = "/opt/neuronmodel/models/tiny"
    assert builders.runtime_config(t)["model"] == path
    spec = serve_spec(t)
    assert {"name": "model", "hostPath": {"path": path, "type": "Directory"}} in spec["volumes"]
    assert {"name": "model", "mountPath": path, "readOnly": True} in spec["containers"][0]["volumeMounts"]
    assert "initContainers" not in spec


def test_downloaded_models_come_from_init_containers():
    t = golden.target("draft-hf")
    config = builders.runtime_config(t)
    assert (config["model"], config["speculation"]["draft_model"]) == ("/models/model", "/models/draft")
    spec = serve_spec(t)
    assert [i["name"] for i in spec["initContainers"]] == ["fetch-model", "fetch-draft"]
    assert spec["initContainers"][0]["command"] == [
        "neuronmodel-runtime", "fetch", "hf://meta-llama/Llama-3.1-8B-Instruct", "/models/model"]
    assert spec["initContainers"][1]["command"] == [
        "neuronmodel-runtime", "fetch", "hf://meta-llama/Llama-3.2-1B-Instruct", "/models/draft", "--revision", "main"]
    assert all(i["image"] == t.resolved.image for i in spec["initContainers"])
    assert {"name": "models", "mountPath": "/models"} in spec["initContainers"][0]["volumeMounts"]
    assert [v["emptyDir"] for v in spec["volumes"] if v["name"] == "models"] == [{"sizeLimit": "24Gi"}]
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in spec["containers"][0]["volumeMounts"]
    pinned = serve_spec(golden.target("inf2-hf"))["initContainers"][0]
    assert pinned["command"][-2:] == ["--revision", "9213176726f574b556790deb65791e0c5aa438b6"]


def test_pvc_sources_and_caches():
    t = golden.target("multinode-lws")
    config = builders.runtime_config(t)
    assert config["model"] == "/mnt/model/llama-3.1-405b-instruct"
    assert config["compile_cache"]["url"] == "/mnt/compile-cache/llama-405b"
    spec = serve_spec(t)
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "model-store", "readOnly": True}
    assert volumes["compile-cache"]["persistentVolumeClaim"] == {"claimName": "neuron-cache"}
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert mounts["compile-cache"] == {"name": "compile-cache", "mountPath": "/mnt/compile-cache"}  # writable
    assert mounts["model"]["readOnly"] is True


def test_s3_and_node_path_caches():
    s3 = golden.target("trn1-s3-cache")
    assert builders.runtime_config(s3)["compile_cache"]["url"] == "s3://acme-neuron-cache/prod"
    assert "compile-cache" not in {v["name"] for v in serve_spec(s3)["volumes"]}
    node = golden.target("prompt-lookup")
    path = "/var/lib/neuronmodel/compile-cache"
    assert builders.runtime_config(node)["compile_cache"]["url"] == path
    spec = serve_spec(node)
    assert {"name": "compile-cache", "hostPath": {"path": path, "type": "DirectoryOrCreate"}} in spec["volumes"]
    assert {"name": "compile-cache", "mountPath": path} in spec["containers"][0]["volumeMounts"]


def test_one_rule_places_sources_for_config_and_pod():
    """Whatever the source, the path in the config lies under a mount of the runtime container (or is s3://)."""
    for case in CASES:
        t = golden.target(case)
        config = builders.runtime_config(t)
        spec = serve_spec(t)
        mounts = [m["mountPath"] for m in spec["containers"][0]["volumeMounts"]]
        cache = config["compile_cache"]["url"]
        if t.spec.engine == "vllm" and cache is not None:  # vLLM never mounts it: its fetch-artifacts does
            fetch = next(c for c in spec["initContainers"] if c["name"] == "fetch-artifacts")
            assert cache in fetch["command"] and "compile-cache" not in {m["name"] for m in
                                                                         spec["containers"][0]["volumeMounts"]}
            mounts += [m["mountPath"] for m in fetch["volumeMounts"]]
        for path in (config["model"], config["speculation"]["draft_model"], cache):
            if path is None or path.startswith("s3://"):
                continue
            assert any(path == m or path.startswith(m + "/") for m in mounts), (case, path)


@pytest.mark.parametrize("source, message", [
    ("pvc://store/../../etc", r"the path '\.\./\.\./etc' has an empty, '\.' or '\.\.' part"),
    ("/tmp", "/tmp"),
    ("/", "mounted over"),
    ("/models", "/models"),
])
def test_sources_that_would_break_the_pod_are_refused(source, message):
    with pytest.raises(SpecError, match=message):
        sources.source_mount(source, "model")


def test_pvc_claim_without_a_path_is_the_claim_root():
    assert sources.source_mount("pvc://store", "model").path == "/mnt/model"
    assert sources.source_mount("pvc://store/", "draft").path == "/mnt/draft"
    assert sources.source_mount("pvc://store/a/b/", "model").path == "/mnt/model/a/b"


# Placement and sizing

def _gib(quantity: str) -> int:
    assert quantity.endswith("Gi"), quantity
    return int(quantity.removesuffix("Gi"))


def test_partial_node_pods_ask_for_the_neuron_scheduler_extension():
    """More than one but not all of a node's NeuronCores (or devices): the extension's scheduler, on the serving
    and the compile pods alike (the Job's pod takes the same cores)."""
    scheduler = {f"{case} {where}": template["spec"].get("schedulerName") for case in CASES
                 for where, template in pod_templates(golden.children(case))}
    assert scheduler == {
        "tiny-torch Deployment": None,
        "inf2-hf Deployment": None,  # TP 2 on inf2.xlarge: the whole node
        "trn1-s3-cache Job": "my-scheduler", "trn1-s3-cache Deployment": "my-scheduler",  # 8 of 32
        "trn2-lnc-autoscale Job": "my-scheduler", "trn2-lnc-autoscale Deployment": "my-scheduler",  # spec's
        "draft-hf Deployment": "my-scheduler",  # 8 of 24
        "prompt-lookup Deployment": None,  # 2 of 2
        "multinode-lws Job": None, "multinode-lws LeaderWorkerSet.leaderTemplate": None,  # 32 of 32 per node
        "multinode-lws LeaderWorkerSet.workerTemplate": None,
        "whole-device Deployment": "my-scheduler",  # 2 of inf2.24xlarge's 6 devices
        "replicas-3 Deployment": None,  # one NeuronCore is always contiguous
        "trn2-dra Deployment": None,  # the DRA driver places the devices
        "vllm-trn2-eagle Job": "my-scheduler",  # 8 of 64: the same rule for engine vllm
        "vllm-trn2-eagle Deployment": "my-scheduler",
        "vllm-trn2-3xlarge Deployment": None,  # 4 of 4
        "vllm-inf2-nxdi Deployment": "my-scheduler",  # 8 of 24
        "vllm-trn1-autoscale Deployment": None,  # 32 of 32
    }
    custom = golden.target("inf2-hf", schedulerName="volcano")
    assert builders.deployment(custom)["spec"]["template"]["spec"]["schedulerName"] == "volcano"


def test_without_a_configured_neuron_scheduler_the_partial_model_says_why():
    off = dataclasses.replace(golden.DEFAULTS, neuron_scheduler_name=None)
    t = builders.target_from_body(golden.CASES["draft-hf"], off)
    assert "schedulerName" not in builders.deployment(t)["spec"]["template"]["spec"]
    (warning,) = t.resolved.warnings
    assert "contiguous" in warning and "--neuron-scheduler-name" in warning and "neuronSchedulerName" in warning


def test_runtime_requests_default_to_the_pods_share_of_its_node():
    # 8 of inf2.48xlarge's 24 NeuronCores: a third of the node (192 vCPU, 768 GiB) less the system's reserve
    requests = runtime_container(serving_template(golden.children("draft-hf")))["resources"]["requests"]
    cpu, memory = int(requests["cpu"].removesuffix("m")), int(requests["memory"].removesuffix("Mi"))
    assert 0.9 * 192_000 / 3 <= cpu <= (192_000 - 1000) / 3
    assert 0.9 * 768 * 1024 / 3 <= memory <= (768 - 2) * 1024 / 3
    assert requests["aws.amazon.com/neuroncore"] == "8"
    # a 70B model on a quarter of a trn1.32xlarge: the RAM it loads into (~163 GiB), more than its share (~123 GiB)
    big = golden.target("trn1-s3-cache", model={"source": "s3://acme-models/llama-70b", "parameters": "70B"})
    memory = runtime_container(builders.deployment(big)["spec"]["template"])["resources"]["requests"]["memory"]
    assert 70e9 * 2 * 1.25 / 2**20 <= int(memory.removesuffix("Mi")) + 1 < 512 * 1024 / 3
    # the torch runner: small; spec.resources wins key by key, a limit alone makes the request
    torch = runtime_container(serving_template(builders.serving_children(golden.target("tiny-torch", resources=None))))
    assert torch["resources"] == {"requests": {"cpu": "250m", "ephemeral-storage": "5Gi", "memory": "1Gi"}}
    own = golden.target("tiny-torch", resources={"requests": {"cpu": "2"}, "limits": {"memory": "3Gi"}})
    assert runtime_container(builders.deployment(own)["spec"]["template"])["resources"] == {
        "requests": {"cpu": "2", "ephemeral-storage": "5Gi"}, "limits": {"memory": "3Gi"}}


@pytest.mark.parametrize("case", CASES)
def test_every_empty_dir_is_size_limited_and_its_storage_requested(case):
    for where, template in pod_templates(golden.children(case)):
        spec = template["spec"]
        limits = {v["name"]: v["emptyDir"]["sizeLimit"] for v in spec["volumes"] if "emptyDir" in v}
        assert set(limits) >= {"shm", "tmp", "cache", "neuron-cache"}, where
        disk = sum(_gib(size) for name, v in limits.items() for size in [v] if name != "shm")
        requests = runtime_container(template)["resources"]["requests"]
        assert _gib(requests["ephemeral-storage"]) == disk, where
        for init in spec.get("initContainers", []) + spec["containers"]:
            # a download fills the models emptyDir (and /tmp); engine vllm's artifacts containers the cache emptyDir
            # (install-supervisor writes one file into /tmp, under the same requests: an init container's count only
            # as the largest of them)
            fills = {"fetch-artifacts": "cache", "store-artifacts": "cache",
                     "install-supervisor": "cache"}.get(init["name"], "models")
            if init["name"] != "runtime":
                assert _gib(init["resources"]["requests"]["ephemeral-storage"]) == \
                    _gib(limits[fills]) + _gib(limits["tmp"]), (where, init["name"])
        assert runtime_container(template)["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_storage_is_sized_from_the_parameter_count():
    model = {"source": "hf://meta-llama/Llama-3.3-70B-Instruct", "parameters": "70B"}
    sized = serve_spec(golden.target("inf2-hf", instanceType="inf2.48xlarge", model=model,
                                     parallelism={"tensorParallelDegree": 24}))
    limits = {v["name"]: _gib(v["emptyDir"]["sizeLimit"]) for v in sized["volumes"] if "emptyDir" in v}
    weights = 70e9 * 2 / 2**30  # bfloat16: ~130 GiB
    assert weights * 1.2 < limits["models"] <= weights * 1.2 + 2
    assert limits["neuron-cache"] > 0.25 * weights and limits["cache"] > 0.1 * weights
    default = {v["name"]: _gib(v["emptyDir"]["sizeLimit"]) for v in serve_spec(golden.target("inf2-hf"))["volumes"]
               if "emptyDir" in v}
    assert 16 * 1.2 < default["models"] < limits["models"]  # unset: sized for an 8B model
    pre_sharded = golden.target("trn1-s3-cache", compileCache={"url": "s3://acme-neuron-cache/prod",
                                                                "shardedWeights": True})
    cache = lambda t: next(v for v in serve_spec(t)["volumes"] if v["name"] == "cache")  # noqa: E731
    assert _gib(cache(pre_sharded)["emptyDir"]["sizeLimit"]) >= _gib(
        cache(golden.target("trn1-s3-cache"))["emptyDir"]["sizeLimit"]) + 16  # and the weights with them


def test_serving_replicas_spread_over_nodes_and_zones():
    spread = serving_template(golden.children("replicas-3"))["spec"]["topologySpreadConstraints"]
    labels = serving_template(golden.children("replicas-3"))["metadata"]["labels"]
    assert [(c["topologyKey"], c["whenUnsatisfiable"], c["maxSkew"]) for c in spread] == [
        ("kubernetes.io/hostname", "ScheduleAnyway", 1), ("topology.kubernetes.io/zone", "ScheduleAnyway", 1)]
    for constraint in spread:
        assert constraint["labelSelector"]["matchLabels"].items() <= labels.items()
    job = next(t for where, t in pod_templates(golden.children("trn1-s3-cache")) if where == "Job")
    assert "topologySpreadConstraints" not in job["spec"]
    for _, template in pod_templates(golden.children("multinode-lws")):  # a group stays together
        assert "topologySpreadConstraints" not in template["spec"]
