"""The LeaderWorkerSet controller on the host: its configuration file and its webhook registrations.

Upstream runs the controller in-cluster behind a Service and rotates its own webhook certificate; here it
runs as a local process, so the registrations call `https://127.0.0.1:<port>` with the test CA, and the pod
webhooks only see LWS pods (the objectSelector of upstream's config/webhook patches). The webhooks must
run: they label LWS pods (group and worker index), which the LWS pod controller relies on.
"""

from __future__ import annotations

import base64
from pathlib import Path

LWS_POD_SELECTOR = {"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]}
LWS_RULE = {"apiGroups": ["leaderworkerset.x-k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
            "resources": ["leaderworkersets"]}
POD_RULE = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["pods"]}

# (kind, webhook name, path served by the controller, rule, objectSelector) from upstream config/webhook/
WEBHOOKS = [
    ("MutatingWebhookConfiguration", "mleaderworkerset.kb.io", "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
     LWS_RULE, None),
    ("MutatingWebhookConfiguration", "mpod.kb.io", "/mutate--v1-pod", POD_RULE, LWS_POD_SELECTOR),
    ("ValidatingWebhookConfiguration", "vleaderworkerset.kb.io",
     "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset", LWS_RULE, None),
    ("ValidatingWebhookConfiguration", "vpod.kb.io", "/validate--v1-pod", POD_RULE, LWS_POD_SELECTOR),
]


def controller_config(webhook_port: int, health_port: int, cert_dir: Path) -> dict:
    """The controller's `--config` (config.lws.x-k8s.io/v1alpha1); JSON is YAML."""
    return {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},  # off
    }


def webhook_configurations(webhook_port: int, ca_file: Path) -> dict:
    """A v1 List of the mutating and validating configurations, ready for `kubectl apply`."""
    ca_bundle = base64.b64encode(ca_file.read_bytes()).decode()
    configs: dict[str, dict] = {}
    for kind, name, path, rule, selector in WEBHOOKS:
        webhook = {"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
                   "clientConfig": {"url": f"https://127.0.0.1:{webhook_port}{path}", "caBundle": ca_bundle},
                   "rules": [rule]}
        if selector:
            webhook["objectSelector"] = selector
        configs.setdefault(kind, {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                                  "metadata": {"name": f"lws-{kind.removesuffix('WebhookConfiguration').lower()}"},
                                  "webhooks": []})["webhooks"].append(webhook)
    return {"apiVersion": "v1", "kind": "List", "items": list(configs.values())}
