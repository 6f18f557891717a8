"""`helm template` of every values file: equal to its golden render, valid against the Kubernetes 1.34 schemas, and
the operator Deployment the values ask for."""

from __future__ import annotations

import difflib

import pytest

import chart_sync
from chart_objects import find, find_one

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="the `dev` extra is not installed")

KUBERNETES = "1.34.0"
#: Kinds of CRDs that kubernetes-validate has no schema for (it bundles only the built-in APIs). ServiceMonitor and
#: PodMonitor: no PyPI package ships prometheus-operator's CRD schemas (only generated models), so they are checked by
#: the assertions below and, server-side, by tests/integration/test_chart_install.py. KopfPeering and
#: ClusterKopfPeering: kopf's CRDs accept any status, which the peering objects do not set.
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "KopfPeering", "ClusterKopfPeering"}


@pytest.mark.parametrize("case", sorted(chart_sync.cases()))
def test_render_equals_golden(rendered, case):
    golden = chart_sync.GOLDEN / f"{case}.yaml"
    text = chart_sync.golden_text(chart_sync.cases()[case])
    diff = "".join(difflib.unified_diff(golden.read_text().splitlines(True), text.splitlines(True),
                                        str(golden.relative_to(chart_sync.ROOT)), "helm template"))
    assert not diff, f"the render changed; if that is intended, run python scripts/chart_sync.py\n{diff}"


@pytest.mark.parametrize("case", sorted(chart_sync.cases()))
def test_render_is_valid_kubernetes(rendered, case):
    for doc in rendered[case]:
        if doc["kind"] in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as invalid:
            pytest.fail(f"{case}: {doc['kind']} {doc['metadata']['name']}: {invalid.message}")


def test_crds_are_valid_kubernetes():
    import yaml
    for path in (chart_sync.CHART / "crds").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_every_object_has_the_standard_labels_and_the_release_namespace(rendered):
    for case, docs in rendered.items():
        for doc in docs:
            labels = doc["metadata"]["labels"]
            assert labels["app.kubernetes.io/name"] == "neuronmodel-operator", (case, doc["kind"])
            assert labels["app.kubernetes.io/instance"] == "neuronmodel"
            assert labels["app.kubernetes.io/version"] == "0.1.0"
            assert labels["app.kubernetes.io/managed-by"] == "Helm"
            assert labels["helm.sh/chart"] == "neuronmodel-operator-0.1.0"
            if doc["kind"] in {"Deployment", "ServiceAccount", "Service", "ConfigMap", "ServiceMonitor", "PodMonitor"}:
                assert doc["metadata"]["namespace"] == chart_sync.NAMESPACE, (case, doc["kind"])


def env(deployment: dict) -> dict[str, str]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {item["name"]: item["value"] for item in container["env"]}


def test_default_deployment(rendered):
    deployment = find_one(rendered["defaults"], "Deployment")
    assert deployment["metadata"]["name"] == "neuronmodel-operator"
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "command" not in container and "args" not in container, "the image's neuronmodel-operator entrypoint"
    assert container["image"] == "ghcr.io/neuronmodel/neuronmodel-operator:0.1.0"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"liveness": 8080, "metrics": 8081}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and security["runAsNonRoot"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"] == {"drop": ["ALL"]} and security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert pod["serviceAccountName"] == find_one(rendered["defaults"], "ServiceAccount")["metadata"]["name"]
    assert env(deployment) == {
        "NEURONMODEL_OPERATOR_LIVENESS": "http://0.0.0.0:8080/healthz",
        "NEURONMODEL_OPERATOR_METRICS_PORT": "8081",
        "NEURONMODEL_OPERATOR_LOG_FORMAT": "json",
        "NEURONMODEL_OPERATOR_WORKERS": "8",
        "NEURONMODEL_OPERATOR_WATCH_TIMEOUT_S": "300",
        "NEURONMODEL_OPERATOR_PRIORITY": "0",
        "NEURONMODEL_RUNTIME_IMAGE_REPOSITORY": "ghcr.io/neuronmodel/neuronmodel-runtime",
        "NEURONMODEL_RUNTIME_IMAGE_VERSION": "0.1.0",
        "NEURONMODEL_OPERATOR_COMPILE_CACHE_POLICY": "IfNotCached",
        "NEURONMODEL_HPA_METRIC": "vllm:num_requests_waiting",
        "NEURONMODEL_OPERATOR_NEURON_SCHEDULER_NAME": "my-scheduler",
        "NEURONMODEL_OPERATOR_GROUP_TOPOLOGY_KEY": "eks.amazonaws.com/nodegroup",
        "NEURONMODEL_OPERATOR_ALLOW_HOST_PATH": "false",
    }
    kinds = sorted(doc["kind"] for doc in rendered["defaults"])
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Deployment", "ServiceAccount",
                     "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]


def test_hpa_metric_env_is_the_operators():
    from neuronmodel_operator import api, images
    assert api.ENV_HPA_METRIC == "NEURONMODEL_HPA_METRIC" and api.ENV_RUNTIME_IMAGE == "NEURONMODEL_RUNTIME_IMAGE"
    assert images.ENV_RUNTIME_IMAGE_REPOSITORY == "NEURONMODEL_RUNTIME_IMAGE_REPOSITORY"
    assert images.ENV_RUNTIME_IMAGE_VERSION == "NEURONMODEL_RUNTIME_IMAGE_VERSION"


@pytest.mark.parametrize("case, scheduler, host_path", [("defaults", "my-scheduler", False),
                                                       ("custom-images", None, True)])
def test_the_operator_reads_the_charts_scheduler_and_host_path_settings(rendered, monkeypatch, case, scheduler,
                                                                        host_path):
    """The rendered env, read by the operator's own flag parser: what every NeuronModel's pods then get."""
    from neuronmodel_operator import cli
    for name, value in env(find_one(rendered[case], "Deployment")).items():
        monkeypatch.setenv(name, value)
    defaults = cli.operator_defaults(cli.parser().parse_args([]))
    assert (defaults.neuron_scheduler_name, defaults.allow_host_path) == (scheduler, host_path)


def test_the_hub_endpoint_proxy_and_extra_env_reach_the_operator(rendered):
    variables = env(find_one(rendered["hub-proxy"], "Deployment"))
    assert variables["HF_ENDPOINT"] == "https://hf-mirror.internal"
    assert variables["HTTPS_PROXY"] == "http://proxy.internal:3128" and "HTTP_PROXY" not in variables
    assert variables["NO_PROXY"] == ".internal,10.0.0.0/8,$(KUBERNETES_SERVICE_HOST)"
    assert variables["SSL_CERT_FILE"] == "/etc/ssl/certs/ca-certificates.crt" and variables["HF_HUB_ETAG_TIMEOUT"] == "20"
    assert not {"HF_ENDPOINT", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY"} & set(env(find_one(rendered["defaults"],
                                                                                            "Deployment")))


def test_the_operator_reaches_the_api_server_directly_under_the_charts_proxy(rendered, monkeypatch):
    """The kubernetes client reads HTTPS_PROXY as well: without the API server in NO_PROXY every request of the
    operator would go through the proxy. The kubelet expands $(KUBERNETES_SERVICE_HOST) (a service variable)."""
    import kubernetes
    host = "172.20.0.1"
    for name, value in env(find_one(rendered["hub-proxy"], "Deployment")).items():
        monkeypatch.setenv(name, value.replace("$(KUBERNETES_SERVICE_HOST)", host))
    configuration = kubernetes.client.Configuration()
    configuration.host = f"https://{host}:443"
    assert configuration.proxy == "http://proxy.internal:3128"  # what the Hub's requests take
    assert kubernetes.client.rest.should_bypass_proxies(configuration.host, configuration.no_proxy)


def test_custom_images_placement_and_compile_cache(rendered):
    docs = rendered["custom-images"]
    deployment = find_one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    registry = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
    assert container["image"] == f"{registry}/neuronmodel-operator:0.1.0-rc1"
    assert container["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == [{"name": "ecr-pull"}]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"][0]["key"] == "CriticalAddonsOnly"
    assert "nodeAffinity" in pod["affinity"]
    assert pod["serviceAccountName"] == "neuronmodel"
    assert deployment["spec"]["template"]["metadata"]["labels"]["team"] == "ml-platform"
    variables = env(deployment)
    assert variables["NEURONMODEL_RUNTIME_IMAGE_REPOSITORY"] == f"{registry}/neuronmodel-runtime"
    assert variables["NEURONMODEL_RUNTIME_IMAGE_VERSION"] == "0.1.0-rc1"
    assert variables["NEURONMODEL_RUNTIME_IMAGE"] == f"{registry}/neuronmodel-runtime:0.1.0-rc1-nxdi"
    assert variables["NEURONMODEL_OPERATOR_COMPILE_CACHE_URL"] == "s3://neuronmodel-artifacts/compiled"
    assert variables["NEURONMODEL_OPERATOR_COMPILE_CACHE_POLICY"] == "Always"
    assert variables["NEURONMODEL_OPERATOR_LOG_FORMAT"] == "text"
    account = find_one(docs, "ServiceAccount")
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].endswith("role/neuronmodel-operator")


def test_peering_rolls_two_replicas_with_a_peering_object(rendered):
    deployment = find_one(rendered["peering"], "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate"}
    assert env(deployment)["NEURONMODEL_OPERATOR_PEERING"] == "neuronmodel"
    assert env(deployment)["NEURONMODEL_OPERATOR_PRIORITY"] == "100"
    assert [doc["metadata"]["name"] for doc in find(rendered["peering"], "ClusterKopfPeering")] == ["neuronmodel"]
    namespaced = rendered["peering-namespaced"]
    assert [(doc["metadata"]["namespace"], doc["metadata"]["name"]) for doc in find(namespaced, "KopfPeering")] \
        == [("team-a", "neuronmodel")]
    assert find(namespaced, "ClusterKopfPeering") == []


def test_namespaced_operator_watches_only_its_namespaces(rendered):
    assert env(find_one(rendered["namespaced"], "Deployment"))["NEURONMODEL_OPERATOR_NAMESPACES"] == "team-a,team-b"
    assert "NEURONMODEL_OPERATOR_NAMESPACES" not in env(find_one(rendered["defaults"], "Deployment"))


def test_monitoring_objects(rendered):
    docs = rendered["monitoring"]
    service = find_one(docs, "Service")
    monitor = find_one(docs, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    pods = find_one(docs, "PodMonitor")
    assert pods["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert pods["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/managed-by": "neuronmodel-operator",
                                                       "app.kubernetes.io/component": "server"}
    assert pods["spec"]["namespaceSelector"] == {"any": True}
    assert pods["spec"]["podMetricsEndpoints"] == [{"port": "http", "path": "/metrics", "interval": "10s"}]
    configmaps = {doc["metadata"]["name"]: doc for doc in find(docs, "ConfigMap")}
    dashboards = configmaps["neuronmodel-operator-dashboards"]
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "vllm:num_requests_waiting" in dashboards["data"]["neuronmodel-serving.json"]
    rule = configmaps["neuronmodel-operator-prometheus-adapter-rule"]["data"]["config.yaml"]
    import yaml
    (adapter,) = yaml.safe_load(rule)["rules"]
    assert adapter["seriesQuery"].startswith("vllm:num_requests_waiting{")
    assert adapter["name"]["as"] == "vllm:num_requests_waiting"
    assert adapter["resources"]["overrides"]["pod"] == {"resource": "pod"}
