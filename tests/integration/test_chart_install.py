"""The Helm chart (charts/neuronmodel-operator) against the real local control plane, with Helm 4 and Helm 3.

kwok runs no containers, so the operator pod the chart installs never runs our code: the scheduler places it (on the
CPU node: the Neuron nodes are tainted) and kwok marks it Ready. What the pod would do, a local operator process
does instead, with what the pod would have: a TokenRequest token of the chart's ServiceAccount (so exactly the
chart's rendered ClusterRole/Roles apply) and the env the chart's Deployment sets. The restricted Pod Security
Standard is the apiserver's own PodSecurity admission (on by default), enforced by a namespace label.
"""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator, Optional

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from chart_helpers import (CHART, CPU_NODE, Helm, find, find_one, forbidden_lines, local_env,  # noqa: E402
                           manifest_text, monitoring_crds, operator_container, token_kubeconfig)
from kubernetes import client as kube  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

from k8s.operator_process import OperatorProcess  # noqa: E402
from test_operator import mounted_config_map  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "assets" / "tiny" / "target"
GROUP, VERSION, PLURAL = "neuronmodel.dev", "v1alpha1", "neuronmodels"
CRDS = sorted((CHART / "crds").glob("*.yaml"))
#: The CRDs of the chart's crds/ (Helm installs them before the templates, skips existing ones, never deletes them).
CRD_NAMES = sorted(d["metadata"]["name"] for p in CRDS for d in yaml.safe_load_all(p.read_text()) if d)
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest",
              "pod-security.kubernetes.io/warn": "restricted"}  # warn: workload objects (the Deployment) too
#: Where the chart's Deployment would pull from: kwok never pulls, the value only has to reach the pod spec.
IMAGE = {"image": {"repository": "registry.example.com/neuronmodel-operator", "tag": "test"}}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tiny_sample(source: str | None = None) -> dict:
    """crds/samples/tiny-torch.yaml with its model where this checkout has it (or at `source`)."""
    body = yaml.safe_load((ROOT / "crds" / "samples" / "tiny-torch.yaml").read_text())
    body["spec"]["model"]["source"] = source or str(TINY)
    return body


def _session_operator_running(plane) -> bool:
    """Is conftest's cluster-wide `operator` running (another module started it)? It would reconcile our models."""
    marker = str(plane.data_dir / "operator.kubeconfig").encode()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


@pytest.fixture(scope="module", autouse=True)
def only_our_operators(request, control_plane):
    """This module's local operators must be the only ones: stop the session's cluster-wide one meanwhile."""
    session_operator = request.getfixturevalue("operator") if _session_operator_running(control_plane) else None
    if session_operator:
        session_operator.stop()
    yield
    if session_operator:
        session_operator.start()


@pytest.fixture(scope="module")
def namespaces(admin_client):
    """`namespaces(labels=None)` -> a fresh namespace name; all of them are deleted at the end of the module."""
    core, made = kube.CoreV1Api(admin_client), []

    def make(labels: dict | None = None, create: bool = True) -> str:
        name = f"c-{uuid.uuid4().hex[:8]}"
        if create:  # else only its name, for `helm install --create-namespace`
            core.create_namespace({"metadata": {"name": name, "labels": labels or {}}})
        made.append(name)
        return name

    yield make
    for name in made:
        try:
            core.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("helm")


def helm_for(control_plane, helm_home, binary: str) -> Helm:
    return Helm(control_plane, helm_home / binary, binary)


def pod_security_warnings(plane, objects: list[dict]) -> str:
    """PodSecurity's warnings (a namespace's `warn` label) about the rendered workloads, from a server dry run
    (Helm 3 and 4 do not print the API server's warnings)."""
    applied = plane.kubectl("apply", "--dry-run=server", "-f", "-", stdin=manifest_text(objects))
    return "\n".join(line for line in applied.stderr.splitlines() if "PodSecurity" in line)


class Cluster:
    """What the tests read and do as the cluster's admin."""

    def __init__(self, admin_client, plane, wait_until):
        self.core, self.apps = kube.CoreV1Api(admin_client), kube.AppsV1Api(admin_client)
        self.rbac, self.custom = kube.RbacAuthorizationV1Api(admin_client), kube.CustomObjectsApi(admin_client)
        self.extensions = kube.ApiextensionsV1Api(admin_client)
        self.client, self.plane, self.wait_until = admin_client, plane, wait_until

    def apply(self, namespace: str, body: dict, check: bool = True):
        return self.plane.kubectl("apply", "--server-side", "--field-manager=test-user", "-n", namespace, "-f", "-",
                                  stdin=json.dumps(body), check=check)

    def model(self, namespace: str, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

    def phase(self, namespace: str, name: str, phase: str, timeout: float = 90) -> dict:
        def reached():
            body = self.model(namespace, name)
            now = body.get("status", {}).get("phase")
            if now == "Failed" != phase:  # no retry until the spec changes: fail now, with the status
                raise TimeoutError
            return body if now == phase else None
        try:
            return self.wait_until(f"{name} {phase}", reached, timeout)
        except TimeoutError:
            raise AssertionError(f"{namespace}/{name} never reached {phase}: status "
                                 f"{self.model(namespace, name).get('status')}") from None

    def operator_pods(self, deployment: dict) -> list:
        namespace = deployment["metadata"]["namespace"]
        selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
        return self.core.list_namespaced_pod(namespace, label_selector=selector).items

    def failed_creates(self, namespace: str) -> list[str]:
        return [f"{e.involved_object.kind}/{e.involved_object.name}: {e.message}"
                for e in self.core.list_namespaced_event(namespace).items if e.reason == "FailedCreate"]

    def exists(self, read, *args) -> bool:
        try:
            read(*args)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise


@pytest.fixture(scope="module")
def cluster(admin_client, control_plane, wait_until) -> Cluster:
    return Cluster(admin_client, control_plane, wait_until)


def installed(helm: Helm, release: str, namespace: str) -> dict[str, list[dict]]:
    """The release's objects on the server, by kind, with their namespace filled in."""
    objects = helm.manifest(release, namespace)
    for obj in objects:
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            obj["metadata"].setdefault("namespace", namespace)
    by_kind: dict[str, list[dict]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj)
    return by_kind


def local_operator(cluster: Cluster, deployment: dict, kubeconfig: Path, log: Path,
                   hf_endpoint: Optional[str] = None) -> OperatorProcess:
    """The chart's operator container as a local process: its args, its env (ports made free), the given token;
    `hf_endpoint`: the Hub mirror it pins hf:// sources against (HF_ENDPOINT)."""
    container = operator_container(deployment)
    args = list(container.get("args", []))
    if container.get("command"):  # else the image's ENTRYPOINT: neuronmodel-operator (Dockerfile, target operator)
        command = [*container["command"], *args]
        assert Path(command[0]).name == "neuronmodel-operator", f"the container runs {command}"
        args = command[1:]
    env = local_env(deployment, deployment["metadata"]["namespace"])
    for i, arg in enumerate(args):  # ports of the pod: free ones here (other operators may run on this machine)
        if arg in ("--metrics-port",) and i + 1 < len(args):
            args[i + 1] = str(_free_port())
    for name in env:
        if name.startswith("NEURONMODEL_OPERATOR_") and name.endswith("_PORT"):
            env[name] = str(_free_port())
    if hf_endpoint:
        env["HF_ENDPOINT"] = hf_endpoint
    return OperatorProcess(kubeconfig, log, None, *args, env=env)


@contextlib.contextmanager
def chart_operator(control_plane, cluster: Cluster, deployment: dict, check: dict,
                   hf_endpoint: Optional[str] = None) -> Iterator[Path]:
    """The chart's operator running (`local_operator`) with its ServiceAccount's token, once RBAC allows `check`;
    yields its log. On the way out: stopped, and its log holds no 403 (a right the chart's RBAC lacks)."""
    namespace = deployment["metadata"]["namespace"]
    sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    kubeconfig = token_kubeconfig(control_plane, cluster.client, namespace, sa,
                                  control_plane.data_dir / f"{namespace}-{sa}.kubeconfig", check=check)
    log = control_plane.data_dir / "logs" / f"operator-chart-{namespace}.log"
    operator = local_operator(cluster, deployment, kubeconfig, log, hf_endpoint)
    operator.start(timeout=90)
    try:
        yield log
    finally:
        operator.stop()
    forbidden = forbidden_lines(log.read_text())
    assert forbidden == [], "403s: the operator reached outside the chart's RBAC\n" + "\n".join(forbidden[:10])


def assert_children(cluster: Cluster, namespace: str, body: dict) -> None:
    name, uid = body["metadata"]["name"], body["metadata"]["uid"]
    children = [cluster.apps.read_namespaced_deployment(name, namespace),
                cluster.core.read_namespaced_service(name, namespace),
                cluster.core.read_namespaced_config_map(
                    mounted_config_map(cluster.apps.read_namespaced_deployment(name, namespace)), namespace)]
    for child in children:
        (ref,) = child.metadata.owner_references
        assert (ref.kind, ref.name, ref.uid, ref.controller) == ("NeuronModel", name, uid, True)
        assert child.metadata.labels["app.kubernetes.io/managed-by"] == "neuronmodel-operator"


# --------------------------------------------------------------------------------------------------------------------
# helm install, the operator pod on the CPU node, the chart's ServiceAccount reconciling the tiny sample

@pytest.fixture(scope="module")
def release(control_plane, helm_home, namespaces, cluster):
    """The chart installed by Helm 4 with its defaults (only the image set), `--wait`ed until Available."""
    helm = helm_for(control_plane, helm_home, "helm")
    namespace, name = namespaces(), "nmchart"
    crds_before = {n: cluster.exists(cluster.extensions.read_custom_resource_definition, n) for n in CRD_NAMES}
    out = helm.install(name, namespace, IMAGE, "--wait", "--timeout", "120s")
    yield helm, name, namespace, installed(helm, name, namespace), crds_before, out
    helm.uninstall(name, namespace, check=False)


def test_helm_install_puts_the_operator_on_the_cpu_node_and_installs_the_crds(release, cluster):
    helm, name, namespace, objects, crds_before, out = release
    (deployment,) = objects["Deployment"]
    (pod,) = cluster.operator_pods(deployment)
    # the Neuron nodes are tainted aws.amazon.com/neuron:NoSchedule: the chart's defaults must not tolerate it
    assert pod.spec.node_name == CPU_NODE, f"the operator pod went to {pod.spec.node_name}"
    assert pod.status.phase == "Running"
    assert pod.spec.containers[0].image == "registry.example.com/neuronmodel-operator:test"
    assert pod.spec.service_account_name == find_one(objects["ServiceAccount"], "ServiceAccount")["metadata"]["name"]
    assert not cluster.failed_creates(namespace)
    for crd, existed in crds_before.items():  # Helm applies crds/ first, and skips those that exist
        conditions = cluster.extensions.read_custom_resource_definition(crd).status.conditions
        assert any(c.type == "Established" and c.status == "True" for c in conditions), (crd, existed)
    assert json.loads(helm("status", name, "-n", namespace, "-o", "json").stdout)["info"]["status"] == "deployed"


def test_the_chart_service_account_reconciles_the_tiny_sample(release, cluster, control_plane, namespaces):
    helm, name, namespace, objects, _, _ = release
    (deployment,) = objects["Deployment"]
    assert find(objects.get("ClusterRole", []), "ClusterRole"), "watchNamespaces empty: a ClusterRole"
    assert not objects.get("Role"), "watchNamespaces empty: no Roles"
    with chart_operator(control_plane, cluster, deployment,
                        check={"verb": "watch", "group": GROUP, "resource": PLURAL}) as log:
        models = namespaces()
        body = tiny_sample()
        cluster.apply(models, body)
        model = body["metadata"]["name"]
        ready = cluster.phase(models, model, "Ready")
        status = ready["status"]
        assert status["readyReplicas"] == 1 and status["observedGeneration"] == ready["metadata"]["generation"]
        assert {c["type"]: c["status"] for c in status["conditions"]} == {
            "ArtifactsReady": "True", "Available": "True", "Progressing": "True", "Ready": "True"}
        assert_children(cluster, models, ready)
    assert log.read_text().lstrip().startswith("{"), "the chart's default logFormat is json"


def test_peering_replicas_keep_alive_in_the_chart_peering_object(control_plane, helm_home, namespaces, cluster):
    """replicaCount 2 with peering: both pods on the CPU node; an operator with the chart's env and token writes its
    keep-alive into the chart's ClusterKopfPeering (kopf.dev, from crds/) and reconciles, with no 403."""
    helm = helm_for(control_plane, helm_home, "helm")
    namespace, name = namespaces(), "nmpeer"
    helm.install(name, namespace, {**IMAGE, "replicaCount": 2, "peering": {"enabled": True, "name": "nmpeer"}},
                 "--wait", "--timeout", "120s")
    try:
        objects = installed(helm, name, namespace)
        (deployment,) = objects["Deployment"]
        assert sorted(p.spec.node_name for p in cluster.operator_pods(deployment)) == [CPU_NODE, CPU_NODE]
        (peering,) = objects["ClusterKopfPeering"]
        env = local_env(deployment, namespace)
        assert env["NEURONMODEL_OPERATOR_PEERING"] == peering["metadata"]["name"]
        with chart_operator(control_plane, cluster, deployment,
                            check={"verb": "patch", "group": "kopf.dev", "resource": "clusterkopfpeerings"}):
            cluster.wait_until("a keep-alive in the peering object", lambda: cluster.custom.get_cluster_custom_object(
                "kopf.dev", "v1", "clusterkopfpeerings", peering["metadata"]["name"]).get("status"), 30)
            models = namespaces()
            body = tiny_sample()
            cluster.apply(models, body)
            assert_children(cluster, models, cluster.phase(models, body["metadata"]["name"], "Ready"))
    finally:
        helm.uninstall(name, namespace, check=False)


# --------------------------------------------------------------------------------------------------------------------
# watchNamespaces and the restricted Pod Security Standard

def test_watch_namespaces_under_the_restricted_pod_security_standard(control_plane, helm_home, namespaces, cluster,
                                                                     hub_mirror):
    """Installed (Helm 3) into a restricted namespace, watching only namespace `a` (restricted too), not `b`."""
    helm = helm_for(control_plane, helm_home, "helm3")
    home, a, b = namespaces(RESTRICTED), namespaces(RESTRICTED), namespaces()
    name = "nmwatch"
    values = {**IMAGE, "watchNamespaces": [a]}
    assert pod_security_warnings(control_plane, helm.template(name, home, values)) == ""
    helm.install(name, home, values, "--wait", "--timeout", "120s")
    try:
        objects = installed(helm, name, home)
        (deployment,) = objects["Deployment"]
        # the restricted namespace admitted the operator pod: the ReplicaSet created it
        (pod,) = cluster.operator_pods(deployment)
        assert pod.spec.node_name == CPU_NODE and not cluster.failed_creates(home)
        # RBAC: a Role (and binding) in `a` only, the ClusterRole holds the CRD rules only
        roles = objects.get("Role", [])
        assert [r["metadata"]["namespace"] for r in roles] == [a], [r["metadata"] for r in roles]
        assert [r["metadata"]["namespace"] for r in objects.get("RoleBinding", [])] == [a]
        for role in objects.get("ClusterRole", []):  # cluster-wide: reading CRDs (and namespaces: kopf), no more
            for rule in role["rules"]:
                assert set(rule["resources"]) <= {"customresourcedefinitions", "namespaces"} and \
                    set(rule["verbs"]) <= {"get", "list", "watch"}, f"{role['metadata']['name']} grants {rule}"
        env = local_env(deployment, home)
        assert env.get("NEURONMODEL_OPERATOR_NAMESPACES") == a

        # kopf, when not cluster-wide, lists and watches namespaces (observation.namespace_observer): were that
        # refused, it would retry 9 times over ~55 s before falling back to the exact names; chart_operator checks
        # that no 403 happened
        with chart_operator(control_plane, cluster, deployment, hf_endpoint=hub_mirror.url,
                            check={"namespace": a, "verb": "watch", "group": GROUP, "resource": PLURAL}) as log:
            # hf:// (an emptyDir and a download init container): a hostPath model is refused by restricted (below)
            ignored, served = tiny_sample("hf://HuggingFaceTB/SmolLM2-135M-Instruct"), tiny_sample(
                "hf://HuggingFaceTB/SmolLM2-135M-Instruct")
            cluster.apply(b, ignored)  # first: it has been there longer than `a`'s when `a`'s is Ready
            cluster.apply(a, served)
            model = served["metadata"]["name"]
            try:
                ready = cluster.phase(a, model, "Ready")  # its pod was admitted under restricted, and is Ready
            except AssertionError as exc:
                raise AssertionError(f"{exc}\nthe operator's 403s:\n" + "\n".join(
                    forbidden_lines(log.read_text())[:5])) from None
            assert_children(cluster, a, ready)
            assert not cluster.failed_creates(a)
            runtime_pods = cluster.core.list_namespaced_pod(a, label_selector=f"neuronmodel.dev/name={model}").items
            assert runtime_pods and all(p.status.phase == "Running" for p in runtime_pods)

            # control: the same sample from a hostPath is refused by the namespace's restricted level
            hostpath = tiny_sample()
            hostpath["metadata"]["name"] = "tiny-hostpath"
            cluster.apply(a, hostpath)
            refused = cluster.wait_until("a FailedCreate of the hostPath pod", lambda: [
                m for m in cluster.failed_creates(a) if "tiny-hostpath" in m], 60)
            assert "violates PodSecurity" in refused[0] and "hostPath" in refused[0], refused

            # `b` is not watched: no children, no status, none of kopf's annotations
            time.sleep(2)  # a watch event for `b` would have been handled long before `a`'s model got Ready
            left = cluster.model(b, model)
            assert not left.get("status"), left.get("status")
            assert not [k for k in left["metadata"].get("annotations", {}) if k.startswith("neuronmodel.dev/")
                        or k.startswith("kopf.zalando.org/")]
            assert not cluster.apps.list_namespaced_deployment(b).items
            assert not cluster.core.list_namespaced_service(b).items
            assert [c.metadata.name for c in cluster.core.list_namespaced_config_map(b).items] == ["kube-root-ca.crt"]
    finally:
        helm.uninstall(name, home, check=False)


def test_a_pod_without_run_as_non_root_is_refused_by_the_restricted_namespace(cluster, namespaces, control_plane,
                                                                             helm_home):
    """The controls of the test above: the restricted level is really enforced on this apiserver, and the checks
    there see it: the chart with runAsNonRoot taken out of its values is warned about and its pod refused."""
    namespace = namespaces(RESTRICTED)
    helm = helm_for(control_plane, helm_home, "helm3")
    # null deletes a key of the chart's defaults (Helm merges maps): only runAsNonRoot goes
    rootful = {**IMAGE, "podSecurityContext": {"runAsNonRoot": None}, "securityContext": {"runAsNonRoot": None}}
    warned = pod_security_warnings(control_plane, helm.template("nmroot", namespace, rootful))
    assert "runAsNonRoot" in warned, warned
    helm.install("nmroot", namespace, rootful)
    try:
        refused = cluster.wait_until("the ReplicaSet's FailedCreate", lambda: cluster.failed_creates(namespace), 60)
        assert "violates PodSecurity" in refused[0] and "runAsNonRoot" in refused[0], refused
    finally:
        helm.uninstall("nmroot", namespace)

    restricted_but_root = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root"}, "spec": {
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "main", "image": "busybox", "securityContext": {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}}
    refused = cluster.apply(namespace, restricted_but_root, check=False)
    assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr and "runAsNonRoot" in refused.stderr
    restricted_but_root["spec"]["securityContext"]["runAsNonRoot"] = True  # the one missing field: admitted
    cluster.apply(namespace, restricted_but_root)


# --------------------------------------------------------------------------------------------------------------------
# the rendered chart on the apiserver (dry run)

MONITORING = {"monitoring": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True},
                             "grafanaDashboard": {"enabled": True}, "prometheusAdapterRule": {"enabled": True}}}
RENDERINGS = {
    "defaults": {},
    "watchNamespaces": {"watchNamespaces": ["@a", "@b"]},  # @x: a namespace made for the test
    "peering": {"replicaCount": 2, "peering": {"enabled": True, "name": "neuronmodel"}},
    "monitoring": MONITORING,
}
#: kind -> how many of them (at least) each rendering holds beyond the defaults'
BASE = {"Deployment": 1, "ServiceAccount": 1, "ClusterRole": 1, "ClusterRoleBinding": 1}
EXPECTED = {
    "defaults": BASE,
    "watchNamespaces": {**BASE, "Role": 2, "RoleBinding": 2},
    "peering": {**BASE, "ClusterKopfPeering": 1},
    "monitoring": {**BASE, "ServiceMonitor": 1, "PodMonitor": 1, "Service": 1, "ConfigMap": 2},
}


@pytest.fixture(scope="module")
def chart_crds(install_crds):
    """What Helm does before it applies the templates: the chart's crds/ (the peering objects need kopf's)."""
    install_crds(*CRDS)


@pytest.fixture
def prometheus_operator_crds(install_crds, tmp_path, cluster):
    """ServiceMonitor and PodMonitor (chart_helpers.monitoring_crds: a subset of the real schema), for one test."""
    path = tmp_path / "monitoring-crds.yaml"
    path.write_text(manifest_text(monitoring_crds()))
    install_crds(path)
    yield
    for crd in monitoring_crds():
        cluster.extensions.delete_custom_resource_definition(crd["metadata"]["name"])


@pytest.mark.parametrize("case", sorted(RENDERINGS))
def test_rendered_chart_is_accepted_by_the_apiserver(case, chart_crds, control_plane, helm_home, namespaces, request):
    helm = helm_for(control_plane, helm_home, "helm")
    if case == "monitoring":
        request.getfixturevalue("prometheus_operator_crds")
    namespace = namespaces()
    made = {}
    values = copy.deepcopy(RENDERINGS[case])
    if "watchNamespaces" in values:
        values["watchNamespaces"] = [made.setdefault(n, namespaces()) for n in values["watchNamespaces"]]
    objects = helm.template("nmdry", namespace, values)
    # no -n: the chart names each object's namespace (the release's, or a watched one's), as `kubectl apply -f` of a
    # rendered chart (GitOps) needs; an object without one would land in the kubeconfig's default namespace
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering", "CustomResourceDefinition",
                      "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    assert all(o["metadata"].get("namespace") for o in objects if o["kind"] not in cluster_scoped), \
        [f"{o['kind']}/{o['metadata']['name']}" for o in objects if not o["metadata"].get("namespace")]
    applied = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", stdin=manifest_text(objects),
                                    check=False)
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.count("(server dry run)") == len(objects), applied.stdout
    kinds = [o["kind"] for o in objects]
    missing = {kind: n for kind, n in EXPECTED[case].items() if kinds.count(kind) < n}
    assert not missing, f"{case}: rendered {sorted(kinds)}, expected at least {EXPECTED[case]}"
    if case == "peering":
        assert find_one(objects, "Deployment")["spec"]["replicas"] == 2
    if case == "monitoring":  # control: the monitoring CRDs check what the chart writes into them
        monitor = copy.deepcopy(find_one(objects, "ServiceMonitor"))
        monitor["spec"]["endpoints"][0]["interval"] = "thirty seconds"
        bad = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(monitor), check=False)
        assert bad.returncode != 0 and "interval" in bad.stderr, bad.stderr


# --------------------------------------------------------------------------------------------------------------------
# helm upgrade and helm uninstall

UPGRADE = {**IMAGE, "logFormat": "text", "workers": 4, "podAnnotations": {"example.com/upgraded": "yes"},
           "monitoring": {"grafanaDashboard": {"enabled": True}}}


def _gone(plane, obj: dict) -> bool:
    ref = f"{obj['kind'].lower()}.{obj['apiVersion'].split('/')[0] if '/' in obj['apiVersion'] else ''}".rstrip(".")
    args = ["get", f"{ref}/{obj['metadata']['name']}", "--ignore-not-found", "-o", "name"]
    if "namespace" in obj["metadata"] and obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
        args += ["-n", obj["metadata"]["namespace"]]
    return plane.kubectl(*args).stdout.strip() == ""


@pytest.mark.parametrize("binary", ["helm", "helm3"])
def test_upgrade_changes_the_deployment_and_uninstall_leaves_nothing(binary, control_plane, helm_home, namespaces,
                                                                    cluster):
    helm = helm_for(control_plane, helm_home, binary)
    namespace, name = namespaces(create=False), f"nmup-{binary}"
    helm.install(name, namespace, IMAGE, "--create-namespace", "--wait", "--timeout", "120s")
    (deployment,) = installed(helm, name, namespace)["Deployment"]
    env = local_env(deployment, namespace)
    assert env.get("NEURONMODEL_OPERATOR_LOG_FORMAT") == "json" and env.get("NEURONMODEL_OPERATOR_WORKERS") == "8"

    helm.upgrade(name, namespace, UPGRADE, "--wait", "--timeout", "120s")
    objects = installed(helm, name, namespace)
    (deployment,) = objects["Deployment"]
    live = cluster.apps.read_namespaced_deployment(deployment["metadata"]["name"], namespace)
    env = {e.name: e.value for e in live.spec.template.spec.containers[0].env}
    assert env.get("NEURONMODEL_OPERATOR_LOG_FORMAT") == "text" and env.get("NEURONMODEL_OPERATOR_WORKERS") == "4"
    assert live.spec.template.metadata.annotations.get("example.com/upgraded") == "yes"
    assert json.loads(helm("status", name, "-n", namespace, "-o", "json").stdout)["version"] == 2
    # --wait: the rollout finished: the one operator pod is the new template's
    pods = cluster.wait_until("one operator pod, the upgraded one", lambda: (p := cluster.operator_pods(deployment))
                              and len(p) == 1 and p, 60)
    assert pods[0].metadata.annotations.get("example.com/upgraded") == "yes" and pods[0].spec.node_name == CPU_NODE
    assert objects.get("ConfigMap"), "monitoring.grafanaDashboard.enabled: the dashboard's ConfigMap"
    everything = [o for kind in objects.values() for o in kind]
    instance = {o["metadata"].get("labels", {}).get("app.kubernetes.io/instance") for o in everything}
    assert instance == {name}, "every object of the chart carries app.kubernetes.io/instance"

    helm.uninstall(name, namespace)
    left = [f"{o['kind']}/{o['metadata']['name']}" for o in everything if not _gone(control_plane, o)]
    assert left == [], f"helm uninstall left {left}"
    cluster.wait_until("the operator pod collected", lambda: not cluster.operator_pods(deployment), 60)
    kinds = "deployments,replicasets,pods,services,serviceaccounts,configmaps,roles,rolebindings,clusterroles," \
            "clusterrolebindings"
    labelled = control_plane.kubectl("get", kinds, "-A", "-l", f"app.kubernetes.io/instance={name}", "-o", "name")
    assert labelled.stdout.strip() == "", labelled.stdout
    for crd in CRD_NAMES:  # Helm never deletes crds/
        assert cluster.exists(cluster.extensions.read_custom_resource_definition, crd), crd
