"""The ClusterIP Service in front of the serving pods (leaders only when nodes > 1), and the endpoint URL."""

from __future__ import annotations

from typing import Any

from neuronmodel_operator import api
from neuronmodel_operator.builders.common import COMPONENT_SERVER, Target, metadata, serving_selector


def service(target: Target) -> dict[str, Any]:
    """`<name>`: port spec.server.port, named http, to the pods' http port."""
    port = {"name": api.SERVER_PORT_NAME, "port": target.spec.server.port, "targetPort": api.SERVER_PORT_NAME,
            "protocol": "TCP"}
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata(target, target.name, COMPONENT_SERVER),
            "spec": {"type": "ClusterIP", "selector": serving_selector(target), "ports": [port]}}


def endpoint(target: Target) -> str:
    """status.endpoint: the in-cluster URL of the OpenAI-compatible API."""
    return f"http://{target.name}.{target.namespace}.svc.cluster.local:{target.spec.server.port}"
