"""The local control plane is real: controllers, scheduler, kwok nodes, RBAC, GC, CRDs, kubectl and Helm."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from kubernetes import client as kube
from kubernetes.client.exceptions import ApiException

from k8s import install, nodes

pytestmark = pytest.mark.slow  # the session's control plane takes ~10 s to start

CHART = Path(__file__).parent / "fixtures" / "demo-chart"
TOLERATION = {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"}


def _pod_spec(neuron_cores: int, tolerate: bool = True, node_selector: dict | None = None) -> dict:
    return {
        "containers": [{"name": "main", "image": "busybox",
                        "resources": {"limits": {"aws.amazon.com/neuroncore": str(neuron_cores)}}}],
        "tolerations": [TOLERATION] if tolerate else [],
        "nodeSelector": node_selector or {},
    }


def test_fake_nodes_are_shaped_like_eks_neuron_nodes(admin_client):
    by_type = {n.metadata.labels["node.kubernetes.io/instance-type"]: n
               for n in kube.CoreV1Api(admin_client).list_node(label_selector=nodes.KWOK_SELECTOR).items}
    assert set(by_type) == {"inf2.xlarge", "inf2.48xlarge", "trn1.32xlarge", "trn2.48xlarge", "m5.xlarge"}
    trn2 = by_type["trn2.48xlarge"]
    assert trn2.status.allocatable["aws.amazon.com/neuron"] == "16"
    assert trn2.status.allocatable["aws.amazon.com/neuroncore"] == "64"
    assert trn2.metadata.labels["karpenter.k8s.aws/instance-family"] == "trn2"
    assert [(t.key, t.value, t.effect) for t in trn2.spec.taints] == [("aws.amazon.com/neuron", "true", "NoSchedule")]
    assert not by_type["m5.xlarge"].spec.taints
    assert "aws.amazon.com/neuron" not in by_type["m5.xlarge"].status.allocatable


def test_deployment_pods_are_scheduled_onto_inf2_and_become_ready(admin_client, namespace, wait_until):
    apps, core = kube.AppsV1Api(admin_client), kube.CoreV1Api(admin_client)
    labels = {"app": "neuron-demo"}
    spec = _pod_spec(1, node_selector={"karpenter.k8s.aws/instance-family": "inf2"})
    apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": "neuron-demo"},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": spec}}})

    deployment = wait_until("2 ready replicas", lambda: (
        d := apps.read_namespaced_deployment("neuron-demo", namespace)).status.ready_replicas == 2 and d)
    (replica_set,) = apps.list_namespaced_replica_set(namespace).items
    assert replica_set.metadata.owner_references[0].uid == deployment.metadata.uid
    pods = core.list_namespaced_pod(namespace).items
    assert len(pods) == 2
    inf2_nodes = {nodes.node_name("inf2.xlarge"), nodes.node_name("inf2.48xlarge")}
    for pod in pods:
        assert pod.metadata.owner_references[0].uid == replica_set.metadata.uid
        assert pod.spec.node_name in inf2_nodes
        assert pod.status.phase == "Running"
        assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "True"


@pytest.mark.parametrize(("cores", "tolerate", "reason"), [
    (65, True, "Insufficient aws.amazon.com/neuroncore"),  # the largest node (trn2.48xlarge) has 64
    (1, False, "untolerated taint"),
])
def test_unschedulable_pod_stays_pending_with_an_event(admin_client, namespace, wait_until, cores, tolerate, reason):
    core = kube.CoreV1Api(admin_client)
    core.create_namespaced_pod(namespace, {"metadata": {"name": "too-big"}, "spec": _pod_spec(cores, tolerate)})

    event = wait_until("FailedScheduling event", lambda: next(iter(core.list_namespaced_event(
        namespace, field_selector="involvedObject.name=too-big,reason=FailedScheduling").items), None))
    assert reason in event.message
    pod = core.read_namespaced_pod("too-big", namespace)
    assert pod.status.phase == "Pending" and pod.spec.node_name is None


def test_rbac_denies_a_service_account_until_a_role_allows_it(control_plane, namespace, service_account):
    nobody = service_account(namespace, "nobody")
    with pytest.raises(ApiException) as denied:
        kube.CoreV1Api(nobody.client).list_namespaced_pod(namespace)
    assert denied.value.status == 403

    reader = service_account(namespace, "reader", rules=[
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}])
    assert kube.CoreV1Api(reader.client).list_namespaced_pod(namespace).items == []
    with pytest.raises(ApiException) as denied:
        kube.CoreV1Api(reader.client).list_namespaced_secret(namespace)
    assert denied.value.status == 403
    can_i = control_plane.kubectl(f"--kubeconfig={reader.kubeconfig}", "auth", "can-i", "delete", "pods",
                                  "-n", namespace, check=False)
    assert can_i.stdout.strip() == "no"


def test_deleting_an_owner_garbage_collects_its_dependents(admin_client, namespace, wait_until):
    core = kube.CoreV1Api(admin_client)
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "dependent", "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}]}})

    core.delete_namespaced_config_map("owner", namespace)
    wait_until("dependent to be collected", lambda: not [
        cm for cm in core.list_namespaced_config_map(namespace).items if cm.metadata.name == "dependent"])


def test_crds_install_by_server_side_apply_and_validate(control_plane, namespace, install_crds):
    install_crds(install.lws_crd())
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
           "metadata": {"name": "lws", "namespace": namespace},
           "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2, "workerTemplate": {
               "spec": {"containers": [{"name": "w", "image": "busybox"}]}}}}}
    control_plane.kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(lws))
    lws["spec"]["leaderWorkerTemplate"]["size"] = "two"
    rejected = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(lws), check=False)
    assert rejected.returncode != 0 and "size" in rejected.stderr


def test_leaderworkerset_controller_runs_leader_and_worker_pods(admin_client, namespace, wait_until):
    custom, core = kube.CustomObjectsApi(admin_client), kube.CoreV1Api(admin_client)
    template = {"spec": _pod_spec(16, node_selector={"node.kubernetes.io/instance-type": "trn1.32xlarge"})}
    lws_api = ("leaderworkerset.x-k8s.io", "v1", namespace, "leaderworkersets")
    custom.create_namespaced_custom_object(*lws_api, {
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": {"name": "lws"},
        "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2, "workerTemplate": template}}})

    def running_pods():
        pods = core.list_namespaced_pod(namespace, label_selector="leaderworkerset.sigs.k8s.io/name=lws").items
        return len(pods) == 2 and all(pod.status.phase == "Running" for pod in pods) and pods

    pods = wait_until("leader and worker pods Running", running_pods)
    assert sorted(pod.metadata.labels["leaderworkerset.sigs.k8s.io/worker-index"] for pod in pods) == ["0", "1"]
    assert {pod.spec.node_name for pod in pods} == {nodes.node_name("trn1.32xlarge")}  # 2 x 16 of its 32 cores
    wait_until("LWS readyReplicas == 1", lambda: custom.get_namespaced_custom_object(
        *lws_api, "lws").get("status", {}).get("readyReplicas") == 1)


def test_kubectl_reports_the_pinned_server_version(control_plane):
    versions = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    assert versions["serverVersion"]["gitVersion"] == install.K8S_VERSION
    assert versions["clientVersion"]["minor"] == versions["serverVersion"]["minor"]


@pytest.mark.parametrize(("helm", "major"), [("helm", "v4."), ("helm3", "v3.")])
def test_helm_renders_a_chart_the_server_accepts(control_plane, namespace, tmp_path, helm, major):
    env = {**os.environ, "KUBECONFIG": str(control_plane.kubeconfig), "HELM_CACHE_HOME": str(tmp_path / "cache"),
           "HELM_CONFIG_HOME": str(tmp_path / "config"), "HELM_DATA_HOME": str(tmp_path / "data")}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(install.bin_dir() / helm), *args], env=env, capture_output=True, text=True,
                              timeout=120)

    assert run("version", "--short").stdout.startswith(major)
    rendered = run("template", "demo", str(CHART), "-n", namespace)
    assert rendered.returncode == 0, rendered.stderr
    applied = control_plane.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=rendered.stdout)
    assert applied.stdout.count("(server dry run)") == 3
    # Helm asks the server for its version to check the chart's kubeVersion constraint.
    installed = run("install", "demo", str(CHART), "-n", namespace, "--dry-run=server")
    assert installed.returncode == 0, installed.stderr

    bad = run("template", "demo", str(CHART), "-n", namespace, "--set", "replicaCount=two")
    rejected = control_plane.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=bad.stdout,
                                     check=False)
    assert rejected.returncode != 0 and "replicas" in rejected.stderr
