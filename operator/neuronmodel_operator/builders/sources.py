"""Where a model, a draft model or a compile cache is inside the pod: the one source -> volume rule.

Both the RuntimeConfig (`configmap.py`: the paths the runtime reads) and the pod (`pod.py`: the volumes, mounts
and download init containers that put them there) come from `source_mount`, so the two can never disagree. A
source is parsed by the runtime's own grammar (neuronmodel_runtime.config.sources, also the CRD's CEL pattern).

| source                   | in the pod                                                  | the runtime reads         |
|--------------------------|-------------------------------------------------------------|---------------------------|
| hf://org/name, s3://...  | emptyDir `models` at /models, filled by init `fetch-<role>` | /models/<role>            |
| pvc://claim[/path]       | the claim as volume `<role>` at /mnt/<role> (read-only)     | /mnt/<role>[/path]        |
| /abs/path                | hostPath (type Directory, read-only) at the same path       | /abs/path                 |
| cache pvc://claim[/path] | the claim as volume `compile-cache` at /mnt/compile-cache   | /mnt/compile-cache[/path] |
| cache s3://...           | nothing (the runtime talks to S3 itself)                    | the s3:// URL             |
| cache /abs/path          | hostPath (DirectoryOrCreate, read-write) at the same path   | /abs/path                 |

`<role>` is `model` or `draft`.

A path keeps its own location inside the container, so a pod's command also runs unchanged on the host (the
tests do that). hostPath is for single-node and development clusters: the Pod Security "baseline" and
"restricted" levels refuse it, and a DirectoryOrCreate directory is created root-owned, so a compile-cache path
must be made writable for uid 1000 on the node first.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any, Literal, Optional

from neuronmodel_operator.api import NeuronModelSpec, SpecError
from neuronmodel_runtime.config.sources import SourceError, parse_source

Role = Literal["model", "draft", "compile-cache"]

MODELS_DIR = "/models"  # the emptyDir downloads go to
MODELS_VOLUME = "models"
CONFIG_DIR = "/etc/neuronmodel"
CONFIG_FILE = f"{CONFIG_DIR}/config.json"
#: Mount points of the pod's own volumes (pod.py); a hostPath source may not be one of them or contain them.
RESERVED_PATHS = (CONFIG_DIR, "/dev/shm", "/tmp", "/var/cache/neuronmodel", "/var/tmp", MODELS_DIR,
                  "/mnt/model", "/mnt/draft", "/mnt/compile-cache")

_FIELDS = {"model": "spec.model.source", "draft": "spec.speculation.draftModel.source",
           "compile-cache": "spec.compileCache.url"}


@dataclass(frozen=True)
class SourceMount:
    """One source, placed in the pod."""

    source: str  # as the spec has it
    path: str  # what the runtime reads: RuntimeConfig model / speculation.draft_model / compile_cache.url
    volume: Optional[dict[str, Any]]  # the pod volume it needs (None: an s3:// cache needs none)
    mount: Optional[dict[str, Any]]  # the runtime container's volumeMount of that volume
    fetch: Optional[tuple[str, ...]] = None  # the download init container's command, when it is downloaded
    init_name: Optional[str] = None  # that init container's name (it mounts the volume writable)


def source_mount(source: str, role: Role, revision: Optional[str] = None) -> SourceMount:
    """Place `source` (a model source or compile-cache URL, as the spec has it) in the pod for `role`.

    Raises:
        SpecError: a source CEL should have refused (none of the forms, hf:// as a cache), or a path that would hide
            one of the pod's own mounts.
    """
    field = _FIELDS[role]
    cache = role == "compile-cache"
    try:
        parsed = parse_source(source)
    except SourceError as exc:
        raise SpecError(f"{field}: {exc}") from None
    if parsed.needs_fetch:
        if cache:
            if parsed.scheme == "hf":
                raise SpecError(f"{field}: hf:// cannot hold compiled artifacts; use s3://, pvc:// or a path")
            return SourceMount(source=source, path=source, volume=None, mount=None)
        dest = f"{MODELS_DIR}/{role}"
        command = ("neuronmodel-runtime", "fetch", source, dest)
        if revision:
            command += ("--revision", revision)
        return SourceMount(source=source, path=dest, volume={"name": MODELS_VOLUME, "emptyDir": {}},
                           mount={"name": MODELS_VOLUME, "mountPath": MODELS_DIR, "readOnly": True},
                           fetch=command, init_name=f"fetch-{role}")
    if parsed.scheme == "pvc":
        claim, root = parsed.location, f"/mnt/{role}"
        path = f"{root}/{parsed.path}" if parsed.path else root  # the grammar has no empty, . or .. part
        volume = {"name": role, "persistentVolumeClaim": {"claimName": claim, **({} if cache else {"readOnly": True})}}
        mount = {"name": role, "mountPath": root, **({} if cache else {"readOnly": True})}
        return SourceMount(source=source, path=path, volume=volume, mount=mount)
    path = posixpath.normpath(parsed.location)
    hidden = [p for p in RESERVED_PATHS if p == path or p.startswith(path.rstrip("/") + "/")]
    if hidden:
        raise SpecError(f"{field}: {path} would be mounted over the pod's own {hidden[0]}; use another path")
    host_path = {"path": path, "type": "DirectoryOrCreate" if cache else "Directory"}
    mount = {"name": role, "mountPath": path, **({} if cache else {"readOnly": True})}
    return SourceMount(source=source, path=path, volume={"name": role, "hostPath": host_path}, mount=mount)


def model_mount(spec: NeuronModelSpec) -> SourceMount:
    return source_mount(spec.model.source, "model", spec.model.revision)


def draft_mount(spec: NeuronModelSpec) -> Optional[SourceMount]:
    """The draft model; None without one. Only speculation modes draft and eagle take one: the RuntimeConfig
    refuses it otherwise (rules.DRAFT_MODEL, as the CRD does)."""
    draft = spec.speculation.draft_model
    if draft is None:
        return None
    return source_mount(draft.source, "draft", draft.revision)


def compile_cache_mount(spec: NeuronModelSpec) -> Optional[SourceMount]:
    """The compile cache; None when the spec has none (a Neuron pod then compiles at every start)."""
    if spec.compile_cache.url is None:
        return None
    return source_mount(spec.compile_cache.url, "compile-cache")
