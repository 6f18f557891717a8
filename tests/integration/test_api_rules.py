"""The API server rules the operator's reconcile is built around, on the real control plane (test_reconcile.py's
FakeKube models the same rules): a Job's pod template and an immutable ConfigMap's data cannot change (422), and
server-side apply resets spec.replicas that its sole manager stops setting, unless another manager holds it."""

from __future__ import annotations

import uuid

import pytest

from neuronmodel_operator import api as nm
from neuronmodel_operator.k8s import KINDS, ApiError, Kind, Kube

pytestmark = pytest.mark.slow


@pytest.fixture
def kube(admin_client, namespace) -> Kube:
    return Kube(admin_client)


def _job(namespace: str, memory: str) -> dict:
    container = {"name": "c", "image": "busybox", "command": ["true"], "resources": {"requests": {"memory": memory}}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": namespace},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [container]}}}}


def test_a_job_template_and_immutable_config_map_data_cannot_change(kube, namespace):
    kube.apply(_job(namespace, "1Gi"))
    with pytest.raises(ApiError) as refused:
        kube.apply(_job(namespace, "2Gi"))
    assert refused.value.status == 422 and "field is immutable" in refused.value.message
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": namespace},
              "immutable": True, "data": {"a": "1"}}
    kube.apply(config)
    with pytest.raises(ApiError) as refused:
        kube.apply({**config, "data": {"a": "2"}})
    assert refused.value.status == 422


def _deployment(namespace: str, replicas: int | None) -> dict:
    spec = {"selector": {"matchLabels": {"app": "d"}}, "template": {
        "metadata": {"labels": {"app": "d"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
    if replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": namespace},
            "spec": spec}


def test_replicas_a_sole_manager_omits_are_reset_unless_handed_over(kube, namespace):
    kube.apply(_deployment(namespace, 3))
    assert kube.apply(_deployment(namespace, None))["spec"]["replicas"] == 1
    kube.apply(_deployment(namespace, 3))
    kube.apply({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": namespace},
                "spec": {"replicas": 3}}, field_manager=nm.HANDOVER_FIELD_MANAGER)
    assert kube.apply(_deployment(namespace, None))["spec"]["replicas"] == 3


def test_a_create_in_a_namespace_being_deleted_is_a_403_marked_namespace_terminating(kube, admin_client,
                                                                                     wait_until):
    """The operator tells this 403 from RBAC drift by its cause (handlers.Reconciler neither retries nor reports
    it): the real API server's refusal carries it, an RBAC refusal does not."""
    from kubernetes import client

    core = client.CoreV1Api(admin_client)
    name = f"t-ending-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    held = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "held", "namespace": name, "finalizers": ["neuronmodel.test/hold"]}}
    kube.apply(held)
    try:
        core.delete_namespace(name)
        wait_until("the namespace terminating", lambda: core.read_namespace(name).status.phase == "Terminating")
        with pytest.raises(ApiError) as refused:
            kube.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "new", "namespace": name}})
        assert refused.value.status == 403 and refused.value.namespace_terminating
    finally:
        core.patch_namespaced_config_map("held", name, {"metadata": {"finalizers": None}})
    other = ApiError(403, 'configmaps is forbidden: User "x" cannot create resource "configmaps"')
    assert not other.namespace_terminating


def test_an_apply_whose_api_is_not_served_is_an_error_naming_it(kube, namespace, monkeypatch):
    """Apply creates what is missing, so its 404 is the API itself missing (the LeaderWorkerSet CRD not installed):
    an error that says what to install, never a success with nothing applied. (This cluster has LWS installed: the
    kind points at a group nobody serves.)"""
    monkeypatch.setitem(KINDS, "LeaderWorkerSet", Kind("/apis/leaderworkerset.example.com/v1", "leaderworkersets"))
    lws = {"apiVersion": "leaderworkerset.example.com/v1", "kind": "LeaderWorkerSet",
           "metadata": {"name": "g", "namespace": namespace}, "spec": {}}
    with pytest.raises(ApiError) as missing:
        kube.apply(lws)
    assert missing.value.status == 404 and not missing.value.retryable
    assert "is not served by this cluster" in missing.value.message
    assert "install LeaderWorkerSet" in missing.value.message and "404 page not found" in missing.value.message
    assert kube.get("LeaderWorkerSet", namespace, "g") is None
