"""Pure builders: a `Target` (a NeuronModel's typed spec and what the operator resolved) -> child manifests as
plain dicts. No I/O, no Kubernetes client; the same input always gives the same dicts (no timestamps), so the
handler can server-side apply them at every reconcile and the golden tests can compare them byte for byte.
"""

from __future__ import annotations

from typing import Any

from neuronmodel_operator.builders.common import (Target, owner_reference, selector, selector_string,
                                                  served_record, serving_selector, target_from_body, workload_name,
                                                  workload_ref)
from neuronmodel_operator.builders.configmap import (config_hash, configmap, runtime_config, runtime_config_json,
                                                     runtime_configmap_name, serving_configmap_name)
from neuronmodel_operator.builders.deployment import deployment
from neuronmodel_operator.builders.dra import resource_claim_template
from neuronmodel_operator.builders.hpa import hpa
from neuronmodel_operator.builders.job import compile_configmap, compile_job, compile_name
from neuronmodel_operator.builders.leaderworkerset import leaderworkerset
from neuronmodel_operator.builders.pdb import pdb
from neuronmodel_operator.builders.pod import pod_spec, pod_template, startup_budget_s
from neuronmodel_operator.builders.service import endpoint, service

__all__ = [
    "Target", "target_from_body", "serving_children", "compile_children", "configmap", "compile_configmap",
    "runtime_config", "runtime_config_json", "config_hash", "deployment", "leaderworkerset", "service", "endpoint",
    "compile_job", "pdb", "hpa", "pod_spec", "pod_template", "startup_budget_s", "owner_reference", "selector",
    "serving_selector", "selector_string", "workload_name", "workload_ref", "compile_name",
    "runtime_configmap_name", "serving_configmap_name", "served_record", "resource_claim_template",
]


def serving_children(target: Target) -> list[dict[str, Any]]:
    """The serving children in apply order: the ConfigMap (none for engine vllm; and, on DRA, the
    ResourceClaimTemplate) before the pods that use them, then the Deployment (nodes == 1) or LeaderWorkerSet, the
    Service, the PDB and the HPA when wanted."""
    workload = leaderworkerset(target) if target.multi_node else deployment(target)
    children = [configmap(target), resource_claim_template(target), workload, service(target), pdb(target),
                hpa(target)]
    return [child for child in children if child is not None]


def compile_children(target: Target) -> list[dict[str, Any]]:
    """The compile ConfigMap and Job (and, on DRA, the ResourceClaimTemplate its pod uses) when the cache policy
    asks for a compile Job (resolved.compile_job), else []."""
    if not target.resolved.compile_job:
        return []
    return [child for child in (resource_claim_template(target), compile_configmap(target), compile_job(target))
            if child is not None]
