"""What a user sees in kubectl, on a real API server: `kubectl explain` prints the CRD's field descriptions, `kubectl
get` prints the printer columns under every name the CRD declares (plural, singular, short name, category, and
through discovery), `kubectl get -w` shows the phase change, `kubectl wait` understands the Ready condition, and
`kubectl describe` shows the status and the operator's Events in a readable form.

No operator runs here: the status is written through the status subresource as the admin, and the Events are posted
with the operator's own code (`k8s.Kube.event`), so what kubectl prints is what it prints for the operator's writes.
The expected texts are read from crds/neuronmodels.neuronmodel.dev.yaml, and a few are also spelt out here, so a
description dropped from api.py (and so from the generated CRD) fails these tests too. docs/eks.md relies on each.
"""

from __future__ import annotations

import json
import queue
import re
import subprocess
import threading
from pathlib import Path

import pytest
import yaml
from kubernetes import client as kube

from k8s import install  # scripts/, on sys.path through tests/integration/conftest.py
from neuronmodel_operator import api
from neuronmodel_operator.k8s import Kube

pytestmark = pytest.mark.slow  # the session's control plane takes ~10 s to start

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "neuronmodels.neuronmodel.dev.yaml"


def _crd() -> dict:
    return yaml.safe_load(CRD.read_text())


def _schema() -> dict:
    return _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _words(text: str) -> str:
    """kubectl wraps long descriptions and indents them: compare texts with their whitespace collapsed."""
    return " ".join(text.split())


@pytest.fixture(scope="module")
def kubectl(install_crds, control_plane, wait_until):
    """`kubectl(*args, check=True)` once the CRD is installed and kubectl explain knows it (the CRD reaches the
    OpenAPI document a moment after it is Established)."""
    install_crds(CRD)
    wait_until("kubectl explain to know NeuronModel", lambda: control_plane.kubectl(
        "explain", "neuronmodel.spec.speculation", check=False).returncode == 0, timeout=60)
    return control_plane.kubectl


MODEL = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "llama-1b"},
         "spec": {"model": {"source": "hf://meta-llama/Llama-3.2-1B-Instruct", "parameters": "1B"},
                  "framework": "nxdi", "instanceType": "inf2.xlarge",
                  "parallelism": {"tensorParallelDegree": 2}, "replicas": 1}}


def _create(kubectl, namespace: str, body: dict = MODEL) -> dict:
    kubectl("apply", "--server-side", "--field-manager=test-user", "-n", namespace, "-f", "-", stdin=json.dumps(body))
    return json.loads(kubectl("get", "nm", body["metadata"]["name"], "-n", namespace, "-o", "json").stdout)


def _patch_status(admin_client, namespace: str, name: str, status: dict) -> None:
    """What the operator does (k8s.Kube.patch_status): a merge patch of the status subresource."""
    kube.CustomObjectsApi(admin_client).patch_namespaced_custom_object_status(
        api.GROUP, api.VERSION, namespace, api.PLURAL, name, {"status": status})


def _ready_status(namespace: str, name: str = "llama-1b") -> dict:
    endpoint = f"http://{name}.{namespace}.svc.cluster.local:8000"
    return {"phase": "Ready", "ready": "1/1", "replicas": 1, "readyReplicas": 1, "endpoint": endpoint,
            "resolved": {"framework": "nxdi", "instanceType": "inf2.xlarge", "instanceFamily": "inf2",
                         "neuronCoresPerPod": 2, "neuronDevicesPerPod": 1},
            "conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
                            "message": f"1/1 replicas ready; serving at {endpoint}",
                            "lastTransitionTime": "2026-12-01T10:00:00Z", "observedGeneration": 1}],
            "observedGeneration": 1}


# --- kubectl explain -------------------------------------------------------------------------------------------

def test_explain_speculation_prints_every_field_description(kubectl):
    out = kubectl("explain", "neuronmodel.spec.speculation").stdout
    text = _words(out)
    speculation = _schema()["properties"]["spec"]["properties"]["speculation"]
    assert _words(speculation["description"]) in text
    for field, prop in speculation["properties"].items():
        assert prop.get("description"), f"spec.speculation.{field} has no description in the CRD"
        assert field in out, field
        assert _words(prop["description"]) in text, f"kubectl explain lacks the description of {field}"
    # Spelt out, so that dropping a description from api.py fails here too, not only the comparison above.
    for expected in ("k: tokens proposed per step.", "The draft model of mode draft or eagle.",
                     "Smallest n-gram prompt lookup matches.", "promptLookup (n-grams of the request itself"):
        assert expected in text, expected
    assert "<integer>" in out and "<Object>" in out and "<string>" in out


def test_explain_a_leaf_field_shows_its_type_default_and_enum(kubectl):
    out = kubectl("explain", "nm.spec.compileCache.policy").stdout
    assert "<string>" in out
    assert "IfNotCached: compile on a miss" in _words(out)
    assert "IfNotCached" in out and "Always" in out and "Never" in out  # kubectl 1.34 prints the enum


def test_explain_recursive_through_the_short_name(kubectl):
    out = kubectl("explain", "nm", "--recursive").stdout
    assert "KIND:" in out and api.KIND in out
    assert f"VERSION:    {api.VERSION}" in out or api.VERSION in out
    assert api.GROUP in out
    for field in ("spec", "model", "source", "tokenSecretRef", "parallelism", "tensorParallelDegree", "speculation",
                  "numSpeculativeTokens", "compileCache", "shardedWeights", "autoscaling", "targetAverageValue",
                  "serviceAccountName", "status", "phase", "conditions", "endpoint", "resolved", "compileKey",
                  "timings"):
        assert field in out, field
    assert kubectl("explain", "neuronmodels.spec", "--recursive").returncode == 0  # the plural too


# --- kubectl get --------------------------------------------------------------------------------------------------

def test_get_prints_the_printer_columns_and_the_status(kubectl, namespace, admin_client):
    columns = [c["name"].upper() for c in _crd()["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns == ["PHASE", "ENGINE", "FRAMEWORK", "TP", "READY", "ENDPOINT", "AGE"]  # what docs/eks.md explains
    _create(kubectl, namespace)
    before = kubectl("get", "nm", "-n", namespace).stdout.splitlines()
    assert before[0].split() == ["NAME", *columns]
    # Nothing reconciled it: only NAME, ENGINE and TP (from the spec, the engine its default) and AGE have values;
    # the status columns are blank.
    assert before[1].split()[:3] == ["llama-1b", "neuronmodel", "2"]

    _patch_status(admin_client, namespace, "llama-1b", _ready_status(namespace))
    rows = kubectl("get", "nm", "-n", namespace).stdout.splitlines()
    assert rows[0].split() == ["NAME", *columns]
    name, phase, engine, framework, tp, ready, endpoint, _age = rows[1].split()
    assert (name, phase, engine, framework, tp, ready) == ("llama-1b", "Ready", "neuronmodel", "nxdi", "2", "1/1")
    assert endpoint == f"http://llama-1b.{namespace}.svc.cluster.local:8000"

    # The same columns through every name the CRD declares, and its category.
    names = _crd()["spec"]["names"]
    for resource in (names["plural"], names["singular"], *names["shortNames"], *names["categories"],
                     f"{names['plural']}.{api.GROUP}", f"{names['plural']}.{api.VERSION}.{api.GROUP}"):
        out = kubectl("get", resource, "-n", namespace).stdout.splitlines()
        assert out[0].split() == ["NAME", *columns], resource
        assert out[1].split()[:2] == ["llama-1b", "Ready"], resource
    assert kubectl("get", "nm", "-n", namespace, "-o", "name").stdout.strip() == \
        f"{names['singular']}.{api.GROUP}/llama-1b"


def test_discovery_lists_the_short_name_and_the_category(kubectl):
    out = kubectl("api-resources", f"--api-group={api.GROUP}", "-o", "wide").stdout.splitlines()
    header, row = out[0].split(), out[1].split()
    assert header[:5] == ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    assert row[:5] == [api.PLURAL, "nm", api.API_VERSION, "true", api.KIND]
    names = _crd()["spec"]["names"]
    assert set(names["categories"]) <= set(row[-1].split(",")), row  # CATEGORIES is the last column


def test_get_watch_shows_each_phase(kubectl, control_plane, namespace, admin_client):
    _create(kubectl, namespace)
    lines: queue.Queue = queue.Queue()
    watch = subprocess.Popen([str(install.bin_dir() / "kubectl"), f"--kubeconfig={control_plane.kubeconfig}",
                              "get", "nm", "-n", namespace, "-w"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    threading.Thread(target=lambda: [lines.put(line) for line in watch.stdout], daemon=True).start()
    try:
        assert lines.get(timeout=30).split()[:2] == ["NAME", "PHASE"]
        assert lines.get(timeout=30).split()[0] == "llama-1b"
        seen = []
        for phase in ("Pending", "Compiling", "Loading", "Ready"):
            status = _ready_status(namespace) if phase == "Ready" else {"phase": phase, "ready": "0/1"}
            _patch_status(admin_client, namespace, "llama-1b", status)
            row = lines.get(timeout=30).split()
            assert row[0] == "llama-1b"
            seen.append(row[1])
        assert seen == ["Pending", "Compiling", "Loading", "Ready"]
    finally:
        watch.terminate()
        watch.wait(timeout=10)


def test_wait_for_the_ready_condition(kubectl, namespace, admin_client):
    _create(kubectl, namespace)
    early = kubectl("wait", "nm/llama-1b", "-n", namespace, "--for=condition=Ready", "--timeout=1s", check=False)
    assert early.returncode != 0
    _patch_status(admin_client, namespace, "llama-1b", _ready_status(namespace))
    kubectl("wait", "nm/llama-1b", "-n", namespace, "--for=condition=Ready", "--timeout=30s")
    kubectl("wait", "nm/llama-1b", "-n", namespace, "--for=jsonpath={.status.phase}=Ready", "--timeout=30s")


# --- kubectl describe and Events ----------------------------------------------------------------------------------

def test_describe_shows_the_status_and_the_operators_events(kubectl, namespace, admin_client):
    body = _create(kubectl, namespace)
    _patch_status(admin_client, namespace, "llama-1b", _ready_status(namespace))
    operator = Kube(admin_client)  # the operator's own code path for Events (reconcile.py -> Kube.event)
    compile_failed = ("compile Job llama-1b-compile-0123456789 failed: BackoffLimitExceeded: Job has reached the "
                      "specified backoff limit. See its pod logs (kubectl logs job/llama-1b-compile-0123456789)")
    operator.event(body, "Warning", "CompileFailed", compile_failed)
    operator.event(body, "Normal", "Ready", f"1/1 replicas ready; serving at http://llama-1b.{namespace}.svc."
                   "cluster.local:8000")

    out = kubectl("describe", "nm", "llama-1b", "-n", namespace).stdout
    assert out.startswith("Name:") and "llama-1b" in out.splitlines()[0]
    assert f"API Version:  {api.API_VERSION}" in out and f"Kind:         {api.KIND}" in out
    assert "Phase:  Ready" in _words_lines(out)
    assert "Type:  Ready" in _words_lines(out) and "Reason:  Ready" in _words_lines(out)  # the conditions
    assert f"Endpoint:  http://llama-1b.{namespace}.svc.cluster.local:8000" in _words_lines(out)
    assert "Tensor Parallel Degree:  2" in _words_lines(out)  # describe title-cases the camelCase keys

    events = out[out.index("\nEvents:") + 1:].splitlines()
    assert events[1].split() == ["Type", "Reason", "Age", "From", "Message"]
    rows = [" ".join(line.split()) for line in events[3:] if line.strip()]
    warning = next(row for row in rows if row.startswith("Warning CompileFailed"))
    assert api.OPERATOR_NAME in warning and compile_failed in warning
    normal = next(row for row in rows if row.startswith("Normal Ready"))
    assert "serving at http://llama-1b." in normal

    # `kubectl events --for`, which docs/eks.md also shows, finds the same Events.
    listed = kubectl("events", "-n", namespace, "--for", "neuronmodel/llama-1b").stdout
    assert "CompileFailed" in listed and "Ready" in listed and compile_failed in _words(listed)
    assert "NeuronModel/llama-1b" in listed or "neuronmodel/llama-1b" in listed


def _words_lines(text: str) -> str:
    """describe aligns values with runs of spaces: collapse them to two, per line."""
    return "\n".join(re.sub(r"(\S):\s+", r"\1:  ", line.strip()) for line in text.splitlines())


# --- docs/eks.md -------------------------------------------------------------------------------------------------

def test_the_neuronmodels_of_docs_eks_pass_the_api_servers_checks(kubectl, namespace):
    """Every NeuronModel YAML of docs/eks.md goes through the CRD's schema and CEL rules (tests/test_docs.py runs
    them through the operator's parser)."""
    text = (ROOT / "docs" / "eks.md").read_text()
    found = [doc for block in re.findall(r"^```yaml\n(.*?)^```", text, flags=re.S | re.M)
             for doc in yaml.safe_load_all(block) if doc and doc.get("kind") == api.KIND]
    assert len(found) >= 3
    for body in found:
        body["metadata"].pop("namespace", None)  # the page's namespace is llm; this test has its own
        out = kubectl("apply", "--dry-run=server", "--server-side", "--field-manager=test-user", "-n", namespace,
                      "-f", "-", stdin=json.dumps(body), check=False)
        assert out.returncode == 0, f"{body['metadata']['name']}: {out.stderr}"
    broken = {**found[0], "spec": {**found[0]["spec"], "replicas": 1, "autoscaling": {"maxReplicas": 2}}}
    refused = kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=json.dumps(broken), check=False)
    assert refused.returncode != 0 and "set at most one of spec.replicas" in refused.stderr
