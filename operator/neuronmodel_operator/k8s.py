"""The only module that talks to the Kubernetes API: server-side apply, get, list, delete, status, events.

Objects travel as plain camelCase dicts (what the builders make and the API returns): no model classes, so a
reconcile costs what its HTTP requests cost. Children are applied with server-side apply under the field manager
`neuronmodel-operator`, forcing conflicts: the operator owns the fields it sets, and a hand edit of one of them is
undone by the next apply. The official client is synchronous; `Kube` is used from worker threads.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Optional
from urllib.parse import quote

import kubernetes

from neuronmodel_operator import api, ownership


@dataclass(frozen=True)
class Kind:
    prefix: str  # "/api/v1" or "/apis/<group>/<version>"
    plural: str


#: Every kind the operator reads or writes.
KINDS = {
    "ConfigMap": Kind("/api/v1", "configmaps"),
    "Service": Kind("/api/v1", "services"),
    "Pod": Kind("/api/v1", "pods"),
    "Event": Kind("/api/v1", "events"),
    "Deployment": Kind("/apis/apps/v1", "deployments"),
    "ReplicaSet": Kind("/apis/apps/v1", "replicasets"),
    "StatefulSet": Kind("/apis/apps/v1", "statefulsets"),
    "Job": Kind("/apis/batch/v1", "jobs"),
    "PodDisruptionBudget": Kind("/apis/policy/v1", "poddisruptionbudgets"),
    "HorizontalPodAutoscaler": Kind("/apis/autoscaling/v2", "horizontalpodautoscalers"),
    "LeaderWorkerSet": Kind("/apis/leaderworkerset.x-k8s.io/v1", "leaderworkersets"),
    "ResourceClaimTemplate": Kind("/apis/resource.k8s.io/v1", "resourceclaimtemplates"),
    api.KIND: Kind(f"/apis/{api.API_VERSION}", api.PLURAL),
}


#: What to do when the API server does not serve a kind's API (404 on apply): the CRD or the Kubernetes version.
MISSING_API_FIX = {
    "LeaderWorkerSet": "install LeaderWorkerSet (its CRD and controller, kubernetes-sigs/lws; docs/eks.md) for "
                       "models with spec.parallelism.nodes > 1",
    "ResourceClaimTemplate": "DRA's resource.k8s.io/v1 needs Kubernetes 1.34 or later; or set "
                             "spec.deviceAllocation devicePlugin",
}

#: details.causes[].type of the API server's refusal to create in a namespace being deleted (core/v1).
NAMESPACE_TERMINATING_CAUSE = "NamespaceTerminating"


class ApiError(Exception):
    """A failed API call: `status` is the HTTP status (0 for a network error), `message` the server's reason,
    `causes` the types of the Status's details.causes (a StatusCause's type is its JSON "reason")."""

    def __init__(self, status: int, message: str, causes: tuple[str, ...] = ()):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.causes = causes

    @property
    def namespace_terminating(self) -> bool:
        """The 403 that NamespaceLifecycle admission answers every create in a namespace being deleted with: no RBAC
        drift, and nothing to retry (the namespace's objects go with it)."""
        return self.status == 403 and NAMESPACE_TERMINATING_CAUSE in self.causes

    @property
    def admission(self) -> Optional[str]:
        """The admission webhook or ValidatingAdmissionPolicy that denied the request, None if none did."""
        return ownership.admission(self.message) if 400 <= self.status < 500 else None

    @property
    def retryable(self) -> bool:
        """Conflicts, throttling, server errors and the network heal by themselves, and so does a 401/403 (RBAC that
        lags a fresh install, or is fixed later: the spec is not at fault); 4xx validation does not, nor an
        admission policy's 403 (a child it refuses is reported as such, then retried with backoff)."""
        return (self.status in (0, 401, 403, 409, 429) or self.status >= 500) and self.admission is None


def connect(kubeconfig: Optional[str] = None, pool_size: int = 16) -> kubernetes.client.ApiClient:
    """A client from the in-cluster ServiceAccount, else from KUBECONFIG / ~/.kube/config (or `kubeconfig`)."""
    configuration = kubernetes.client.Configuration()
    try:
        if kubeconfig:
            raise kubernetes.config.ConfigException("explicit kubeconfig")
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    return kubernetes.client.ApiClient(configuration)


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Kube:
    def __init__(self, client: kubernetes.client.ApiClient, field_manager: str = api.FIELD_MANAGER,
                 timeout_s: float = 30.0):
        self._client = client
        self._field_manager = field_manager
        self._timeout_s = timeout_s

    def _call(self, method: str, path: str, query: Optional[dict] = None, body: Any = None,
              content_type: str = "application/json", absent_ok: bool = True) -> Optional[dict]:
        """One request; the decoded JSON body, None for 404 (`absent_ok`), ApiError for anything else that
        failed."""
        url = self._client.configuration.host + path
        if query:
            url += "?" + "&".join(f"{key}={quote(str(value), safe='')}" for key, value in query.items())
        headers = {"Accept": "application/json", "Content-Type": content_type,
                   "User-Agent": api.OPERATOR_NAME}
        self._client.update_params_for_auth(headers, None, ["BearerToken"], path, method, body)
        try:
            response = self._client.call_api(method, url, header_params=headers, body=body,
                                             _request_timeout=self._timeout_s)
            response.read()
        except kubernetes.client.exceptions.ApiException as exc:  # the client's network errors
            raise ApiError(exc.status or 0, str(exc.reason)) from None
        except OSError as exc:
            raise ApiError(0, str(exc)) from None
        if response.status == 404 and absent_ok:
            return None
        try:
            data = json.loads(response.data) if response.data else {}
        except ValueError:  # "404 page not found": the path of an API group the server does not serve at all
            data = response.data.decode(errors="replace").strip()
            if response.status < 300:
                raise ApiError(response.status, f"an answer that is not JSON: {data[:200]}") from None
        if response.status >= 300:
            if not isinstance(data, dict):
                raise ApiError(response.status, str(data))
            causes = ((data.get("details") or {}).get("causes")) or []
            raise ApiError(response.status, data.get("message", response.reason),
                           tuple(str(cause.get("reason", "")) for cause in causes if isinstance(cause, dict)))
        return data

    @staticmethod
    def _path(kind: str, namespace: str, name: Optional[str] = None, sub: Optional[str] = None) -> str:
        spec = KINDS[kind]
        path = f"{spec.prefix}/namespaces/{namespace}/{spec.plural}"
        if name:
            path += f"/{name}"
        if sub:
            path += f"/{sub}"
        return path

    def apply(self, manifest: dict, field_manager: Optional[str] = None) -> dict:
        """Server-side apply `manifest` (force: our fields are ours) as `field_manager` (default the operator's);
        the object as stored, with its status."""
        meta, kind = manifest["metadata"], manifest["kind"]
        path = self._path(kind, meta["namespace"], meta["name"])
        try:
            return self._call("PATCH", path, {"fieldManager": field_manager or self._field_manager, "force": "true"},
                              manifest, content_type="application/apply-patch+yaml", absent_ok=False)
        except ApiError as exc:
            if exc.status != 404:
                raise
            # An apply creates what is missing: a 404 is the API itself missing (a CRD not installed), never a
            # success with nothing applied.
            fix = MISSING_API_FIX.get(kind, "is its CustomResourceDefinition installed?")
            raise ApiError(404, f"{kind} {manifest['apiVersion']} is not served by this cluster (404 on apply to "
                                f"{path}: {exc.message}): {fix}") from None

    def get(self, kind: str, namespace: str, name: str) -> Optional[dict]:
        return self._call("GET", self._path(kind, namespace, name))

    def get_crd(self, name: str) -> Optional[dict]:
        """A CustomResourceDefinition (cluster-scoped: not one of KINDS); None when it is not installed."""
        return self._call("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")

    def get_peering(self, name: str, namespace: Optional[str]) -> Optional[dict]:
        """kopf's peering object: the KopfPeering in `namespace`, the ClusterKopfPeering for None."""
        where = f"namespaces/{namespace}/kopfpeerings" if namespace else "clusterkopfpeerings"
        return self._call("GET", f"/apis/kopf.dev/v1/{where}/{name}")

    def list(self, kind: str, namespace: str, selector: str) -> list[dict]:
        found = self._call("GET", self._path(kind, namespace), {"labelSelector": selector})
        return found["items"] if found else []

    def delete(self, kind: str, namespace: str, name: str) -> None:
        """Delete, letting the garbage collector remove what it owns in the background; gone already is fine."""
        self._call("DELETE", self._path(kind, namespace, name), body={"propagationPolicy": "Background"})

    def patch_status(self, namespace: str, name: str, status: dict) -> Optional[dict]:
        """Merge-patch the NeuronModel's status subresource (None when the object is gone)."""
        return self._call("PATCH", self._path(api.KIND, namespace, name, "status"), body={"status": status},
                          content_type="application/merge-patch+json")

    def event(self, owner: dict, type_: str, reason: str, message: str) -> None:
        """A core/v1 Event on `owner` (the NeuronModel), as `kubectl describe nm` shows it."""
        meta = owner["metadata"]
        stamp = now_rfc3339()
        self._call("POST", self._path("Event", meta["namespace"]), body={
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": api.OPERATOR_NAME}, "reportingComponent": api.OPERATOR_NAME,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1})
