"""The operator's write guard (the chart's templates/rbac/write-guard.yaml) on the real API server: RBAC lets the
operator's ServiceAccount write ConfigMaps, Deployments, ... in every namespace; the guard limits it to the objects
it made, and to namespaces outside kube-system. Every other operator test runs under the same guard
(conftest.operator_rbac), so the operator itself needs no more than this."""

from __future__ import annotations

import pytest
from kubernetes import client as kube

from conftest import write_guard_manifests

OURS = {"app.kubernetes.io/managed-by": "neuronmodel-operator"}
OPERATOR = "system:serviceaccount:neuronmodel-system:neuronmodel-operator"


def refusal(call) -> str:
    with pytest.raises(kube.ApiException) as caught:
        call()
    assert caught.value.status == 403, caught.value.body
    return caught.value.body


def test_rbac_allows_kube_system_but_the_guard_refuses_it(operator_rbac, admin_client):
    review = {"spec": {"user": OPERATOR, "resourceAttributes": {
        "namespace": "kube-system", "verb": "create", "resource": "configmaps"}}}
    assert kube.AuthorizationV1Api(admin_client).create_subject_access_review(review).status.allowed
    core = kube.CoreV1Api(operator_rbac.client)
    body = {"metadata": {"name": "hijack", "labels": OURS}, "data": {"k": "v"}}
    message = refusal(lambda: core.create_namespaced_config_map("kube-system", body))
    assert "never writes in namespace kube-system" in message and "protectedNamespaces" in message
    apps = kube.AppsV1Api(operator_rbac.client)
    (coredns_like,) = [{"metadata": {"name": "dns", "labels": OURS}, "spec": {
        "selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {
            "containers": [{"name": "c", "image": "x"}]}}}}]
    assert "kube-system" in refusal(lambda: apps.create_namespaced_deployment("kube-system", coredns_like))


def test_objects_the_operator_did_not_make_are_out_of_its_reach(operator_rbac, admin_client, namespace):
    admin, guarded = kube.CoreV1Api(admin_client), kube.CoreV1Api(operator_rbac.client)
    admin.create_namespaced_config_map(namespace, {"metadata": {"name": "users"}, "data": {"k": "v"}})
    for attempt in (
        lambda: guarded.patch_namespaced_config_map("users", namespace, {"data": {"k": "stolen"}}),
        lambda: guarded.patch_namespaced_config_map("users", namespace, {"metadata": {"labels": OURS}}),
        lambda: guarded.delete_namespaced_config_map("users", namespace),
        lambda: guarded.create_namespaced_config_map(namespace, {"metadata": {"name": "unlabelled"}}),
    ):
        assert "is not one" in refusal(attempt)
    assert admin.read_namespaced_config_map("users", namespace).data == {"k": "v"}
    # the admin (anyone but the operator) is not affected
    admin.patch_namespaced_config_map("users", namespace, {"data": {"k": "admin"}})


def test_the_operator_writes_what_it_made(operator_rbac, namespace):
    guarded = kube.CoreV1Api(operator_rbac.client)
    guarded.create_namespaced_config_map(namespace, {"metadata": {"name": "mine", "labels": OURS}})
    guarded.patch_namespaced_config_map("mine", namespace, {"data": {"k": "v"}})
    # dropping its own label would take the object out of the guard's sight: refused too
    assert "is not one" in refusal(lambda: guarded.patch_namespaced_config_map(
        "mine", namespace, {"metadata": {"labels": {"app.kubernetes.io/managed-by": None}}}))
    guarded.delete_namespaced_config_map("mine", namespace)


def test_the_guard_follows_the_release_and_its_values():
    rendered = write_guard_manifests("ops", "custom-sa")
    assert 'request.userInfo.username == "system:serviceaccount:ops:custom-sa"' in rendered
    assert '["kube-system","kube-public","kube-node-lease"]' in rendered
