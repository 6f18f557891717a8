"""What a model's pods say, for status.py: which serving pods are live, and what blocks them (the scheduler's refusal
with scheduler_hints.py's advice, a failing container, a termination message); why a compile Job's attempt failed.
Pure, over camelCase dicts as the API server returns them.
"""

from __future__ import annotations

from typing import Iterator, Mapping, Optional, Sequence

from neuronmodel_operator import scheduler_hints

#: Container waiting reasons that are just progress, not a problem to show.
_STARTING = frozenset({"ContainerCreating", "PodInitializing"})
#: Container waiting reasons of a container that cannot run as it is (the kubelet retries with back-off).
FAILING = frozenset({"CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "InvalidImageName",
                     "CreateContainerConfigError", "CreateContainerError", "RunContainerError"})


def condition(obj: Optional[Mapping], *types: str, value: str = "True") -> Optional[Mapping]:
    """The first condition of `obj.status.conditions` of one of `types` whose status is `value`."""
    for found in ((obj or {}).get("status") or {}).get("conditions") or []:
        if found.get("type") in types and found.get("status") == value:
            return found
    return None


def live_pods(pods: Sequence[Mapping]) -> list[Mapping]:
    """The pods not being deleted and not ended (Succeeded, Failed)."""
    return [pod for pod in pods if not (pod.get("metadata") or {}).get("deletionTimestamp")
            and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]


def unschedulable(pods: Sequence[Mapping]) -> Optional[str]:
    """The scheduler's refusal of these pods, with scheduler_hints.py's advice; None when none is refused."""
    refused = [c for pod in pods if (c := condition(pod, "PodScheduled", value="False"))]
    if not refused:
        return None
    advice = scheduler_hints.hint(pods)
    return f"{len(refused)} serving pod(s) cannot be scheduled: {refused[0].get('message') or refused[0]['reason']}" \
        + (f"; {advice}" if advice else "")


def waiting(pods: Sequence[Mapping], reasons: Optional[frozenset] = None) -> Optional[str]:
    """The first container problem (CrashLoopBackOff, ImagePullBackOff...) of these pods: any waiting reason but
    _STARTING, or only `reasons`."""
    for pod in pods:
        status = pod.get("status") or {}
        for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            state = (container.get("state") or {}).get("waiting") or {}
            reason = state.get("reason")
            if reason and reason not in _STARTING and (reasons is None or reason in reasons):
                detail = f": {state['message']}" if state.get("message") else ""
                return f"container {container.get('name')}: {reason}{detail}"
    return None


def _terminations(pod: Mapping) -> Iterator[tuple[str, Mapping]]:
    """(container name, its `terminated` state) of the pod's containers that ended, init containers first, each
    current state before the last one (a restarted container's)."""
    status = pod.get("status") or {}
    for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        for state in (container.get("state") or {}, container.get("lastState") or {}):
            if state.get("terminated"):
                yield container.get("name", ""), state["terminated"]


def termination_message(pods: Sequence[Mapping], marker: str) -> Optional[str]:
    """The first termination message carrying `marker` of these pods' containers (init containers too), if any."""
    for pod in pods:
        for _, ended in _terminations(pod):
            if marker in (message := ended.get("message") or ""):
                return message.strip()
    return None


#: How much of a failed container's termination message a status message quotes: its last lines, at most this long.
QUOTED_LINES = 6
QUOTED_CHARS = 900


def failed_attempt(pods: Sequence[Mapping]) -> Optional[str]:
    """Why the newest of these (a compile Job's) pods failed: its first container, init containers first, that exited
    non-zero (in the kubelet's order, by name: `runtime` before `store-artifacts`), with the last lines of its
    termination message (vLLM's error under its supervisor, the runtime's own line); None when none did."""
    newest = sorted(pods, key=lambda pod: (pod.get("metadata") or {}).get("creationTimestamp") or "", reverse=True)
    for pod in newest:
        for name, ended in _terminations(pod):
            if ended.get("exitCode", 0) == 0:
                continue
            how = f"exited {ended['exitCode']}" + (f" ({ended['reason']})" if ended.get("reason") not in
                                                   (None, "Error") else "")
            lines = [line.strip() for line in (ended.get("message") or "").splitlines() if line.strip()]
            said = " | ".join(lines[-QUOTED_LINES:])[-QUOTED_CHARS:]
            return f"container {name} {how}" + (f": {said}" if said else "")
    return None


def blockers(pods: Sequence[Mapping]) -> str:
    """What keeps the pods that are not ready from it ("; <refusal>; <container problem>"), "" for nothing."""
    not_ready = [pod for pod in pods if condition(pod, "Ready") is None]
    found = [text for text in (unschedulable(not_ready), waiting(not_ready)) if text]
    return "".join(f"; {text}" for text in found)
