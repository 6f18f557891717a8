"""Helpers of the real end-to-end test (`test_end_to_end.py`): manifests, HTTP, and the startup timings.

Timings come from the objects' own timestamps (the pod's creation, PodScheduled, the image's Pulling/Pulled
Events, the container's startedAt, Ready) plus the runtime's `/v1/info` `startup.load_s`, against the wall-clock
time of `kubectl apply`; the first HTTP answer is polled from the host through the Service's ClusterIP (kube-proxy
serves ClusterIPs on the host too). They are printed, never asserted.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import datetime
from typing import Any, Optional

from k8s import realnode

GROUP_VERSION = "neuronmodel.dev/v1alpha1"
#: Pods for the real node: its label selected (the kwok m5 node matches the instance type too), its taint tolerated.
ON_REAL_NODE = {"nodeSelector": {"neuronmodel.dev/real-node": "true"}, "tolerations": [realnode.TOLERATION]}
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted",
              "pod-security.kubernetes.io/enforce-version": "latest", "pod-security.kubernetes.io/warn": "restricted"}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8,
        "temperature": 0}


def neuron_model(name: str, namespace: str, source: str, **spec: Any) -> dict:
    """The tiny model on the torch reference runner, on the real node, with small resources."""
    return {"apiVersion": GROUP_VERSION, "kind": "NeuronModel", "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": {"source": source, "servedModelName": "tiny", "dtype": "float32"},
                     "framework": "torch", "replicas": 1,
                     "batching": {"maxBatchSize": 4, "maxContextLength": 256, "maxSeqLen": 512},
                     "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
                     **ON_REAL_NODE, **spec}}


def host_path_volume(name: str, path: str, node: str, claim_namespace: str, access: str, size: str = "1Gi") -> list:
    """A hostPath-backed PersistentVolume pinned to `node` (nodeAffinity) and the claim bound to it."""
    return [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{claim_namespace}-{name}"},
         "spec": {"capacity": {"storage": size}, "accessModes": [access], "storageClassName": "e2e-host-path",
                  "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": path, "type": "Directory"},
                  "claimRef": {"namespace": claim_namespace, "name": name},
                  "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                      {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": claim_namespace},
         "spec": {"accessModes": [access], "storageClassName": "e2e-host-path",
                  "volumeName": f"{claim_namespace}-{name}", "resources": {"requests": {"storage": size}}}},
    ]


def client_pod(name: str, image: str) -> dict:
    """A restricted busybox pod (wget) on the real node, to call Services from inside the cluster."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        **ON_REAL_NODE, "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "main", "image": image, "command": ["sleep", "3600"],
                        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}}]}}


class Kubectl:
    """The control plane's admin kubectl, JSON in and out."""

    def __init__(self, plane):
        self.plane = plane

    def __call__(self, *args: str, stdin: Optional[str] = None, check: bool = True):
        return self.plane.kubectl(*args, stdin=stdin, check=check)

    def apply(self, *objects: dict, namespace: Optional[str] = None) -> None:
        self("apply", *(["-n", namespace] if namespace else []), "-f", "-",
             stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}))

    def get(self, kind: str, name: str = "", namespace: Optional[str] = None, selector: Optional[str] = None) -> Any:
        args = ["get", kind, *([name] if name else []), "-o", "json"]
        args += ["-n", namespace] if namespace else []
        args += ["-l", selector] if selector else []
        out = self(*args, check=False)
        if out.returncode:
            if "NotFound" in out.stderr:
                return None
            raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
        body = json.loads(out.stdout)
        return body["items"] if "items" in body and not name else body

    def events(self, namespace: str, name: Optional[str] = None) -> list[dict]:
        selector = ["--field-selector", f"involvedObject.name={name}"] if name else []
        return json.loads(self("get", "events", "-n", namespace, *selector, "-o", "json").stdout)["items"]


def http(url: str, body: Optional[dict] = None, timeout: float = 30) -> tuple[int, Any]:
    """(status, decoded JSON or text) of GET/POST `url`; (0, error text) when nothing answered."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            raw = resp.read().decode()
            status = resp.status
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")
    except OSError as err:
        return 0, str(err)
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def condition(obj: dict, kind: str) -> Optional[dict]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


def is_true(obj: dict, kind: str) -> bool:
    found = condition(obj, kind)
    return bool(found) and found["status"] == "True"


def ts(value: Optional[str]) -> Optional[float]:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None


def pod_timings(pod: dict, events: list[dict], applied: float, load_s: Optional[float],
                first_answer: Optional[float]) -> dict[str, Optional[float]]:
    """Seconds from `applied` (wall clock) to each step of one pod's start, and each step's own share.

    schedule: the pod's PodScheduled; image: the kubelet's Pulled Event (the pull itself from Pulling to Pulled);
    started: the runtime container's startedAt; load: the runtime's own `startup.load_s` (the runner's load);
    ready: the pod's Ready condition; answer: the first HTTP answer through the Service (the host's clock).
    """
    name = pod["metadata"]["name"]
    mine = [e for e in events if e["involvedObject"].get("name") == name]

    def event(reason: str) -> Optional[float]:
        stamps = [ts(e.get("lastTimestamp") or e.get("eventTime") or e["metadata"]["creationTimestamp"])
                  for e in mine if e.get("reason") == reason]
        return min(stamps) if stamps else None

    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    runtime = next((s for s in statuses if s["name"] == "runtime"), {})
    state = runtime.get("state", {}).get("running") or {}
    created = ts(pod["metadata"]["creationTimestamp"])
    scheduled = ts((condition(pod, "PodScheduled") or {}).get("lastTransitionTime"))
    pulling, pulled = event("Pulling"), event("Pulled")
    started = ts(state.get("startedAt"))
    ready = ts((condition(pod, "Ready") or {}).get("lastTransitionTime"))

    def since(t: Optional[float]) -> Optional[float]:
        return None if t is None else round(t - applied, 1)

    return {"pod created": since(created), "scheduled": since(scheduled),
            "image pull": round(pulled - pulling, 1) if pulling and pulled else 0.0,
            "container started": since(started), "model load (runtime)": load_s,
            "ready": since(ready), "first HTTP answer": since(first_answer)}


def print_timings(title: str, timings: dict[str, Optional[float]]) -> None:
    cells = ", ".join(f"{k} {'-' if v is None else f'{v:.1f} s'}" for k, v in timings.items())
    print(f"\nTIMINGS {title}: {cells}", flush=True)
