"""The chart as an OCI artifact: `make chart` packages it, Helm 4 and Helm 3 push it to a local OCI registry (the
CNCF distribution registry, scripts/k8s/registry.py) and read it back, and each installs it from oci:// into the
real control plane: the operator's Deployment, ServiceAccount and RBAC exist, run as the operator image's user, and
go away with the release. The CRDs come from the chart's crds/ (Helm skips those that exist, as other tests may
have installed the NeuronModel CRD already, and never deletes them).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from k8s import install

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "charts" / "neuronmodel-operator"
CHART = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text()) if (CHART_DIR / "Chart.yaml").exists() else {}
NAME, VERSION = CHART.get("name", "neuronmodel-operator"), str(CHART.get("version", ""))
HELMS = ("helm", "helm3")  # Helm 4 and Helm 3, from install.bin_dir()
HELM_CONFIG = "application/vnd.cncf.helm.config.v1+json"
HELM_CONTENT = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
NEURONMODEL_CRD = "neuronmodels.neuronmodel.dev"
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding"}


def operator_image_user() -> str:
    """The Dockerfile's `operator` target's USER: the chart's pods must run as it."""
    stage = re.search(r"^FROM \S+ AS operator$(.*?)(?=^FROM |\Z)", (ROOT / "Dockerfile").read_text(), re.M | re.S)
    assert stage, "the Dockerfile has no `operator` target"
    return re.findall(r"^USER (\S+)$", stage.group(1), re.M)[-1]


@dataclass
class Helm:
    """One Helm binary with its own config, cache and data folders (no user's repositories or registry logins)."""

    binary: str
    home: Path

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        env = {**os.environ, "HELM_CONFIG_HOME": str(self.home / "config"), "HELM_CACHE_HOME": str(self.home / "cache"),
               "HELM_DATA_HOME": str(self.home / "data")}
        env.pop("KUBECONFIG", None)  # every cluster call names --kubeconfig
        out = subprocess.run([str(install.bin_dir() / self.binary), *args], env=env, capture_output=True, text=True,
                             timeout=180)
        if check and out.returncode:
            raise AssertionError(f"{self.binary} {' '.join(args)} exited {out.returncode}:\n{out.stderr}")
        return out


@pytest.fixture(scope="module")
def helms(tmp_path_factory) -> dict[str, Helm]:
    missing = [h for h in HELMS if not (install.bin_dir() / h).exists()]
    if missing:
        pytest.skip(f"{', '.join(missing)} not in {install.bin_dir()}: run `make k8s-bin`")
    if not CHART:
        pytest.skip(f"no chart at {CHART_DIR}")
    return {h: Helm(h, tmp_path_factory.mktemp(f"{h}-home")) for h in HELMS}


@pytest.fixture(scope="module")
def packaged(tmp_path_factory) -> Path:
    """`make chart` into a temporary folder (k8s-bin is taken as done: the fixtures above checked the binaries)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    dest = tmp_path_factory.mktemp("charts")
    out = subprocess.run(["make", "-s", "-o", "k8s-bin", "chart", f"CHART_DEST={dest}", f"PY={sys.executable}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return dest / f"{NAME}-{VERSION}.tgz"


@pytest.fixture(scope="module")
def pushed(helms, oci_registry, packaged) -> dict[str, str]:
    """Each Helm pushes the package to a repository of its own: Helm -> the chart's oci:// reference."""
    refs = {}
    for name, helm in helms.items():
        out = helm("push", str(packaged), f"oci://{oci_registry.address}/{name}", "--plain-http")
        assert "Digest: sha256:" in out.stdout + out.stderr, out.stdout + out.stderr
        refs[name] = f"oci://{oci_registry.address}/{name}/{NAME}"
    return refs


def test_make_chart_packages_the_chart_with_its_crds(helms, packaged):
    assert packaged.is_file(), f"make chart wrote no {packaged.name}"
    with tarfile.open(packaged) as tar:
        members = set(tar.getnames())
        packaged_chart = yaml.safe_load(tar.extractfile(f"{NAME}/Chart.yaml").read())
    assert packaged_chart == CHART
    assert f"{NAME}/crds/{NEURONMODEL_CRD}.yaml" in members and f"{NAME}/values.schema.json" in members


@pytest.mark.parametrize("pusher", HELMS)
def test_the_registry_holds_what_each_helm_pushed_as_a_helm_chart(pushed, oci_registry, pusher):
    repository = pushed[pusher].split("/", 3)[3]
    assert oci_registry.tags(repository) == [VERSION]
    request = urllib.request.Request(f"{oci_registry.url}/v2/{repository}/manifests/{VERSION}",
                                     headers={"Accept": OCI_MANIFEST})
    with urllib.request.urlopen(request, timeout=10) as response:
        manifest = json.loads(response.read())
    assert manifest["config"]["mediaType"] == HELM_CONFIG
    assert [layer["mediaType"] for layer in manifest["layers"]] == [HELM_CONTENT]


@pytest.mark.parametrize("pusher", HELMS)
@pytest.mark.parametrize("reader", HELMS)
def test_helm_show_chart_from_oci_is_our_chart_yaml(helms, pushed, reader, pusher):
    shown = helms[reader]("show", "chart", pushed[pusher], "--version", VERSION, "--plain-http").stdout
    assert yaml.safe_load(shown) == CHART


def _objects(manifest: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


def _get_args(o: dict, namespace: str) -> list[str]:
    return [o["kind"], o["metadata"]["name"], *([] if o["kind"] in CLUSTER_SCOPED else ["-n", namespace])]


@pytest.mark.parametrize(("installer", "pusher"), [("helm", "helm3"), ("helm3", "helm")])
def test_helm_installs_the_chart_from_oci_and_uninstalls_it(helms, pushed, control_plane, installer, pusher):
    helm, release = helms[installer], f"oci-{installer}"
    namespace, kubeconfig = f"chart-{release}", f"--kubeconfig={control_plane.kubeconfig}"
    helm("install", release, pushed[pusher], "--version", VERSION, "--plain-http", "-n", namespace,
         "--create-namespace", kubeconfig)
    try:
        objects = _objects(helm("get", "manifest", release, "-n", namespace, kubeconfig).stdout)
        kinds = {o["kind"] for o in objects}
        assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"} <= kinds, kinds
        for o in objects:  # every object of the release is on the server
            control_plane.kubectl("get", *_get_args(o, namespace))
        (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
        live = json.loads(control_plane.kubectl("get", "deployment", deployment["metadata"]["name"], "-n",
                                                namespace, "-o", "json").stdout)
        pod = live["spec"]["template"]["spec"]
        (service_account,) = [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"]
        assert pod["serviceAccountName"] == service_account
        (container,) = pod["containers"]
        assert container["image"] == f"ghcr.io/neuronmodel/neuronmodel-operator:{CHART['appVersion']}"
        security = container["securityContext"]
        uid, gid = operator_image_user().split(":")
        assert (security["runAsUser"], security["runAsGroup"]) == (int(uid), int(gid)), "the image's USER"
        assert security["readOnlyRootFilesystem"] is True
        bindings = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
        assert all({"kind": "ServiceAccount", "name": service_account, "namespace": namespace} in b["subjects"]
                   for b in bindings)
        crd = control_plane.kubectl("get", "crd", NEURONMODEL_CRD, "-o", "jsonpath={.spec.group}").stdout
        assert crd == "neuronmodel.dev"
    finally:
        uninstalled = helm("uninstall", release, "-n", namespace, "--wait", kubeconfig, check=False)
    assert uninstalled.returncode == 0, uninstalled.stderr
    for o in objects:
        gone = control_plane.kubectl("get", *_get_args(o, namespace), "--ignore-not-found", "-o", "name")
        assert gone.stdout.strip() == "", f"{o['kind']} {o['metadata']['name']} outlived its release"
    assert control_plane.kubectl("get", "crd", NEURONMODEL_CRD, "-o", "name").stdout.strip(), "Helm keeps crds/"
    control_plane.kubectl("delete", "namespace", namespace, "--wait=false")
