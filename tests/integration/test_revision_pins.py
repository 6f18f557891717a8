"""hf:// pins on the real control plane, against the session's Hub mirror (hub_mirror.py, the operator's
HF_ENDPOINT): a refused edit keeps the pins, so its fix serves the commit served before although main moved; a Hub
that does not answer is in the status while it is retried. Unit tests: tests/operator_tests/test_reconcile.py."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

INF2 = {"framework": "nxdi", "instanceType": "inf2.48xlarge", "parallelism": {"tensorParallelDegree": 2},
        "replicas": 1}


def neuronmodel(name: str, source: str) -> dict:
    return {"apiVersion": "neuronmodel.dev/v1alpha1", "kind": "NeuronModel", "metadata": {"name": name},
            "spec": {"model": {"source": source}, **INF2}}


def fetched_revision(api, name: str) -> str:
    (init,) = [c for c in api.deployment(name).spec.template.spec.init_containers if "--revision" in c.command]
    return init.command[init.command.index("--revision") + 1]


def reconciled(api, name: str) -> dict:
    """The status once the operator has reconciled the model's current generation."""
    def caught_up():
        body = api.get(name)
        return body if (body.get("status") or {}).get("observedGeneration") == body["metadata"]["generation"] \
            else None
    return api.wait_until(f"{name} reconciled", caught_up, 60)["status"]


def test_a_refused_edit_keeps_the_pin_so_its_fix_serves_the_same_commit(api, hub_mirror):
    repo = f"org/pins-{api.ns}"
    api.apply(neuronmodel("pinned", f"hf://{repo}"))
    first = reconciled(api, "pinned")["resolved"]["modelRevision"]
    assert fetched_revision(api, "pinned") == first
    moved = hub_mirror.move(repo, "main")  # a push to main on the Hub
    # a typo CEL cannot catch (TP 256 without an instanceType: no Neuron instance holds it), then its fix
    api.patch("pinned", {"instanceType": None, "parallelism": {"tensorParallelDegree": 256}})
    failed = api.phase("pinned", "Failed")["status"]
    assert failed["resolved"]["revisions"] == {f"hf://{repo}@": first}
    api.patch("pinned", {"instanceType": "inf2.48xlarge", "parallelism": {"tensorParallelDegree": 2}})
    status = reconciled(api, "pinned")
    assert status["resolved"]["modelRevision"] == first != moved
    assert fetched_revision(api, "pinned") == first


def test_a_hub_that_does_not_answer_is_in_the_status_while_it_is_retried(api, hub_mirror):
    api.apply(neuronmodel("outage", f"hf://org/{api.ns}-down"))  # the mirror answers 503 for it
    body = api.phase("outage", "Pending")
    ready = next(c for c in body["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "HubUnavailable"
    assert f"resolving hf://org/{api.ns}-down@main: the Hub at {hub_mirror.url} answered HTTP 503" in ready["message"]
    assert "retrying" in ready["message"]
    api.warning("outage", "HubUnavailable")
    assert api.deployment("outage") is None
