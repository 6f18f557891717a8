"""The operator on the real control plane, as its own ServiceAccount with exactly rbac/operator-rules.yaml.

kwok acts as the kubelet of the fake Neuron nodes: pods it schedules become Running and Ready, and pods of Jobs
complete, so a NeuronModel goes all the way to Ready (or stays Pending when no node has the NeuronCores).
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from kubernetes import client as kube

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "crds" / "samples"
TINY = ROOT / "tests" / "assets" / "tiny" / "target"
GROUP, VERSION, PLURAL = "neuronmodel.dev", "v1alpha1", "neuronmodels"  # as in conftest.Api


def sample(name: str) -> dict:
    body = yaml.safe_load((SAMPLES / f"{name}.yaml").read_text())
    if body["spec"]["model"]["source"].startswith("/"):
        body["spec"]["model"]["source"] = str(TINY)  # the tiny model, where this checkout has it
    return body


def neuronmodel(name: str, spec: dict) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "NeuronModel", "metadata": {"name": name}, "spec": spec}


def mounted_config_map(deployment) -> str:
    """The runtime ConfigMap (content-named, `<name>-runtime-<hash>`) a Deployment's pods mount."""
    return next(v.config_map.name for v in deployment.spec.template.spec.volumes if v.config_map)


TINY_SPEC = {"model": {"source": str(TINY)}, "framework": "torch", "replicas": 1,
             "batching": {"maxBatchSize": 2, "maxContextLength": 128, "maxSeqLen": 256}}


def test_tiny_sample_becomes_ready_with_its_children(api, operator):
    api.apply(sample("tiny-torch"))
    name = sample("tiny-torch")["metadata"]["name"]
    body = api.phase(name, "Ready")
    uid = body["metadata"]["uid"]
    status = body["status"]
    assert status["endpoint"] == f"http://{name}.{api.ns}.svc.cluster.local:8000"
    assert status["readyReplicas"] == 1 and status["replicas"] == 1 and status["ready"] == "1/1"
    assert status["observedGeneration"] == body["metadata"]["generation"]
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "ArtifactsReady": "True", "Available": "True", "Progressing": "True", "Ready": "True"}
    assert status["resolved"]["framework"] == "torch"
    children = [api.apps.read_namespaced_deployment(name, api.ns), api.core.read_namespaced_service(name, api.ns),
                api.core.read_namespaced_config_map(mounted_config_map(api.deployment(name)), api.ns)]
    for child in children:
        (ref,) = child.metadata.owner_references
        assert (ref.kind, ref.name, ref.uid, ref.controller) == ("NeuronModel", name, uid, True)
        assert child.metadata.labels["neuronmodel.dev/name"] == name
        assert child.metadata.labels["app.kubernetes.io/managed-by"] == "neuronmodel-operator"
        assert child.metadata.managed_fields[0].manager == "neuronmodel-operator"
    assert any(e.reason == "Ready" for e in api.events(name))

    table = api.plane.kubectl("get", "nm", "-n", api.ns).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "ENGINE", "FRAMEWORK", "TP", "READY", "ENDPOINT", "AGE"]
    assert table[1].split()[:7] == [name, "Ready", "neuronmodel", "torch", "1", "1/1", status["endpoint"]]

    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5) as response:
        scraped = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                   for line in response.read().decode().splitlines() if line and not line.startswith("#")}
    assert scraped['neuronmodel_operator_models{phase="Ready"}'] >= 1
    assert scraped['neuronmodel_operator_reconciles_total{result="ok"}'] >= 1


def claim(api, name: str) -> None:
    """A PersistentVolumeClaim bound to a hostPath PersistentVolume of its own (the scheduler waits for unbound
    claims)."""
    volume = f"{api.ns}-{name}"
    api.core.create_persistent_volume({
        "metadata": {"name": volume}, "spec": {
            "capacity": {"storage": "1Ti"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
            "hostPath": {"path": f"/tmp/{volume}"}, "persistentVolumeReclaimPolicy": "Delete",
            "claimRef": {"namespace": api.ns, "name": name}}})
    api.core.create_namespaced_persistent_volume_claim(api.ns, {
        "metadata": {"name": name}, "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                                             "volumeName": volume, "resources": {"requests": {"storage": "1Ti"}}}})


@pytest.mark.parametrize("name", sorted(p.stem for p in SAMPLES.glob("*.yaml")))
def test_every_sample_gets_its_children(api, name):
    body = sample(name)
    spec = body["spec"]
    if "serviceAccountName" in spec:  # what a user creates first (IRSA for s3:// caches)
        api.core.create_namespaced_service_account(api.ns, {"metadata": {"name": spec["serviceAccountName"]}})
    for source in (spec["model"]["source"], spec.get("compileCache", {}).get("url") or ""):
        if source.startswith("pvc://"):  # and the claims, bound to a volume
            claim(api, source.removeprefix("pvc://").split("/")[0])
    api.apply(body)
    model = body["metadata"]["name"]
    multinode = spec.get("parallelism", {}).get("nodes", 1) > 1
    # 60 s were once not enough for a compiling sample on a machine busy with three suites: its status and Events
    # say where it waited if it happens again
    api.wait_until("the serving workload", lambda: api.custom.list_namespaced_custom_object(
        "leaderworkerset.x-k8s.io", "v1", api.ns, "leaderworkersets")["items"] if multinode
        else api.deployment(model), 120,
        diagnose=lambda: f"status {api.get(model).get('status')}\nevents "
                         f"{[(e.reason, e.message) for e in api.events(model)]}\n"
                         f"jobs {[(j.metadata.name, j.status) for j in api.batch.list_namespaced_job(api.ns).items]}")
    # the children of one reconcile are applied at once: wait for each
    service = api.wait_until("the Service", lambda: next(
        iter(api.core.list_namespaced_service(api.ns, field_selector=f"metadata.name={model}").items), None), 10)
    assert service.spec.ports[0].port == 8000
    config = api.wait_until("the ConfigMap", lambda: next((c for c in api.core.list_namespaced_config_map(
        api.ns, label_selector="app.kubernetes.io/component=server").items
        if c.metadata.name.startswith(f"{model}-runtime-")), None), 10)
    assert config.data["config.json"]
    jobs = api.batch.list_namespaced_job(api.ns).items
    compiles = spec.get("compileCache", {}).get("url") and spec["compileCache"].get("policy") != "Never"
    assert len(jobs) == (1 if compiles else 0)
    autoscaling = kube.AutoscalingV2Api(api.apps.api_client)
    if "autoscaling" in spec:  # applied right after the workload
        api.wait_until("the HPA", lambda: autoscaling.list_namespaced_horizontal_pod_autoscaler(api.ns).items, 10)
    else:
        assert not autoscaling.list_namespaced_horizontal_pod_autoscaler(api.ns).items
    status = api.wait_until("a status", lambda: api.get(model).get("status", {}).get("phase"))
    assert status in ("Pending", "Compiling", "Loading", "Ready", "Degraded")


def test_scale_subresource_scales_the_deployment(api, wait_until):
    api.apply(neuronmodel("scaled", TINY_SPEC))
    api.phase("scaled", "Ready")
    api.plane.kubectl("scale", "nm", "scaled", "-n", api.ns, "--replicas=3")
    wait_until("3 ready", lambda: api.get("scaled")["status"].get("readyReplicas") == 3, 60)
    assert api.deployment("scaled").spec.replicas == 3
    scale = api.custom.get_namespaced_custom_object_scale(GROUP, VERSION, api.ns, PLURAL, "scaled")
    assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3
    assert scale["status"]["selector"] == "app.kubernetes.io/component=server,neuronmodel.dev/name=scaled"
    pdb = kube.PolicyV1Api(api.apps.api_client).read_namespaced_pod_disruption_budget("scaled", api.ns)
    assert pdb.spec.max_unavailable == 1
    api.plane.kubectl("scale", "nm", "scaled", "-n", api.ns, "--replicas=1")
    wait_until("the PDB goes with one replica", lambda: not kube.PolicyV1Api(api.apps.api_client)
               .list_namespaced_pod_disruption_budget(api.ns).items, 30)


def test_a_replicas_change_rolls_nothing(api, wait_until):
    api.apply(neuronmodel("steady", TINY_SPEC))
    api.phase("steady", "Ready")
    before = api.deployment("steady")
    api.patch("steady", {"replicas": 2})
    wait_until("2 ready", lambda: api.get("steady")["status"].get("readyReplicas") == 2, 60)
    after = api.deployment("steady")
    assert after.spec.template == before.spec.template
    assert len(api.apps.list_namespaced_replica_set(api.ns).items) == 1  # no rollout: one ReplicaSet


def test_a_deleted_or_edited_child_is_restored(api, wait_until):
    api.apply(neuronmodel("drift", TINY_SPEC))
    api.phase("drift", "Ready")
    old = api.deployment("drift")
    api.apps.delete_namespaced_deployment("drift", api.ns)
    new = wait_until("the Deployment back", lambda: (d := api.deployment("drift")) and
                     d.metadata.uid != old.metadata.uid and d, 30)
    assert new.spec.template.spec.containers[0].image == old.spec.template.spec.containers[0].image

    api.apps.patch_namespaced_deployment("drift", api.ns, {"spec": {"template": {"spec": {"containers": [
        {"name": "runtime", "image": "someone/else:latest"}]}}}})
    wait_until("the image restored", lambda: api.deployment("drift").spec.template.spec.containers[0].image
               == old.spec.template.spec.containers[0].image, 30)

    api.core.delete_namespaced_service("drift", api.ns)
    wait_until("the Service back", lambda: api.core.list_namespaced_service(api.ns).items, 30)
    config_map = mounted_config_map(new)
    api.core.delete_namespaced_config_map(config_map, api.ns)
    wait_until("the ConfigMap back", lambda: any(
        c.metadata.name == config_map for c in api.core.list_namespaced_config_map(api.ns).items), 30)


def test_deleting_a_model_collects_its_children(api, wait_until):
    api.apply(neuronmodel("gone", TINY_SPEC))
    api.phase("gone", "Ready")
    assert not api.get("gone")["metadata"].get("finalizers")
    api.custom.delete_namespaced_custom_object(GROUP, VERSION, api.ns, PLURAL, "gone")
    wait_until("children garbage-collected", lambda: api.deployment("gone") is None and not any(
        s.metadata.name == "gone" for s in api.core.list_namespaced_service(api.ns).items), 60)


def test_delete_never_hangs_while_the_operator_is_down(api, operator, wait_until):
    api.apply(neuronmodel("orphan", TINY_SPEC))
    api.phase("orphan", "Ready")
    operator.stop()
    try:
        api.custom.delete_namespaced_custom_object(GROUP, VERSION, api.ns, PLURAL, "orphan")
        wait_until("the NeuronModel gone with no operator", lambda: not api.custom.list_namespaced_custom_object(
            GROUP, VERSION, api.ns, PLURAL)["items"], 15)
    finally:
        operator.start()


def test_a_spec_cel_cannot_catch_fails_once_without_a_hot_loop(api):
    # TP 256 on one node passes CEL when no instanceType is given; no Neuron instance holds it.
    api.apply(neuronmodel("huge", {"model": {"source": "hf://org/huge"}, "framework": "nxdi", "replicas": 1,
                                   "parallelism": {"tensorParallelDegree": 256}}))
    body = api.phase("huge", "Failed")
    ready = next(c for c in body["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and "256 NeuronCores" in ready["message"] and "nodes" in ready["message"]
    time.sleep(6)  # longer than any retry delay
    warnings = [e for e in api.events("huge") if e.type == "Warning"]
    assert len(warnings) == 1 and warnings[0].reason == "InvalidSpec"
    assert api.deployment("huge") is None
    # fixing the spec is picked up
    api.patch("huge", {"parallelism": {"tensorParallelDegree": 2}, "instanceType": "inf2.48xlarge"})
    api.phase("huge", "Ready")


def test_unschedulable_pods_are_explained(api):
    api.apply(neuronmodel("nowhere", {**TINY_SPEC, "nodeSelector": {"example.com/no-such-node": "true"}}))
    api.phase("nowhere", "Pending")

    def ready_condition():  # Pending says "Scheduling" until the scheduler has tried the pod once
        ready = next(c for c in api.get("nowhere")["status"]["conditions"] if c["type"] == "Ready")
        return ready if ready["reason"] != "Scheduling" else None
    ready = api.wait_until("the scheduler's verdict", ready_condition, 30)
    assert ready["reason"] == "Unschedulable" and "node" in ready["message"]
    # the Warning Event follows the status patch (the operator posts it after the status it explains)
    api.warning("nowhere", "Unschedulable")

    # one trn2.48xlarge node with 64 NeuronCores: the second TP-64 replica finds none free
    api.apply(neuronmodel("toobig", {**TINY_SPEC, "framework": "nxdi", "instanceType": "trn2.48xlarge",
                                     "parallelism": {"tensorParallelDegree": 64}, "replicas": 2}))
    body = api.phase("toobig", "Degraded")
    assert body["status"]["readyReplicas"] == 1 and body["status"]["replicas"] == 2
    assert body["status"]["ready"] == "1/2"


def test_a_compile_key_change_compiles_before_it_rolls(api, wait_until):
    # inf2.xlarge has 2 NeuronCores: while the serving pod holds them, the new key's compile Job cannot run.
    spec = {"model": {"source": "s3://models/tiny"}, "framework": "nxdi", "instanceType": "inf2.xlarge",
            "parallelism": {"tensorParallelDegree": 2}, "replicas": 1,
            "compileCache": {"url": "s3://neuron-cache/artifacts", "policy": "IfNotCached"}}
    api.apply(neuronmodel("gated", spec))
    first_job = wait_until("the compile Job", lambda: api.batch.list_namespaced_job(api.ns).items, 30)[0]
    assert api.deployment("gated") is None or first_job.status.succeeded  # nothing serves before artifacts
    body = api.phase("gated", "Ready")
    assert next(c for c in body["status"]["conditions"] if c["type"] == "ArtifactsReady")["reason"] == "Compiled"
    served = api.deployment("gated").spec.template

    api.patch("gated", {"batching": {"maxSeqLen": 4096}})  # a new compile key
    new_key = wait_until("a new compile key", lambda: (k := api.get("gated")["status"]["resolved"]["compileKey"])
                         != body["status"]["resolved"]["compileKey"] and k, 30)
    body = api.phase("gated", "Compiling")
    assert {c["type"]: c["status"] for c in body["status"]["conditions"]}["Available"] == "True"
    time.sleep(3)
    assert api.deployment("gated").spec.template == served  # held: the old pods keep serving

    api.patch("gated", {"replicas": 0})  # frees the NeuronCores: the Job runs, then the new spec rolls
    wait_until("the new key's Job done", lambda: any(
        j.status.succeeded and j.metadata.annotations["neuronmodel.dev/compile-key"] == new_key
        for j in api.batch.list_namespaced_job(api.ns).items), 60)
    wait_until("the Deployment rolled", lambda: api.deployment("gated").spec.template.metadata.annotations[
        "neuronmodel.dev/compile-key"] == new_key, 30)
    wait_until("the old key's Job deleted", lambda: len(api.batch.list_namespaced_job(api.ns).items) == 1, 30)


def test_secrets_stay_secret(api, operator, operator_rbac, wait_until):
    token, key = "hf_tok_0123456789abcdef", "sk-api-key-fedcba9876543210"
    for name, value in (("hf-token", token), ("api-key", key)):
        api.core.create_namespaced_secret(api.ns, {"metadata": {"name": name}, "stringData": {"token": value}})
    api.apply(neuronmodel("private", {
        # a private repository: the operator never reads the token, so the spec names the commit it serves
        "model": {"source": "hf://org/private", "revision": "0e9e39f249a16976918f6564b8830bc894c89659",
                  "tokenSecretRef": {"name": "hf-token"}}, "framework": "nxdi",
        "instanceType": "inf2.48xlarge", "parallelism": {"tensorParallelDegree": 2}, "replicas": 1,
        "server": {"apiKeySecretRef": {"name": "api-key"}}}))
    api.phase("private", "Ready")
    template = api.deployment("private").spec.template.spec
    runtime_env = {e.name: e for e in template.containers[0].env}
    assert runtime_env["NEURONMODEL_API_KEY"].value_from.secret_key_ref.name == "api-key"
    (fetch,) = template.init_containers
    assert {e.name: e for e in fetch.env}["HF_TOKEN"].value_from.secret_key_ref.name == "hf-token"
    config = api.core.read_namespaced_config_map(mounted_config_map(api.deployment("private")), api.ns) \
        .data["config.json"]
    assert key not in config and token not in config
    log = operator.log.read_text()
    assert "private" in log and key not in log and token not in log
    # the operator's ServiceAccount cannot read them at all
    review = {"spec": {"user": "system:serviceaccount:neuronmodel-system:neuronmodel-operator",
                       "resourceAttributes": {"namespace": api.ns, "verb": "get", "resource": "secrets"}}}
    assert not kube.AuthorizationV1Api(api.apps.api_client).create_subject_access_review(review).status.allowed
