"""docs/eks.md must stay true of this repository: every YAML block parses, every NeuronModel in it is accepted by the
operator's own parser (`api.parse_spec`) and resolves to what the page says (image, NeuronCores, compile Job,
Service), and the names, numbers and values it quotes are the ones in the code: the printer columns and phases, the
pods' ServiceAccount, the S3 actions of the cache's 403 message and of the IAM policy, the compile retries and
deadlines, the startup budgets, the chart's values, release name and version, the Neuron taint and instance-type
label, the prometheus-adapter rule the chart renders, and the files the page points to.

The NeuronModels of the page are also applied to a real API server (`kubectl apply --dry-run=server`, through the
CRD's CEL rules) by tests/integration/test_kubectl_ux.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from neuronmodel_operator import api, devices, images
from neuronmodel_operator.builders import job, pod
from neuronmodel_operator.builders.hpa import hpa as build_hpa
from neuronmodel_operator.builders.service import endpoint, service as build_service
from neuronmodel_operator.builders import compile_name, runtime_configmap_name
from neuronmodel_operator.builders.common import target_from_body
from neuronmodel_operator.resolve import OperatorDefaults
from neuronmodel_runtime import compile_job

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "eks.md"
CRD = ROOT / "crds" / "neuronmodels.neuronmodel.dev.yaml"
CHART = ROOT / "charts" / "neuronmodel-operator"
TEXT = DOC.read_text()
WORDS = " ".join(TEXT.replace("\\\n", " ").split())  # line breaks (and shell continuations) collapsed


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", TEXT, flags=re.S | re.M)


def yaml_documents() -> list[dict]:
    return [doc for block in blocks("yaml") for doc in yaml.safe_load_all(block) if doc is not None]


def neuron_models() -> list[dict]:
    return [doc for doc in yaml_documents() if doc.get("kind") == api.KIND]


def target(body: dict):
    meta = {"namespace": "llm", "uid": "00000000-0000-0000-0000-000000000000", **body["metadata"]}
    return target_from_body({**body, "metadata": meta}, OperatorDefaults())


def model(name: str) -> dict:
    return next(body for body in neuron_models() if body["metadata"]["name"] == name)


def first_model() -> dict:
    """The inf2.xlarge model of "A first model" (the autoscaling section reuses its name)."""
    return next(body for body in neuron_models()
                if body["metadata"]["name"] == "llama-1b" and "replicas" in body["spec"])


# --- the YAML blocks ---------------------------------------------------------------------------------------------

def test_every_yaml_block_parses():
    assert len(blocks("yaml")) >= 5
    for block in blocks("yaml"):
        list(yaml.safe_load_all(block))  # raises on a broken block


def test_every_neuronmodel_is_accepted_by_the_operators_parser_and_resolves():
    models = neuron_models()
    assert len(models) >= 3
    for body in models:
        name = body["metadata"]["name"]
        assert body["apiVersion"] == api.API_VERSION, name
        assert len(name) <= api.MAX_NAME_LENGTH and re.match(api.NAME_RE, name), name
        assert set(body) == {"apiVersion", "kind", "metadata", "spec"}, name
        api.parse_spec(body["spec"])  # SpecError names every bad field
        target(body)  # resolve(): a spec the CRD accepts but no instance type can serve fails here


def test_a_spec_error_would_be_caught():
    """The check above can fail: a misspelt field, as a reader could copy it, is refused by the same parser."""
    spec = dict(first_model()["spec"], parallelism={"tensorParallelDegre": 2})
    with pytest.raises(api.SpecError, match="tensorParallelDegre: unknown field"):
        api.parse_spec(spec)


def test_the_cpu_dry_run_is_the_torch_runner_on_any_node():
    smol = target(model("smollm2"))
    assert smol.spec.framework == "torch" and smol.spec.instance_type is None
    assert smol.spec.model.source.startswith("hf://HuggingFaceTB/SmolLM2-135M-Instruct")
    assert smol.resolved.neuron_resources == {} and smol.resolved.instance_family is None
    assert "tolerations" not in pod.pod_spec(smol, pod.SERVE_COMMAND, "serve", runtime_configmap_name(smol))  # no Neuron taint to tolerate
    assert smol.resolved.image == images.default_image(None, "torch")
    tiny = yaml.safe_load((ROOT / "crds" / "samples" / "tiny-torch.yaml").read_text())
    assert "`crds/samples/tiny-torch.yaml`" in TEXT and f"(`{tiny['spec']['model']['source']}`)" in TEXT


def test_the_first_model_resolves_to_what_the_page_says():
    llama = target(first_model())
    assert (llama.spec.instance_type, llama.spec.parallelism.tensor_parallel_degree) == ("inf2.xlarge", 2)
    assert llama.spec.framework == "nxdi"
    assert f"the image `{llama.resolved.image}`" in WORDS
    assert llama.resolved.image == f"{images.DEFAULT_REPOSITORY}:0.1.0-runtime-nxdi-sdk2.31"
    assert llama.resolved.neuron_resources == {devices.NEURONCORE_RESOURCE: "2"}
    assert f"`{devices.NEURONCORE_RESOURCE}: 2`" in TEXT
    # inf2.xlarge: one device, two NeuronCores; TP 2 takes both (why the page says no scheduler extension is needed)
    instance = devices.INSTANCE_TYPES["inf2.xlarge"]
    assert instance.cores(1) == 2 and llama.resolved.devices_per_pod == 1
    assert llama.resolved.compile_job and llama.spec.compile_cache.policy == "IfNotCached"
    assert compile_name(llama).startswith("llama-1b-compile-")
    assert "`llama-1b-compile-<hash>`" in TEXT
    placed = pod.pod_spec(llama, pod.SERVE_COMMAND, "serve", runtime_configmap_name(llama))
    assert placed["nodeSelector"] == {devices.INSTANCE_TYPE_LABEL: "inf2.xlarge"}
    assert {"key": devices.NEURON_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in placed["tolerations"]
    assert (f"tolerate the taint `{devices.NEURON_TAINT_KEY}` (operator `Exists`, effect `NoSchedule`)" in WORDS)
    assert f"select `{devices.INSTANCE_TYPE_LABEL}: <instanceType>`" in WORDS


# --- the ServiceAccount and the IAM policy ----------------------------------------------------------------------

def test_the_runtime_pods_service_account_is_what_the_page_says():
    llama = target(first_model())
    name = llama.spec.service_account_name
    assert name == "neuronmodel-cache"
    for role, command in (("serve", pod.SERVE_COMMAND), ("compile", pod.COMPILE_COMMAND)):
        placed = pod.pod_spec(llama, command, role, runtime_configmap_name(llama))
        assert placed["serviceAccountName"] == name, role
        assert placed["automountServiceAccountToken"] is False
    assert job.compile_job(llama)["spec"]["template"]["spec"]["serviceAccountName"] == name
    # Without spec.serviceAccountName the pods name none: Kubernetes runs them as the namespace's `default`.
    smol = target(model("smollm2"))
    assert "serviceAccountName" not in pod.pod_spec(smol, pod.SERVE_COMMAND, "serve", runtime_configmap_name(smol))
    assert "without it, as the namespace's `default` ServiceAccount" in WORDS
    assert "`automountServiceAccountToken: false`" in TEXT
    # The commands create and bind that very ServiceAccount, in the models' namespace.
    assert f"kubectl create serviceaccount {name} -n llm" in TEXT
    assert f"--service-account {name}" in TEXT and f"--name {name}" in TEXT


def _hint_actions() -> tuple[str, set[str]]:
    """The S3 actions the cache's 403 message names (runtime/neuronmodel_runtime/artifacts/s3.py)."""
    source = (ROOT / "runtime" / "neuronmodel_runtime" / "artifacts" / "s3.py").read_text()
    hint = re.search(r'\(the pod\'s AWS credentials need (.*?) "\s*"(.*?)\)', source)
    assert hint, "the 403 hint moved: update this test and docs/eks.md"
    text = f"the pod's AWS credentials need {hint.group(1)} {hint.group(2)}"
    return text, set(re.findall(r"s3:\w+", text))


def test_the_iam_policy_grants_every_action_the_cache_names():
    hint, actions = _hint_actions()
    assert actions == {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket"}
    assert hint in WORDS  # the troubleshooting table quotes the message
    policies = [json.loads(block) for block in blocks("json")]
    assert len(policies) == 1
    granted: dict[str, set[str]] = {}
    for statement in policies[0]["Statement"]:
        assert statement["Effect"] == "Allow"
        for action in [statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]:
            granted.setdefault(action, set()).add(statement["Resource"])
    assert actions <= set(granted)
    bucket, objects = "arn:aws:s3:::my-neuron-cache", "arn:aws:s3:::my-neuron-cache/neuronmodel/*"
    assert granted["s3:ListBucket"] == {bucket}  # ListBucket is on the bucket, the rest on the objects
    assert all(granted[a] == {objects} for a in actions - {"s3:ListBucket"})
    # The policy's bucket and prefix are the cache URL of the page's models.
    assert target(first_model()).spec.compile_cache.url == "s3://my-neuron-cache/neuronmodel"


# --- the Service and the request ---------------------------------------------------------------------------------

def test_the_request_goes_to_the_service_the_operator_creates():
    llama = target(first_model())
    svc = build_service(llama)
    assert svc["metadata"]["name"] == "llama-1b" and svc["spec"]["ports"][0]["port"] == 8000
    assert endpoint(llama) == "http://llama-1b.llm.svc.cluster.local:8000"
    assert endpoint(llama) in TEXT
    assert "curl -s http://llama-1b.llm.svc:8000/v1/chat/completions" in TEXT
    assert '"model": "llama-1b"' in TEXT  # servedModelName defaults to the NeuronModel's name
    assert "kubectl port-forward -n llm service/llama-1b 8000:8000" in TEXT


# --- status: columns, phases, conditions -------------------------------------------------------------------------

def test_the_printer_columns_and_phases_are_the_crds():
    crd = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]
    columns = crd["additionalPrinterColumns"]
    header = next(line for line in TEXT.splitlines() if line.startswith("NAME ") and "PHASE" in line)
    assert header.split() == ["NAME", *(c["name"].upper() for c in columns)]
    rows = {row.split("|")[1].strip(): row.split("|")[2].strip() for row in TEXT.splitlines()
            if re.match(r"^\| (PHASE|ENGINE|FRAMEWORK|TP|READY|ENDPOINT) \|", row)}
    for column in columns:
        if column["name"] != "Age":
            assert rows[column["name"].upper()] == f"`{column['jsonPath'].removeprefix('.')}`", column["name"]
    phases = crd["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["phase"]["enum"]
    table = [row.split("|")[1].strip() for row in TEXT.splitlines() if re.match(r"^\| [A-Z][a-z]+ \| `", row)]
    assert table == phases == ["Pending", "Compiling", "Loading", "Ready", "Degraded", "Failed"]
    for condition in api.CONDITION_TYPES:
        assert f"`{condition}`" in TEXT


def test_the_phase_reasons_are_the_status_modules():
    source = (ROOT / "operator" / "neuronmodel_operator" / "status.py").read_text()
    for row in TEXT.splitlines():
        if re.match(r"^\| [A-Z][a-z]+ \| `", row):
            for reason in re.findall(r"`(\w+)`", row.split("|")[2]):
                assert f'"{reason}"' in source, reason


# --- the compile Job, retries, budgets, autoscaling --------------------------------------------------------------

def test_the_retry_and_deadline_numbers_are_the_codes():
    assert f"`backoffLimit: {job.BACKOFF_LIMIT}`" in TEXT
    assert f"`activeDeadlineSeconds: {job.ACTIVE_DEADLINE_S}` ({job.ACTIVE_DEADLINE_S // 3600} h)" in TEXT
    assert f"up to {job.BACKOFF_LIMIT + 1} times" in WORDS
    assert f"`retrying, attempt 3 of {job.BACKOFF_LIMIT + 1}`" in TEXT  # status.py's message
    assert f"tries {compile_job.ATTEMPTS} times in one pod ({compile_job.BACKOFF_S:g} s, then " \
           f"{2 * compile_job.BACKOFF_S:g} s apart)" in WORDS
    assert compile_job.ATTEMPTS == 3  # "3 times": two waits between three attempts
    assert (pod.BUDGET_COMPILE_IN_POD_S, pod.BUDGET_CACHED_S, pod.BUDGET_TORCH_S) == (4 * 3600, 30 * 60, 10 * 60)
    assert "the startup probe allows 4 h, with a cache 30 min, on CPU 10 min" in WORDS
    assert "startup probe allows it 4 hours (30 minutes when the artifacts come from the cache)" in WORDS


def test_the_autoscaling_section_matches_the_hpa_the_operator_makes():
    body = next(b for b in neuron_models() if "autoscaling" in b["spec"])
    scaled = target(body)
    made = build_hpa(scaled)
    assert made["metadata"]["name"] == body["metadata"]["name"]
    assert made["spec"]["metrics"][0]["pods"]["metric"]["name"] == api.DEFAULT_HPA_METRIC
    assert made["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 10 * 60
    assert "down only after 10 quiet minutes" in WORDS
    assert f"`{api.DEFAULT_HPA_METRIC}`" in TEXT
    assert "`autoscaling/v2` HPA" in TEXT


# --- the chart ---------------------------------------------------------------------------------------------------

def _values() -> dict:
    path = CHART / "values.yaml"
    if not path.exists():
        pytest.skip("charts/neuronmodel-operator/values.yaml is not there yet")
    return yaml.safe_load(path.read_text())


def _has(values: dict, dotted: str) -> bool:
    node = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_the_helm_values_the_page_names_exist():
    values = _values()
    for key in re.findall(r"--set ([\w.]+)=", TEXT):
        if not key.startswith(("npd.", "scheduler.", "draDriver.")):  # AWS's neuron-helm-chart
            assert _has(values, key), key
    table = TEXT[TEXT.index("| value | default | meaning |"):TEXT.index("For example, one S3 cache")]
    named = {name for row in table.splitlines()[2:] if row.startswith("|")
             for name in re.findall(r"`([a-zA-Z][\w.]*)`", row.split("|")[1])}
    assert len(named) >= 25
    for key in named:
        assert _has(values, key), key
    assert values["hpaMetric"] == api.DEFAULT_HPA_METRIC and values["replicaCount"] == 1
    assert values["watchNamespaces"] == [] and values["runtimeImage"]["repository"] == images.DEFAULT_REPOSITORY
    assert (values["liveness"]["port"], values["metrics"]["port"]) == (8080, 8081)
    assert values["compileCache"]["policy"] == "IfNotCached"


def test_the_helm_commands_name_this_chart_release_and_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text()) if (CHART / "Chart.yaml").exists() else None
    if chart is None:
        pytest.skip("charts/neuronmodel-operator/Chart.yaml is not there yet")
    assert chart["name"] == "neuronmodel-operator"
    version = chart["version"]
    assert (f"helm install neuronmodel oci://ghcr.io/neuronmodel/charts/neuronmodel-operator --version {version} "
            "-n neuronmodel-system --create-namespace") in WORDS
    assert "helm install neuronmodel charts/neuronmodel-operator -n neuronmodel-system --create-namespace" in TEXT
    assert "kubectl apply --server-side --force-conflicts -f charts/neuronmodel-operator/crds/" in TEXT
    assert (CHART / "crds" / CRD.name).exists()
    assert "helm uninstall neuronmodel -n neuronmodel-system" in TEXT
    assert f"kubectl delete crd {api.CRD_NAME}" in TEXT


def _helm() -> str:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from k8s import install
    finally:
        sys.path.pop(0)
    found = install.bin_dir() / "helm"
    if found.exists():
        return str(found)
    if shutil.which("helm"):
        return shutil.which("helm")
    pytest.skip("no helm binary (make k8s-bin)")


def test_the_prometheus_adapter_rule_and_names_are_what_the_chart_renders(tmp_path):
    _values()
    out = subprocess.run([_helm(), "template", "neuronmodel", str(CHART), "-n", "neuronmodel-system",
                          "--set", "monitoring.prometheusAdapterRule.enabled=true"],
                         capture_output=True, text=True, timeout=120,
                         env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "HELM_CACHE_HOME": str(tmp_path / "c"),
                              "HELM_CONFIG_HOME": str(tmp_path / "cfg"), "HELM_DATA_HOME": str(tmp_path / "d")})
    assert out.returncode == 0, out.stderr
    rendered = [doc for doc in yaml.safe_load_all(out.stdout) if doc]
    config_map = next(d for d in rendered
                      if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-adapter-rule"))
    assert f"`{config_map['metadata']['name']}`" in TEXT
    rule = yaml.safe_load(config_map["data"]["config.yaml"])
    documented = next(doc for doc in yaml_documents() if "rules" in doc)
    assert documented == rule
    accounts = [d["metadata"]["name"] for d in rendered if d["kind"] == "ServiceAccount"]
    assert accounts == ["neuronmodel-operator"]
    assert "its own ServiceAccount, `neuronmodel-operator`, needs no IAM role" in WORDS
    deployment = next(d for d in rendered if d["kind"] == "Deployment")
    assert deployment["metadata"]["name"] == "neuronmodel-operator"
    assert "kubectl -n neuronmodel-system rollout status deployment/neuronmodel-operator" in TEXT


# --- nodes, versions, links ----------------------------------------------------------------------------------------

def test_the_nodepool_matches_what_the_pods_select_and_tolerate():
    pool = next(doc for doc in yaml_documents() if doc.get("kind") == "NodePool")
    spec = pool["spec"]["template"]["spec"]
    assert [(t["key"], t["effect"]) for t in spec["taints"]] == [(devices.NEURON_TAINT_KEY, "NoSchedule")]
    types = next(r for r in spec["requirements"] if r["key"] == devices.INSTANCE_TYPE_LABEL)["values"]
    assert "inf2.xlarge" in types and all(t in devices.INSTANCE_TYPES for t in types)
    node_class = next(doc for doc in yaml_documents() if doc.get("kind") == "EC2NodeClass")
    assert spec["nodeClassRef"] == {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass",
                                    "name": node_class["metadata"]["name"]}
    assert f"`{devices.NEURON_TAINT_KEY}=true:NoSchedule`" in TEXT  # the managed node group's taint


def test_the_tested_versions_are_the_local_control_planes():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from k8s import install
    finally:
        sys.path.pop(0)
    assert f"{install.K8S_VERSION.removeprefix('v')} control plane" in TEXT
    assert f"releases/download/{install.LWS_VERSION}/manifests.yaml" in TEXT
    assert f"| LeaderWorkerSet | {install.LWS_VERSION} |" in TEXT


def test_the_files_the_page_points_to_exist():
    paths = set(re.findall(r"`((?:crds|charts|rbac|operator|runtime|tests|scripts)/[\w./-]+)`", TEXT))
    assert len(paths) >= 3
    for path in paths:
        assert (ROOT / path).exists(), path


def test_the_page_says_plainly_what_never_ran():
    assert "Nothing on this page has run on EKS or on Neuron hardware." in TEXT
    assert "No image has been built or pushed" in TEXT
