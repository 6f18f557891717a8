"""What a serving workload runs, recorded on it and read back: the compile gate's memory.

The workload (Deployment or LeaderWorkerSet) carries api.ANNOTATION_SERVED (builders.common.served_record): the
typed spec its pods run AND what the operator resolved it to then (image, compile key, instance type, cores, ...). A reconcile that must hold a rollout
(the new compile key's Job has not succeeded) rebuilds the served Target from it as it was, never by resolving the
old spec again under today's defaults: an operator upgrade that changes the default image changes the compile key
of every model without spec.image, and re-resolving would find nothing to hold and roll every model at once onto
artifacts nobody compiled.

Workloads written by operators before this annotation carry ANNOTATION_SERVED_SPEC (the spec alone); their
image and compile key are read from the pod template itself, which is what those pods really run.

A record this release cannot read (another operator version's spec that `parse_spec` refuses, a hand edit) is
UnreadableRecord: the compile gate then holds the workload as it is, since nothing says the uncompiled spec is safe
to roll.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Optional

from neuronmodel_operator import api
from neuronmodel_operator.builders.common import Target
from neuronmodel_operator.resolve import OperatorDefaults, Resolved, resolve


class UnreadableRecord(ValueError):
    """The workload carries a served record that this release cannot read; the message says which and why."""


def _resolved(data: Mapping[str, Any]) -> Resolved:
    """The recorded Resolved (fields of another release's Resolved that this one lacks are left out)."""
    fields = {f.name for f in dataclasses.fields(Resolved)}
    values = {key: value for key, value in data.items() if key in fields}
    values["warnings"] = tuple(values.get("warnings") or ())
    return Resolved(**values)


def _legacy(workload: Mapping, spec: api.NeuronModelSpec, defaults: OperatorDefaults) -> Optional[Resolved]:
    """A spec-only annotation: resolved under today's defaults, with the image and compile key its pods run."""
    template = (workload.get("spec") or {}).get("template") or \
        ((workload.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("leaderTemplate") or {}
    key = ((template.get("metadata") or {}).get("annotations") or {}).get(api.ANNOTATION_COMPILE_KEY)
    containers = (template.get("spec") or {}).get("containers") or []
    if key is None or not containers:
        return None
    return dataclasses.replace(resolve(spec, defaults), image=containers[0]["image"], compile_key=key)


def served_target(workload: Optional[Mapping], target: Target, defaults: OperatorDefaults) -> Optional[Target]:
    """The Target the live `workload` serves, with identity and replicas from `target` (the replica count and the
    autoscaler always follow the current spec); None without a record (or a legacy one whose template says too
    little). Raises UnreadableRecord for a record it cannot read."""
    annotations = ((workload or {}).get("metadata") or {}).get("annotations") or {}
    try:
        if api.ANNOTATION_SERVED in annotations:
            record = json.loads(annotations[api.ANNOTATION_SERVED])
            spec, resolved = api.parse_spec(record["spec"]), _resolved(record["resolved"])
        elif api.ANNOTATION_SERVED_SPEC in annotations:
            spec = defaults.filled(api.parse_spec(json.loads(annotations[api.ANNOTATION_SERVED_SPEC])))
            resolved = _legacy(workload, spec, defaults)
            if resolved is None:
                return None
        else:
            return None
    except (ValueError, KeyError, TypeError, api.SpecError) as exc:
        meta = (workload or {}).get("metadata") or {}
        raise UnreadableRecord(f"{workload.get('kind')} {meta.get('name')}'s served record cannot be read by this "
                               f"operator ({type(exc).__name__}: {exc})") from None
    spec = spec.model_copy(update={"replicas": target.spec.replicas, "autoscaling": target.spec.autoscaling})
    return dataclasses.replace(target, spec=spec, resolved=resolved)
