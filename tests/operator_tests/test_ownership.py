"""Ownership (ownership.py, reconcile.Reconcile._claim) against the in-memory API server of test_reconcile.py: an
object named like a child that is not this NeuronModel's is never written (a forced server-side apply would take it
over), the status and a Warning Event name it and the fix; and admission denials are told apart from RBAC. The same on
the real API server: tests/integration/test_ownership.py."""

from __future__ import annotations

import copy

import pytest
from operator_tests.test_reconcile import (DEFAULTS, NAME, NS, TORCH, UID, FakeKube, body,  # noqa: F401
                                           kube, reconcile)  # kube and reconcile: the fixtures, shared

from neuronmodel_operator import ownership
from neuronmodel_operator.k8s import ApiError
from neuronmodel_operator.reconcile import Outcome, Reconcile

HAND_MADE = {"apiVersion": "v1", "kind": "Service", "metadata": {
    "name": NAME, "namespace": NS, "managedFields": [{"manager": "kubectl-create", "operation": "Update"}]},
    "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}}
#: What the API server answers for each kind of 403 (the messages tests/integration/test_ownership.py reads).
RBAC_403 = ('services "llama" is forbidden: User "system:serviceaccount:neuronmodel-system:neuronmodel-operator" '
            'cannot patch resource "services" in API group "" in the namespace "team"')
VAP_403 = ("services \"llama\" is forbidden: ValidatingAdmissionPolicy 'no-services' with binding 'no-services' "
           "denied request: Services here are made by the platform team")
WEBHOOK_403 = ('admission webhook "validation.gatekeeper.sh" denied the request: [no-lb] Services of type '
               'LoadBalancer are not allowed')


def ready_condition(kube: FakeKube) -> dict:
    return next(c for c in kube.model()["status"]["conditions"] if c["type"] == "Ready")


def test_a_hand_made_service_named_like_the_model_is_left_untouched_and_named_in_the_status(kube, reconcile):
    kube.put(body(TORCH))
    kube.put(HAND_MADE)
    outcome = reconcile(NS, NAME, cleanup=False)
    assert outcome.child_error and not outcome.spec_error  # retried with backoff
    assert kube.children() == {("Service", NAME): HAND_MADE}  # its selector kept, no ownerReference added
    assert kube.applied == []  # nothing was written: not the Deployment either
    status = kube.model()["status"]
    ready = ready_condition(kube)
    assert status["phase"] == "Failed" and ready["reason"] == "AlreadyOwned"
    assert f"Service {NS}/{NAME} exists and is not this NeuronModel's" in ready["message"]
    assert "kubectl-create" in ready["message"]
    assert "rename the NeuronModel, or delete or rename the Service" in ready["message"]
    assert [(t, r) for t, r, _ in kube.events] == [("Warning", "AlreadyOwned")]
    kube.delete("Service", NS, NAME)  # the user moves theirs away: the retry serves
    assert reconcile(NS, NAME, cleanup=False) == Outcome()
    assert kube.kinds() == ["ConfigMap", "Deployment", "Service"]
    assert kube.one("Service")["metadata"]["ownerReferences"][0]["uid"] == UID


def test_a_child_of_another_owner_is_refused_naming_it(kube, reconcile):
    kube.put(body(TORCH))
    kube.put({**HAND_MADE, "metadata": {**HAND_MADE["metadata"], "ownerReferences": [
        {"kind": "HelmRelease", "name": "web", "uid": "other", "controller": True}]}})
    reconcile(NS, NAME, cleanup=False)
    assert "its controller is HelmRelease web" in ready_condition(kube)["message"]


def test_the_check_reads_each_child_once_per_process(kube, reconcile):
    """One GET per child of a fixed name on the first reconcile (none for the content-named runtime ConfigMap);
    none afterwards: what this process applied is known to be the model's. A child that was deleted is read again
    before it is restored (someone else's may have taken its name)."""
    kube.put(body(TORCH))
    reconcile(NS, NAME, cleanup=False, body=kube.model())
    assert sorted(kube.got) == [("Deployment", NAME), ("Service", NAME)]
    kube.got.clear()
    reconcile(NS, NAME, cleanup=False, body=kube.model())
    assert kube.got == []
    service = copy.deepcopy(kube.one("Service"))
    kube.delete("Service", NS, NAME)
    kube.put(HAND_MADE)  # taken before the deletion's event is handled
    outcome = reconcile(NS, NAME, cleanup=False, body=kube.model(), changed={("Service", NAME): None})
    assert outcome.child_error and "AlreadyOwned" == ready_condition(kube)["reason"]
    assert kube.one("Service") == HAND_MADE and kube.got == [("Service", NAME)]
    kube.delete("Service", NS, NAME)
    reconcile(NS, NAME, cleanup=False, body=kube.model(), changed={("Service", NAME): None})
    assert kube.one("Service")["spec"] == service["spec"]


def test_a_restarted_operator_reads_its_children_again_and_keeps_them(kube, reconcile):
    kube.put(body(TORCH))
    reconcile(NS, NAME, cleanup=False)
    children = copy.deepcopy(kube.children())
    restarted = Reconcile(kube, DEFAULTS)
    kube.got.clear()
    assert restarted(NS, NAME, cleanup=True) == Outcome()
    assert {("Service", NAME), ("Deployment", NAME)} <= set(kube.got)
    assert kube.children() == children


@pytest.mark.parametrize("message, policy", [
    (VAP_403, "ValidatingAdmissionPolicy 'no-services' (binding 'no-services')"),
    (WEBHOOK_403, "admission webhook 'validation.gatekeeper.sh'"),
], ids=["validating-admission-policy", "webhook"])
def test_an_admission_denial_is_reported_as_such_not_as_rbac(kube, reconcile, message, policy):
    kube.put(body(TORCH))
    kube.fail_apply["Service"] = ApiError(403, message)
    outcome = reconcile(NS, NAME, cleanup=False)  # not raised: no RBAC retry loop
    assert outcome.child_error and not outcome.spec_error
    ready = ready_condition(kube)
    assert ready["reason"] == "AdmissionDenied"
    assert ready["message"].startswith(f"{policy} refused a child of this NeuronModel (an admission policy, not the "
                                       "operator's RBAC)")
    assert message in ready["message"]
    assert [(t, r) for t, r, _ in kube.events] == [("Warning", "AdmissionDenied")]


def test_an_rbac_403_is_still_retried_as_access_denied():
    error = ApiError(403, RBAC_403)
    assert error.retryable and error.admission is None
    assert not ApiError(403, VAP_403).retryable and not ApiError(400, WEBHOOK_403).retryable
    assert ApiError(500, 'Internal error occurred: failed calling webhook "validate.kyverno.svc": timeout').retryable


def test_foreign_reads_only_the_controller_reference():
    mine = {"metadata": {"ownerReferences": [{"uid": UID, "controller": True}]}}
    assert not ownership.foreign(None, UID) and not ownership.foreign(mine, UID)
    assert ownership.foreign({"metadata": {"ownerReferences": [{"uid": UID}]}}, UID)  # an owner, not the controller
    assert ownership.foreign({"metadata": {}}, UID)


def test_an_earlier_model_of_the_same_name_is_waited_for():
    live = {"metadata": {"ownerReferences": [{"kind": "NeuronModel", "name": NAME, "uid": "old", "controller": True}]}}
    message = str(ownership.AlreadyOwned("Service", NS, NAME, live, NAME))
    assert "an earlier NeuronModel llama, uid old" in message and "garbage collector deletes it" in message
    assert "rename" not in message
