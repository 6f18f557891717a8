"""Helpers for tests of the Helm chart against the real local control plane (`test_chart_install.py`).

- `Helm`: Helm 4 (`helm`) or Helm 3 (`helm3`) from the control plane's cache, with the control plane's admin
  kubeconfig and its own cache/config/data folders (nothing is read from or written to the user's ~/.config/helm);
  values travel as a file, exactly as `-f values.yaml` does for a user.
- `find` / `find_one`: objects of a rendered manifest by kind (and name).
- `token_kubeconfig`: a TokenRequest token for a ServiceAccount the chart created, written into a kubeconfig, once
  the authorizer allows the ServiceAccount what the chart's RBAC gives it (no race with RBAC's caches).
- `local_env`: the env the chart's Deployment sets on the operator container, resolved as the kubelet would
  (fieldRefs to the pod's namespace and name), so the operator can run as a local process with exactly it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any, Iterable, Optional

import yaml

from k8s import install

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "neuronmodel-operator"
CPU_NODE = "kwok-m5-xlarge"  # scripts/k8s/nodes.py: the one node without the aws.amazon.com/neuron taint

#: Lines of the operator's log that report an authorization failure.
FORBIDDEN = re.compile(r"\bForbidden\b|\b403\b|forbidden:")


class Helm:
    """`helm` (4) or `helm3` against `plane`; `home` holds Helm's own folders and the values files."""

    def __init__(self, plane, home: Path, binary: str = "helm"):
        self.plane, self.home, self.binary = plane, Path(home), binary
        self.home.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig),
                    "HELM_CACHE_HOME": str(self.home / "cache"), "HELM_CONFIG_HOME": str(self.home / "config"),
                    "HELM_DATA_HOME": str(self.home / "data")}
        self._values = 0

    def __call__(self, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess:
        out = subprocess.run([str(install.bin_dir() / self.binary), *args], env=self.env, capture_output=True,
                             text=True, timeout=timeout)
        if check and out.returncode:
            raise AssertionError(f"{self.binary} {' '.join(args)} exited {out.returncode}:\n{out.stderr.strip()}")
        return out

    def values_file(self, values: Optional[dict]) -> list[str]:
        if not values:
            return []
        self._values += 1
        path = self.home / f"values-{self._values}.yaml"
        path.write_text(json.dumps(values, indent=1))  # JSON is YAML
        return ["-f", str(path)]

    def template(self, release: str, namespace: str, values: Optional[dict] = None, *extra: str) -> list[dict]:
        out = self("template", release, str(CHART), "-n", namespace, *self.values_file(values), *extra)
        return [doc for doc in yaml.safe_load_all(out.stdout) if doc]

    def install(self, release: str, namespace: str, values: Optional[dict] = None, *extra: str,
                check: bool = True) -> subprocess.CompletedProcess:
        return self("install", release, str(CHART), "-n", namespace, *self.values_file(values), *extra,
                    check=check)

    def upgrade(self, release: str, namespace: str, values: Optional[dict] = None, *extra: str,
                check: bool = True) -> subprocess.CompletedProcess:
        return self("upgrade", release, str(CHART), "-n", namespace, *self.values_file(values), *extra,
                    check=check)

    def uninstall(self, release: str, namespace: str, *extra: str, check: bool = True):
        return self("uninstall", release, "-n", namespace, *extra, check=check)

    def manifest(self, release: str, namespace: str) -> list[dict]:
        """What the release holds on the server (`helm get manifest`): its templates, not its crds/."""
        out = self("get", "manifest", release, "-n", namespace)
        return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def find(objects: Iterable[dict], kind: str, name: Optional[str] = None) -> list[dict]:
    return [o for o in objects if o.get("kind") == kind and (name is None or o["metadata"]["name"] == name)]


def find_one(objects: Iterable[dict], kind: str) -> dict:
    found = find(objects, kind)
    assert len(found) == 1, f"expected one {kind} in the rendered chart, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def operator_container(deployment: dict) -> dict:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"the operator pod has one container, not {[c['name'] for c in containers]}"
    return containers[0]


def local_env(deployment: dict, namespace: str, pod_name: str = "neuronmodel-operator-local") -> dict[str, str]:
    """The operator container's env as the kubelet would give it: plain values, and fieldRefs of the pod."""
    fields = {"metadata.namespace": namespace, "metadata.name": pod_name, "spec.nodeName": CPU_NODE,
              "spec.serviceAccountName": deployment["spec"]["template"]["spec"].get("serviceAccountName", "default")}
    env = {}
    for var in operator_container(deployment).get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
        elif "fieldRef" in var.get("valueFrom", {}):
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            assert path in fields, f"no local stand-in for the fieldRef {path} of {var['name']}"
            env[var["name"]] = fields[path]
        elif "valueFrom" not in var:
            env[var["name"]] = ""
        else:
            raise AssertionError(f"the operator's env var {var['name']} comes from {var['valueFrom']}: no local "
                                 "stand-in (the operator needs no Secret or ConfigMap of its own)")
    return env


def token_kubeconfig(plane, admin_client, namespace: str, service_account: str, path: Path,
                     check: Optional[dict] = None, timeout: float = 60) -> Path:
    """A kubeconfig for `service_account` (TokenRequest); first wait until `check` (resourceAttributes) is allowed."""
    from kubernetes import client as kube

    user = f"system:serviceaccount:{namespace}:{service_account}"
    if check:
        authz = kube.AuthorizationV1Api(admin_client)
        review = {"spec": {"user": user, "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                                                    "system:authenticated"], "resourceAttributes": check}}
        deadline = time.monotonic() + timeout
        while not authz.create_subject_access_review(review).status.allowed:
            if time.monotonic() > deadline:
                raise AssertionError(f"{user} is never allowed {check}")
            time.sleep(0.2)
    token = kube.CoreV1Api(admin_client).create_namespaced_service_account_token(
        service_account, namespace, {"spec": {"audiences": [], "expirationSeconds": 3600}}).status.token
    plane.write_kubeconfig(path, token)
    return path


def forbidden_lines(log_text: str) -> list[str]:
    return [line for line in log_text.splitlines() if FORBIDDEN.search(line)]


def manifest_text(objects: Iterable[dict]) -> str:
    return "\n---\n".join(json.dumps(o) for o in objects)


def as_dict(obj: Any) -> Any:
    """A kubernetes-client model as the API's camelCase dict."""
    from kubernetes import client as kube

    return kube.ApiClient().sanitize_for_serialization(obj)


# --- prometheus-operator's ServiceMonitor and PodMonitor, as far as a chart may use them -----------------------------

#: prometheus-operator's Duration (monitoring.coreos.com/v1): "30s", "1m30s", "0".
DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
_SELECTOR = {"type": "object", "x-kubernetes-map-type": "atomic", "properties": {
    "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
    "matchExpressions": {"type": "array", "items": {"type": "object", "required": ["key", "operator"], "properties": {
        "key": {"type": "string"}, "operator": {"type": "string"},
        "values": {"type": "array", "items": {"type": "string"}}}}}}}
_ENDPOINT = {"type": "object", "properties": {
    "port": {"type": "string"}, "path": {"type": "string"}, "scheme": {"type": "string", "enum": ["http", "https"]},
    "interval": {"type": "string", "pattern": DURATION}, "scrapeTimeout": {"type": "string", "pattern": DURATION},
    "honorLabels": {"type": "boolean"}}}


def monitoring_crds() -> list[dict]:
    """ServiceMonitor and PodMonitor CRDs whose structural schema is a SUBSET of prometheus-operator's v1 schema
    (example/prometheus-operator-crd/monitoring.coreos.com_{servicemonitors,podmonitors}.yaml): the same names,
    types, Duration pattern and required fields (spec, spec.selector) for selector, namespaceSelector, jobLabel,
    target labels and an endpoint's port/path/scheme/interval/scrapeTimeout/honorLabels. Anything else is absent, so
    kubectl's strict field validation rejects a chart field outside that subset (a false alarm to extend here,
    never a silent pass); what they accept, the full CRDs accept too."""
    def crd(kind: str, plural: str, endpoints: str, target_labels: str) -> dict:
        spec = {"type": "object", "required": ["selector"], "properties": {
            "selector": _SELECTOR, "jobLabel": {"type": "string"},
            target_labels: {"type": "array", "items": {"type": "string"}},
            "namespaceSelector": {"type": "object", "properties": {
                "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}},
            endpoints: {"type": "array", "items": _ENDPOINT}}}
        return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{plural}.monitoring.coreos.com"},
                "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                         "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural,
                                   "singular": kind.lower()},
                         "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                             "type": "object", "required": ["spec"], "properties": {"spec": spec}}}}]}}

    return [crd("ServiceMonitor", "servicemonitors", "endpoints", "targetLabels"),
            crd("PodMonitor", "podmonitors", "podMetricsEndpoints", "podTargetLabels")]
