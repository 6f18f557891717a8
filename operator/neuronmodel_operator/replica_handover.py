"""spec.replicas of a workload the operator applies without it (spec.autoscaling), kept at its live value.

Server-side apply resets a field that its manager stops applying, so a workload applied without spec.replicas
would drop to 1 (the default). The field is handed to api.HANDOVER_FIELD_MANAGER at its live value first (the
ownership-transfer recipe): on replicas -> autoscaling (`hand_over_replicas`), and for the new workload of a kind
switch under autoscaling, which follows the old one's count until it serves (`match_replicas`).
"""

from __future__ import annotations

import logging

from neuronmodel_operator import api
from neuronmodel_operator.k8s import Kube

log = logging.getLogger(__name__)

WORKLOAD_KINDS = ("Deployment", "LeaderWorkerSet")


def _owns_replicas(workload: dict, manager: str) -> bool:
    """Does `manager` own spec.replicas of the live workload (server-side apply's managedFields)?"""
    for entry in workload["metadata"].get("managedFields") or []:
        if entry.get("manager") == manager and entry.get("operation") == "Apply" and \
                "f:replicas" in ((entry.get("fieldsV1") or {}).get("f:spec") or {}):
            return True
    return False


def hand_over_replicas(kube: Kube, desired: list[dict], live: dict[str, dict]) -> None:
    """A workload applied without spec.replicas (autoscaling) whose live replicas the operator owns: hand the
    field to HANDOVER_FIELD_MANAGER at its live value first (the server-side apply ownership transfer), or the
    apply that omits it would reset the workload to 1 replica."""
    for manifest in desired:
        current = live.get(manifest["kind"])
        if manifest["kind"] not in WORKLOAD_KINDS or "replicas" in manifest["spec"] or current is None or \
                current["metadata"]["name"] != manifest["metadata"]["name"] or \
                not _owns_replicas(current, api.FIELD_MANAGER):
            continue
        replicas = (current.get("spec") or {}).get("replicas", 1)
        log.info("handing %s %s/%s replicas (%d) to the autoscaler", manifest["kind"],
                 manifest["metadata"]["namespace"], manifest["metadata"]["name"], replicas)
        kube.apply({"apiVersion": manifest["apiVersion"], "kind": manifest["kind"],
                    "metadata": {"name": manifest["metadata"]["name"],
                                 "namespace": manifest["metadata"]["namespace"]},
                    "spec": {"replicas": replicas}}, field_manager=api.HANDOVER_FIELD_MANAGER)


def match_replicas(kube: Kube, desired: list[dict], live: dict[str, dict], old: dict) -> None:
    """A kind switch under autoscaling: the new workload, applied without spec.replicas, would run 1 (the
    default) and switch over once that one is ready, dropping the N the HPA has scaled the old one to. It is
    created at the old one's live count instead (the next run hands the field to HANDOVER_FIELD_MANAGER, as
    `hand_over_replicas` does, and the HPA takes it over after the switch), follows that count while the HPA
    still scales the old one, and the switch waits for that many ready (reconcile.py's `_ready`)."""
    replicas = (old.get("spec") or {}).get("replicas", 1)
    for manifest in desired:
        if manifest["kind"] not in WORKLOAD_KINDS or manifest["kind"] == old["kind"]:
            continue
        current = live.get(manifest["kind"])
        meta = manifest["metadata"]
        if current is None:
            manifest["spec"]["replicas"] = replicas
        elif (current.get("spec") or {}).get("replicas") != replicas:
            kube.apply({"apiVersion": manifest["apiVersion"], "kind": manifest["kind"],
                        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                        "spec": {"replicas": replicas}}, field_manager=api.HANDOVER_FIELD_MANAGER)
        else:
            continue
        log.info("%s %s/%s follows the %s's %d replicas", manifest["kind"], meta["namespace"], meta["name"],
                 old["kind"], replicas)
