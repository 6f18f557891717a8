"""Ownership and admission on the real control plane, the operator under its chart's RBAC and write guard: an object
named like a child that the model does not own is left as it is (status and Event name it), survives the model's
deletion; a ValidatingAdmissionPolicy's denial is reported naming the policy, not RBAC. Unit tests with the in-memory
API server: tests/operator_tests/test_ownership.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client as kube

pytestmark = pytest.mark.slow

TINY = Path(__file__).resolve().parents[2] / "tests" / "assets" / "tiny" / "target"
TINY_SPEC = {"model": {"source": str(TINY)}, "framework": "torch", "replicas": 1}
OURS = {"app.kubernetes.io/managed-by": "neuronmodel-operator", "neuronmodel.dev/name": "api"}


def neuronmodel(name: str) -> dict:
    return {"apiVersion": "neuronmodel.dev/v1alpha1", "kind": "NeuronModel", "metadata": {"name": name},
            "spec": TINY_SPEC}


def ready(api, name: str, reason: str) -> dict:
    """The Ready condition once its reason is `reason`."""
    def reached():
        conditions = (api.get(name).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "Ready" and c["reason"] == reason), None)
    try:
        return api.wait_until(f"{name}: Ready {reason}", reached, 60)
    except TimeoutError:
        raise AssertionError(f"{name}: status {api.get(name).get('status')}") from None


@pytest.mark.parametrize("labels", [{}, OURS], ids=["unlabelled", "labelled-like-ours"])
def test_a_hand_made_service_named_like_the_model_is_never_taken_over(api, labels):
    """Unlabelled, the write guard would refuse the operator's write anyway (the status must say why, not send the
    user to RBAC); labelled like the operator's own children (a copied manifest), only the ownership check keeps
    the operator from replacing its selector and from taking it down with the model."""
    api.core.create_namespaced_service(api.ns, {
        "metadata": {"name": "api", "labels": labels},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 8000, "targetPort": 8080}]}})
    api.apply(neuronmodel("api"))
    condition = ready(api, "api", "AlreadyOwned")
    assert f"Service {api.ns}/api exists and is not this NeuronModel's" in condition["message"]
    assert "rename the NeuronModel, or delete or rename the Service" in condition["message"]
    assert api.get("api")["status"]["phase"] == "Failed"
    api.warning("api", "AlreadyOwned")
    service = api.core.read_namespaced_service("api", api.ns)
    assert service.spec.selector == {"app": "web"} and not service.metadata.owner_references
    assert api.deployment("api") is None  # nothing of the model was made meanwhile

    # deleted with the model? A sentinel the model owns shows when the garbage collector has handled the deletion
    uid = api.get("api")["metadata"]["uid"]
    api.core.create_namespaced_config_map(api.ns, {"metadata": {"name": "sentinel", "ownerReferences": [
        {"apiVersion": "neuronmodel.dev/v1alpha1", "kind": "NeuronModel", "name": "api", "uid": uid}]}})
    api.custom.delete_namespaced_custom_object("neuronmodel.dev", "v1alpha1", api.ns, "neuronmodels", "api")

    def collected() -> bool:
        try:
            api.core.read_namespaced_config_map("sentinel", api.ns)
        except kube.ApiException as exc:
            return exc.status == 404
        return False
    api.wait_until("the garbage collector deleted what the model owned", collected, 60)
    assert api.core.read_namespaced_service("api", api.ns).spec.selector == {"app": "web"}


@pytest.fixture
def services_denied(admin_client, namespace, wait_until):
    """A ValidatingAdmissionPolicy that refuses every Service created in the test's namespace (a platform team's
    rule), enforced before the test starts; removed after it."""
    admission = kube.AdmissionregistrationV1Api(admin_client)
    name = f"no-services-{namespace}"
    admission.create_validating_admission_policy({
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                         "operations": ["CREATE"], "resources": ["services"]}]},
                 "validations": [{"expression": "false", "reason": "Forbidden",
                                  "message": "Services here are made by the platform team"}]}})
    admission.create_validating_admission_policy_binding({
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"], "matchResources": {"namespaceSelector": {
            "matchLabels": {"kubernetes.io/metadata.name": namespace}}}}})
    core = kube.CoreV1Api(admin_client)

    def enforced() -> bool:
        try:
            core.create_namespaced_service(namespace, {"metadata": {"generateName": "probe-"},
                                                       "spec": {"ports": [{"port": 80}]}}, dry_run="All")
        except kube.ApiException as exc:
            return exc.status == 403 and name in (exc.body or "")
        return False
    wait_until("the policy enforced", enforced)
    yield name
    admission.delete_validating_admission_policy_binding(name)
    admission.delete_validating_admission_policy(name)


def test_an_admission_policy_denial_names_the_policy_not_rbac(api, services_denied):
    api.apply(neuronmodel("denied"))
    condition = ready(api, "denied", "AdmissionDenied")
    message = condition["message"]
    assert message.startswith(f"ValidatingAdmissionPolicy '{services_denied}' (binding '{services_denied}') refused "
                              "a child of this NeuronModel (an admission policy, not the operator's RBAC)")
    assert "Services here are made by the platform team" in message
    assert "RBAC against" not in message and not (api.get("denied")["status"].get("warnings"))
    api.warning("denied", "AdmissionDenied")
