"""Session fixtures for tests against a real local control plane (the code of `make cluster`).

`control_plane` starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (fake
EKS Neuron nodes, `scripts/k8s/nodes.py`) once per session and stops exactly those processes at the
end, at exit, or, if pytest is killed, through PR_SET_PDEATHSIG. The binaries come from
`make k8s-bin` (a dependency of `make test`); without them these tests skip with the reason.

Helpers (session fixtures): `admin_client` (official `kubernetes` client as `system:masters`),
`service_account` (a ServiceAccount bound to a Role, authenticated by a TokenRequest token),
`install_crds` (server-side apply + wait for Established), `wait_until`, `namespace` (per test), `oci_registry`
(a plain-http OCI registry for charts and images, its storage a cache), `hub_mirror` (the HF_ENDPOINT the
operators pin hf:// sources against).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import shutil
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

kubernetes = pytest.importorskip("kubernetes", reason="the `operator` extra is not installed")
from kubernetes import client as kube  # noqa: E402

sys.path[:0] = [str(Path(__file__).resolve().parents[2] / "scripts"), str(Path(__file__).resolve().parent)]
from k8s import cluster, install  # noqa: E402
from k8s.operator_process import OperatorProcess  # noqa: E402
from hub_mirror import HubMirror  # noqa: E402
from k8s.registry import Registry  # noqa: E402
from polling import wait  # noqa: E402

#: Past this size the registry cache is emptied before a session uses it (each image change leaves old layers).
REGISTRY_CACHE_MAX_BYTES = 12 * 2**30


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory) -> cluster.ControlPlane:
    missing = install.missing()
    if missing:
        pytest.skip(f"LOCAL CONTROL PLANE NOT INSTALLED ({', '.join(missing)} missing from "
                    f"{install.cache_dir()}): run `make k8s-bin` once (a cold Go build takes about half an hour)")
    plane = cluster.ControlPlane(tmp_path_factory.mktemp("control-plane"))
    atexit.register(plane.stop, remove=False)
    seconds = plane.start(die_with_parent=True)
    print(f"\ncontrol plane {install.K8S_VERSION} ready in {seconds:.1f} s; logs in {plane.data_dir / 'logs'}")
    yield plane
    plane.stop(remove=False)  # keep the logs in pytest's tmp dir


@pytest.fixture(scope="session")
def oci_registry() -> Registry:
    """A plain-http OCI registry (`k8s.registry`): charts for Helm, images for the real node's containerd.

    Its storage is a cache, `$NEURONMODEL_CACHE/registry`: blobs are content-addressed, so a later session pushes
    only the layers that changed (the runtime image's ~3 GB torch layer once per machine, not once per run). One
    session holds it (an flock); a concurrent session gets a temporary one.
    """
    if "registry" in install.missing():
        pytest.skip(f"no OCI registry in {install.bin_dir()}: run `make k8s-bin` (about 4 min cold)")
    with contextlib.ExitStack() as stack:
        cached = install.cache_root() / "registry"
        cached.parent.mkdir(parents=True, exist_ok=True)
        lock = stack.enter_context(open(cached.with_name("registry.lock"), "w"))
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            data_dir = cached
            if sum(f.stat().st_size for f in cached.rglob("*") if f.is_file()) > REGISTRY_CACHE_MAX_BYTES:
                shutil.rmtree(cached)
        except BlockingIOError:
            data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="neuronmodel-registry-")))
        yield stack.enter_context(Registry(data_dir))


@pytest.fixture(scope="session")
def admin_client(control_plane) -> kube.ApiClient:
    return kubernetes.config.new_client_from_config(config_file=str(control_plane.kubeconfig))


@pytest.fixture(scope="session")
def wait_until():
    """`wait_until(what, fn, timeout=60, diagnose=None)`: polling.wait, poll `fn` until it returns something truthy."""
    return wait


@pytest.fixture
def namespace(admin_client) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    core = kube.CoreV1Api(admin_client)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


@dataclass
class ServiceAccountAccess:
    """What a test needs to act as a ServiceAccount: a client, its token, and a kubeconfig file."""

    client: kube.ApiClient
    token: str
    kubeconfig: Path


@pytest.fixture(scope="session")
def service_account(control_plane, admin_client, wait_until):
    """`service_account(namespace, name, rules=[...])` -> ServiceAccountAccess.

    `rules` are RBAC PolicyRule dicts for a Role bound to the ServiceAccount (none: no rights).
    Returns once the authorizer allows the first rule, so a test never races RBAC's caches.
    """
    core, rbac = kube.CoreV1Api(admin_client), kube.RbacAuthorizationV1Api(admin_client)

    def create(namespace: str, name: str, rules: list[dict] = ()) -> ServiceAccountAccess:
        core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
        if rules:
            rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": list(rules)})
            rbac.create_namespaced_role_binding(namespace, {
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
            first = rules[0]
            review = {"spec": {"user": f"system:serviceaccount:{namespace}:{name}", "resourceAttributes": {
                "namespace": namespace, "verb": first["verbs"][0], "group": first["apiGroups"][0],
                "resource": first["resources"][0]}}}
            authz = kube.AuthorizationV1Api(admin_client)
            wait_until(f"RBAC for {name}", lambda: authz.create_subject_access_review(review).status.allowed)
        token = core.create_namespaced_service_account_token(
            name, namespace, {"spec": {"audiences": [], "expirationSeconds": 3600}}).status.token
        kubeconfig = control_plane.data_dir / f"{namespace}-{name}.kubeconfig"
        control_plane.write_kubeconfig(kubeconfig, token)
        return ServiceAccountAccess(kubernetes.config.new_client_from_config(config_file=str(kubeconfig)),
                                    token, kubeconfig)

    return create


@pytest.fixture(scope="session")
def install_crds(control_plane, admin_client, wait_until):
    """`install_crds(*paths)`: server-side apply CRD manifests and wait until they are Established."""
    extensions = kube.ApiextensionsV1Api(admin_client)

    def established(name: str) -> bool:
        conditions = extensions.read_custom_resource_definition(name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    def apply(*paths: Path) -> None:
        for path in paths:
            applied = control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-o", "name",
                                            "--field-manager=neuronmodel-tests", "-f", str(path)).stdout.split()
            for name in (ref.split("/", 1)[1] for ref in applied):
                wait_until(f"CRD {name} Established", lambda name=name: established(name))

    return apply


ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "neuronmodels.neuronmodel.dev.yaml"
RBAC_RULES = ROOT / "rbac" / "operator-rules.yaml"
TEST_IMAGE = "neuronmodel-runtime:test"


@pytest.fixture(scope="session")
def neuronmodel_crd(install_crds) -> Path:
    install_crds(CRD)
    return CRD


@pytest.fixture(scope="session")
def operator_rbac(control_plane, admin_client, wait_until) -> ServiceAccountAccess:
    """The operator's ServiceAccount bound to exactly rbac/operator-rules.yaml (cluster-wide) and nothing else, under
    the chart's write guard (templates/rbac/write-guard.yaml): every operator test shows it needs no more."""
    import yaml

    rules = yaml.safe_load(RBAC_RULES.read_text())
    core, rbac = kube.CoreV1Api(admin_client), kube.RbacAuthorizationV1Api(admin_client)
    namespace, name = "neuronmodel-system", "neuronmodel-operator"
    core.create_namespace({"metadata": {"name": namespace}})
    core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    for suffix, role_rules in (("", rules["namespaced"]), ("-cluster", rules["cluster"])):
        rbac.create_cluster_role({"metadata": {"name": name + suffix}, "rules": role_rules})
        rbac.create_cluster_role_binding({
            "metadata": {"name": name + suffix},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name + suffix},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
    review = {"spec": {"user": f"system:serviceaccount:{namespace}:{name}", "resourceAttributes": {
        "verb": "watch", "group": "apiextensions.k8s.io", "resource": "customresourcedefinitions"}}}
    authz = kube.AuthorizationV1Api(admin_client)
    wait_until("operator RBAC", lambda: authz.create_subject_access_review(review).status.allowed)
    token = core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"audiences": [], "expirationSeconds": 7200}}).status.token
    kubeconfig = control_plane.data_dir / "operator.kubeconfig"
    control_plane.write_kubeconfig(kubeconfig, token)
    access = ServiceAccountAccess(kubernetes.config.new_client_from_config(config_file=str(kubeconfig)), token,
                                  kubeconfig)
    install_write_guard(control_plane, access, namespace, name, wait_until)
    return access


def write_guard_manifests(namespace: str, service_account: str) -> str:
    """The chart's write guard (a ValidatingAdmissionPolicy and its binding) for this ServiceAccount, as Helm
    renders it."""
    return subprocess.run(
        [str(install.bin_dir() / "helm"), "template", "neuronmodel", str(ROOT / "charts" / "neuronmodel-operator"),
         "--namespace", namespace, "--set", f"serviceAccount.name={service_account}",
         "--show-only", "templates/rbac/write-guard.yaml"],
        capture_output=True, text=True, check=True).stdout


def install_write_guard(plane, access: ServiceAccountAccess, namespace: str, service_account: str,
                        wait_until) -> None:
    """Apply the write guard; return once the API server enforces it (a dry-run write in kube-system, which RBAC
    allows the operator, is refused): policies take effect asynchronously."""
    plane.kubectl("apply", "--server-side", "--field-manager=neuronmodel-tests", "-f", "-",
                  stdin=write_guard_manifests(namespace, service_account))
    core = kube.CoreV1Api(access.client)

    def refused() -> bool:
        try:
            core.create_namespaced_config_map("kube-system", {"metadata": {"generateName": "guard-probe-"}},
                                              dry_run="All")
        except kube.ApiException as exc:
            return exc.status == 403 and "write-guard" in (exc.body or "")
        return False

    wait_until("the operator's write guard enforced", refused)


@pytest.fixture(scope="session")
def hub_mirror() -> HubMirror:
    """The Hub mirror (HF_ENDPOINT) every operator of the session pins hf:// sources against."""
    mirror = HubMirror()
    yield mirror
    mirror.close()


@pytest.fixture(scope="module")
def operator(neuronmodel_crd, operator_rbac, control_plane, hub_mirror) -> OperatorProcess:
    """The operator, running for one test module (tests that stop it start it again): an operator left running
    would reconcile the NeuronModels of later modules that test the API server alone (test_kubectl_ux.py)."""
    process = OperatorProcess(operator_rbac.kubeconfig, control_plane.data_dir / "logs" / "operator.log",
                              TEST_IMAGE, "--verbose", env={"HF_ENDPOINT": hub_mirror.url})
    process.start(timeout=60)
    yield process
    process.stop()


GROUP, VERSION, PLURAL = "neuronmodel.dev", "v1alpha1", "neuronmodels"


@pytest.fixture
def api(admin_client, control_plane, operator, namespace, wait_until):
    return Api(admin_client, control_plane, namespace, wait_until)


class Api:
    """What a test does as a user: apply, read, wait, with the admin's client."""

    def __init__(self, client, plane, namespace, wait_until):
        self.custom, self.apps = kube.CustomObjectsApi(client), kube.AppsV1Api(client)
        self.core, self.batch = kube.CoreV1Api(client), kube.BatchV1Api(client)
        self.plane, self.ns, self.wait_until = plane, namespace, wait_until

    def apply(self, body: dict) -> None:
        self.plane.kubectl("apply", "--server-side", "--field-manager=test-user", "-n", self.ns, "-f", "-",
                           stdin=json.dumps(body))

    def get(self, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def patch(self, name: str, spec: dict) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name, {"spec": spec})

    def phase(self, name: str, phase: str, timeout: float = 90) -> dict:
        def reached():
            body = self.get(name)
            return body if body.get("status", {}).get("phase") == phase else None
        try:
            return self.wait_until(f"{name} {phase}", reached, timeout)
        except TimeoutError:
            raise AssertionError(f"{name} never reached {phase}: status {self.get(name).get('status')}") from None

    def deployment(self, name: str):
        try:
            return self.apps.read_namespaced_deployment(name, self.ns)
        except kube.exceptions.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def events(self, name: str, kind: str = "NeuronModel") -> list:
        """Events about one object: by default the model itself, not the API server's own notes on its children
        (its ClusterIP repair loop can warn about any Service just created, whatever the operator did)."""
        selector = f"involvedObject.name={name},involvedObject.kind={kind}"
        return self.core.list_namespaced_event(self.ns, field_selector=selector).items

    def warning(self, name: str, reason: str, timeout: float = 30, contains: str = "") -> str:
        """Wait for the operator's Warning Event about the model: kopf posts Events from a queue of its own, so one
        follows the status patch it explains by a moment. Its message."""
        def posted():
            return next((e.message for e in self.events(name)
                         if e.type == "Warning" and e.reason == reason and contains in e.message), None)
        return self.wait_until(f"a {reason} Warning Event about {name}", posted, timeout)


