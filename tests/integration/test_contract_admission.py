"""CEL and the runtime agree: for every spec of tests/operator_tests/contract_table.py, the real API server's
verdict on the NeuronModel (a server-side dry-run create against crds/neuronmodels.neuronmodel.dev.yaml: its
OpenAPI bounds and its CEL rules, written from the runtime's contract) is the verdict of the operator and the
runtime on the RuntimeConfig the operator would write, and a refusal names the same spec field on both sides."""

from __future__ import annotations

import json

import pytest
from kubernetes import client as kube

from neuronmodel_operator import api
from operator_tests.contract_table import CASES, contract_verdict

pytestmark = pytest.mark.slow  # the session's control plane takes ~10 s to start

NAMESPACE = "contract"


@pytest.fixture(scope="module")
def plane(control_plane, neuronmodel_crd, admin_client):
    core = kube.CoreV1Api(admin_client)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    yield control_plane
    core.delete_namespace(NAMESPACE)


def server_verdict(plane, index: int, spec: dict) -> tuple[bool, str]:
    """(accepted, what kubectl printed) for a server-side dry-run create: nothing is stored."""
    body = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": f"contract-{index}"}, "spec": spec}
    created = plane.kubectl("create", "--dry-run=server", "-n", NAMESPACE, "-o", "name", "-f", "-",
                            stdin=json.dumps(body), check=False)
    return created.returncode == 0, created.stderr


@pytest.mark.parametrize("index", range(len(CASES)), ids=[case.id for case in CASES])
def test_the_api_server_and_the_runtime_agree(plane, index):
    case = CASES[index]
    accepted, printed = server_verdict(plane, index, case.spec)
    runtime = contract_verdict(case.spec)
    assert runtime == case.refused
    if case.refused is None:
        assert accepted, f"the API server refuses what the runtime takes: {printed}"
    else:
        assert not accepted, f"the API server admits what the runtime refuses ({case.refused})"
        assert case.refused in printed, f"the API server's refusal does not name {case.refused}: {printed}"
