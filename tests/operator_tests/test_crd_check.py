"""The operator's start-up check of the installed NeuronModel CRD (crd_check.py), without a cluster: an older CRD is
refused with a message saying how to apply the new one; the same or a newer one passes.

The operator exiting on a real control plane: tests/integration/test_crd_check_at_start.py.
"""

from __future__ import annotations

import copy
from typing import Optional

import pytest

from neuronmodel_operator import api, crd_check, crdgen
from neuronmodel_operator.k8s import ApiError


def installed(revision: Optional[str]) -> dict:
    """The generated CRD as the API server returns it, annotated with `revision` (None: no annotation)."""
    crd = copy.deepcopy(crdgen.crd())
    crd["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": "{}"}
    if revision is not None:
        crd["metadata"]["annotations"][crd_check.ANNOTATION_REVISION] = revision
    return crd


def assert_tells_how_to_apply(message: str) -> None:
    assert api.CRD_NAME in message
    assert "kubectl apply --server-side --force-conflicts -f crds/neuronmodels.neuronmodel.dev.yaml" in message
    assert "Helm never upgrades" in message and "\n" not in message


def test_the_generated_crd_passes():
    assert crd_check.problem(crdgen.crd()) is None


@pytest.mark.parametrize("revision", [str(api.CRD_REVISION), str(api.CRD_REVISION + 1), str(api.CRD_REVISION + 40)])
def test_the_same_or_a_newer_revision_passes(revision):
    # newer: the operator was rolled back; the newer schema still takes what it writes
    assert crd_check.problem(installed(revision)) is None


@pytest.mark.parametrize(("revision", "found"), [
    (str(api.CRD_REVISION - 1), f"revision {api.CRD_REVISION - 1}"),
    ("0", "revision 0"),
    (None, "no neuronmodel.dev/crd-revision annotation"),  # the CRD of operator 0.1.0
    ("two", "no neuronmodel.dev/crd-revision annotation"),
    ("", "no neuronmodel.dev/crd-revision annotation"),
])
def test_an_older_or_unannotated_crd_is_refused(revision, found):
    message = crd_check.problem(installed(revision))
    assert message is not None
    assert f"is older than this operator ({found}, needs revision {api.CRD_REVISION})" in message
    assert_tells_how_to_apply(message)


def test_a_crd_without_annotations_is_refused():
    crd = installed(None)
    del crd["metadata"]["annotations"]
    assert "no neuronmodel.dev/crd-revision annotation" in crd_check.problem(crd)


def test_a_missing_crd_is_refused():
    message = crd_check.problem(None)
    assert message.startswith(f"the CustomResourceDefinition {api.CRD_NAME} is not installed")
    assert_tells_how_to_apply(message)


class StubKube:
    def __init__(self, crd: Optional[dict] = None, error: Optional[ApiError] = None):
        self.crd, self.error, self.asked = crd, error, []

    def get_crd(self, name: str) -> Optional[dict]:
        self.asked.append(name)
        if self.error:
            raise self.error
        return self.crd


def test_check_reads_the_crd_and_raises_the_problem():
    kube = StubKube(installed(str(api.CRD_REVISION)))
    crd_check.check(kube)
    assert kube.asked == [api.CRD_NAME]
    with pytest.raises(crd_check.CrdError, match=f"needs revision {api.CRD_REVISION}"):
        crd_check.check(StubKube(installed("1")))
    with pytest.raises(crd_check.CrdError, match="is not installed"):
        crd_check.check(StubKube(None))


@pytest.mark.parametrize(("error", "hint"), [
    (ApiError(403, "customresourcedefinitions is forbidden"), "needs get on customresourcedefinitions"),
    (ApiError(0, "Connection refused"), "(0: Connection refused)"),
])
def test_check_says_why_it_cannot_read_the_crd(error, hint):
    with pytest.raises(crd_check.CrdError) as raised:
        crd_check.check(StubKube(error=error))
    message = str(raised.value)
    assert message.startswith(f"cannot read the CustomResourceDefinition {api.CRD_NAME}") and hint in message
