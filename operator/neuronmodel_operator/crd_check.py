"""Refuse to start on a NeuronModel CRD older than this operator's.

Helm installs the CRDs of a chart's `crds/` once and never upgrades them, so `helm upgrade` can run a new operator
against an old CRD. The API server would then prune, without a word, every field the old schema lacks from what
users apply and from the status the operator writes. The generated CRD carries the revision of its schema
(`api.CRD_REVISION`) as the annotation `ANNOTATION_REVISION`; the operator reads the installed CRD once at start and
refuses when it is missing, unannotated (written before revisions existed) or older. A newer CRD is fine: the
operator was rolled back, and the newer schema still accepts what it writes.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from neuronmodel_operator import api
from neuronmodel_operator.k8s import ApiError, Kube

ANNOTATION_REVISION = f"{api.GROUP}/crd-revision"

_APPLY = (f"apply this release's CRD first (Helm never upgrades a chart's CRDs): kubectl apply --server-side "
          f"--force-conflicts -f crds/{api.CRD_NAME}.yaml from a checkout, or the chart's crds/ folder "
          "(helm pull --untar); see docs/eks.md, Upgrading")


class CrdError(RuntimeError):
    """The installed NeuronModel CRD cannot serve this operator; the message says how to fix it."""


def installed_revision(crd: Mapping[str, Any]) -> Optional[int]:
    """The schema revision an installed CRD declares; None when it has no (or no integer) revision annotation."""
    value = ((crd.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_REVISION, "")
    return int(value) if value.isdigit() else None


def problem(crd: Optional[Mapping[str, Any]]) -> Optional[str]:
    """Why the installed CRD (None: not installed) cannot serve this operator, or None when it can."""
    if crd is None:
        return f"the CustomResourceDefinition {api.CRD_NAME} is not installed: {_APPLY}"
    revision = installed_revision(crd)
    if revision is not None and revision >= api.CRD_REVISION:
        return None
    found = f"revision {revision}" if revision is not None else f"no {ANNOTATION_REVISION} annotation"
    return (f"the installed CustomResourceDefinition {api.CRD_NAME} is older than this operator ({found}, needs "
            f"revision {api.CRD_REVISION}): {_APPLY}")


def check(kube: Kube) -> None:
    """Read the installed CRD and refuse an old one.

    Raises:
        CrdError: the CRD is missing, older than `api.CRD_REVISION`, or cannot be read (the message is one line).
    """
    try:
        crd = kube.get_crd(api.CRD_NAME)
    except ApiError as exc:
        hint = (": the operator's ClusterRole needs get on customresourcedefinitions (rbac/operator-rules.yaml)"
                if exc.status in (401, 403) else "")
        raise CrdError(f"cannot read the CustomResourceDefinition {api.CRD_NAME} ({exc}){hint}") from None
    message = problem(crd)
    if message:
        raise CrdError(message)
