"""Which objects a NeuronModel's reconcile may write, and why the API server refused a write. Pure: no I/O.

The operator server-side applies its children with force (k8s.py): an object of the same kind and name that it did
not make would be taken over, its fields replaced (a hand-made Service's selector, say: its traffic hijacked) and,
through the ownerReference the apply adds, deleted with the model. So, as controller-runtime's AlreadyOwned check
does, an existing object whose controller reference is not to this NeuronModel (by uid) is never written: the
reconcile refuses (`AlreadyOwned`, its message naming the object and the fix) and retries with backoff. Children
named by their content are exempt (NAMED_BY_CONTENT).

A 403 is not always RBAC: admission (a validating webhook, a ValidatingAdmissionPolicy such as the chart's write
guard, Gatekeeper and Kyverno through their webhooks) answers 403 too, and no RBAC change fixes that. `admission`
tells them apart by the message the API server writes for each.
"""

from __future__ import annotations

import re
from typing import Mapping, Optional

#: Kinds of children named by a digest of their content, and immutable: the runtime and compile ConfigMaps
#: (`<name>-runtime-<hash>`), the compile Jobs, the ResourceClaimTemplates. No object takes such a name by accident,
#: and one made to take it is refused by the API server the moment our write differs from it (a 422 on an immutable
#: field): they are not read before a write, the fixed names (`<name>`: Service, Deployment, PDB, HPA; the
#: LeaderWorkerSet) are.
NAMED_BY_CONTENT = frozenset({"ConfigMap", "Job", "ResourceClaimTemplate"})
#: The API server's message prefix for a validating webhook's denial (admission/plugin/webhook/errors).
_WEBHOOK = re.compile(r'admission webhook "(?P<name>[^"]+)" denied the request')
#: ... and for a ValidatingAdmissionPolicy's (admission/plugin/policy/validating).
_POLICY = re.compile(r"ValidatingAdmissionPolicy '(?P<name>[^']+)' with binding '(?P<binding>[^']+)' denied request")


def controller(obj: Mapping) -> Optional[Mapping]:
    """The ownerReference of `obj` with controller: true (at most one, the API server enforces it), None if none."""
    return next((ref for ref in (obj.get("metadata") or {}).get("ownerReferences") or [] if ref.get("controller")),
                None)


def foreign(live: Optional[Mapping], uid: str) -> bool:
    """Does `live` (the object as the API server has it, None when there is none) exist without being the child of
    the NeuronModel `uid`?"""
    return live is not None and (controller(live) or {}).get("uid") != uid


class AlreadyOwned(Exception):
    """A child's kind and name are taken by an object that is not this NeuronModel's: left untouched."""

    def __init__(self, kind: str, namespace: str, name: str, live: Mapping, model: str):
        ref = controller(live)
        fix = f"rename the NeuronModel, or delete or rename the {kind}"
        if ref is None:
            managers = sorted({entry["manager"] for entry in (live.get("metadata") or {}).get("managedFields") or []
                               if entry.get("manager")})
            whose = "it has no controller reference: made by hand or by another tool" + \
                (f" ({', '.join(managers)})" if managers else "")
        elif ref.get("kind") == "NeuronModel" and ref.get("name") == model:  # deleted and created again at once
            whose = f"it belongs to an earlier NeuronModel {model}, uid {ref.get('uid')}"
            fix = "the garbage collector deletes it with that model shortly"
        else:
            whose = f"its controller is {ref.get('kind')} {ref.get('name')}"
        super().__init__(f"{kind} {namespace}/{name} exists and is not this NeuronModel's ({whose}); the operator "
                         f"leaves it untouched: {fix}. Retrying with backoff")
        self.kind, self.name = kind, name


def admission(message: str) -> Optional[str]:
    """The admission control that refused a request, from the API server's message ("admission webhook
    "validation.gatekeeper.sh"", "ValidatingAdmissionPolicy 'x' (binding 'y')"); None for any other refusal (an
    RBAC 403 reads `... is forbidden: User "..." cannot patch resource ...`)."""
    if (found := _POLICY.search(message)) is not None:
        return f"ValidatingAdmissionPolicy {found['name']!r} (binding {found['binding']!r})"
    if (found := _WEBHOOK.search(message)) is not None:
        return f"admission webhook {found['name']!r}"
    return None


def refused(message: str, policy: Optional[str]) -> tuple[str, str]:
    """(status reason, message) of a child the API server refused with `message`, `policy` the admission control
    that did (ApiError.admission), if one did."""
    if policy is None:
        return "InvalidSpec", f"the API server refused a child of this NeuronModel: {message}"
    return "AdmissionDenied", (f"{policy} refused a child of this NeuronModel (an admission policy, not the "
                               f"operator's RBAC): {message}. Change the spec so that the child complies, or ask the "
                               "policy's owner; retrying with backoff")
