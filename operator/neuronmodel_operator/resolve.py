"""From a typed spec to what the operator will build: instance type, NeuronCores per pod, image, compile key.

Pure. `resolve` refuses, with `SpecError`, a spec that slipped past the CRD's CEL rules but cannot be served
(no instance type holds its TP degree, say): the handler turns that into a Failed condition and an Event, and
does not retry until the spec changes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Optional

from neuronmodel_operator import api, devices, engines, images, placement, vllm_flags
from neuronmodel_operator.api import NeuronModelSpec, SpecError
from neuronmodel_runtime.config import keys
from neuronmodel_runtime.releases import NXDI_UNSUPPORTED_ON_TRN


#: The node label whose value a multi-node group has to itself by default: EKS managed node groups label their nodes
#: with it, and AWS's multi-node Neuron example (ai-on-eks, Llama-3.1-405B on 4 trn1.32xlarge) uses it as the
#: LeaderWorkerSet exclusive-topology key. Karpenter's nodes lack it: their clusters set --group-topology-key.
DEFAULT_GROUP_TOPOLOGY_KEY = "eks.amazonaws.com/nodegroup"


@dataclass(frozen=True)
class OperatorDefaults:
    """Operator-wide settings that fill what a spec leaves unset (the chart sets them).

    The runtime image of a spec without `image` is `image` when set (one image for every model: tests, a local
    cluster, a mirror of one target), else the images.py target for the model's instance family and framework,
    tagged `<image_repository>:<image_version>-<target>`. A spec without compileCache.url gets `compile_cache`
    (url and policy) when set: one cache for every model of the cluster.

    Pods that take part of a node's NeuronCores or devices ask for `neuron_scheduler_name`, the Neuron scheduler
    extension's scheduler (None: none is installed; such pods then carry a warning). Node paths as sources are
    refused unless `allow_host_path`: a hostPath volume reads (and a cache writes) the node's filesystem, which a
    namespace's users should not reach just by writing a NeuronModel, whatever the namespace's Pod Security level.
    """

    image: Optional[str] = None  # --runtime-image: overrides the per-family choice for every model
    hpa_metric: str = api.DEFAULT_HPA_METRIC  # the queue metric the HPA averages
    image_repository: str = images.DEFAULT_REPOSITORY
    image_version: str = field(default_factory=images.package_version)
    compile_cache: Optional[api.CompileCache] = None  # --compile-cache-url / --compile-cache-policy
    neuron_scheduler_name: Optional[str] = devices.NEURON_SCHEDULER_NAME  # --neuron-scheduler-name ('' = None)
    allow_host_path: bool = False  # --allow-host-path
    group_topology_key: str = DEFAULT_GROUP_TOPOLOGY_KEY  # --group-topology-key ('' = none)

    def filled(self, spec: NeuronModelSpec) -> NeuronModelSpec:
        """`spec` with the operator's compile cache when it names none of its own (either engine)."""
        if spec.compile_cache.url is not None or self.compile_cache is None:
            return spec
        cache = self.compile_cache.model_copy(update={"sharded_weights": spec.compile_cache.sharded_weights})
        return spec.model_copy(update={"compile_cache": cache})

    def image_source(self, spec: NeuronModelSpec) -> Optional[str]:
        """Who named the image of `spec`, for messages: spec.image, the operator's --runtime-image, or None (the
        images.py default of its family and framework)."""
        if spec.image:
            return "spec.image"
        return "the operator's --runtime-image (chart value runtimeImage.image)" if self.image else None

    def image_for(self, spec: NeuronModelSpec, family: Optional[str]) -> str:
        """The runtime image of `spec` on instance `family` (None: a node without Neuron); engine vllm: spec.image
        or the vLLM Neuron image of the family (the operator's --runtime-image is ours, not a vLLM image)."""
        if spec.engine == "vllm":
            return spec.image or images.vllm_image_for(family or "").ref
        if spec.image or self.image:
            return spec.image or self.image
        try:
            return images.default_image(family, spec.framework, self.image_repository, self.image_version)
        except LookupError as exc:
            raise SpecError(f"spec.framework: {exc}; set spec.image, or another framework") from None

    def fetch_image(self) -> str:
        """The image of the download init containers of engine vllm pods, whose vLLM image has no
        `neuronmodel-runtime fetch`: the operator's --runtime-image, else our CPU runtime image (runtime-cpu)."""
        return self.image or images.default_image(None, "torch", self.image_repository, self.image_version)


class SpecWarning(str):
    """A problem that does not stop the rollout (status.warnings holds the text), with the reason of the Warning
    Event it is announced by."""

    reason: str

    def __new__(cls, reason: str, message: str) -> SpecWarning:
        warning = super().__new__(cls, message)
        warning.reason = reason
        return warning

    def __getnewargs__(self) -> tuple[str, str]:  # copies (dataclasses.asdict) keep the reason
        return self.reason, str(self)


@dataclass(frozen=True)
class Resolved:
    """The decisions the builders and status share; shown to users as `status.resolved`."""

    framework: str  # as asked: auto | nxdi | tnx | torch
    instance_type: Optional[str]  # None: the torch reference runner on any CPU node
    instance_family: Optional[str]  # inf2 | trn1 | trn2
    logical_core_config: Optional[int]  # LNC of trn2 (None elsewhere)
    cores_per_pod: int  # NeuronCores per pod (0 for torch)
    devices_per_pod: int  # Neuron devices those cores span (0 for torch)
    neuron_resources: dict[str, str]  # the device-plugin request of one pod
    image: str
    compile_key: str  # sha256 over everything that changes the compiled graphs
    compile_job: bool  # a compile Job fills the cache before serving
    warnings: tuple[SpecWarning, ...]  # e.g. the model clearly does not fit
    scheduler_name: Optional[str] = None  # spec.schedulerName, or the Neuron scheduler extension's for partial pods
    revisions: dict[str, str] = field(default_factory=dict)  # hf:// "source@revision" -> its commit (revisions.py)
    model_revision: Optional[str] = None  # the commit (or revision) the pods fetch the model at
    draft_revision: Optional[str] = None  # the draft model's
    fetch_image: Optional[str] = None  # the download init containers' image when not `image` (engine vllm)
    efa_per_pod: int = 0  # EFA devices each pod of a multi-node group requests (devices.EFA_RESOURCE)
    group_topology_key: Optional[str] = None  # the LWS exclusive-topology key of a multi-node group (None: none)

    def as_status(self) -> dict:
        status = {"framework": self.framework, "instanceType": self.instance_type,
                  "instanceFamily": self.instance_family, "logicalCoreConfig": self.logical_core_config,
                  "neuronCoresPerPod": self.cores_per_pod, "neuronDevicesPerPod": self.devices_per_pod,
                  "image": self.image, "compileKey": self.compile_key, "schedulerName": self.scheduler_name,
                  "modelRevision": self.model_revision, "draftRevision": self.draft_revision,
                  "revisions": self.revisions or None, "efaDevicesPerPod": self.efa_per_pod or None,
                  "groupTopologyKey": self.group_topology_key}
        return {key: value for key, value in status.items() if value is not None}


def compile_key(spec: NeuronModelSpec, image: str, instance_family: Optional[str], lnc: Optional[int]) -> str:
    """sha256 of the canonical JSON of what changes the compiled graphs (DESIGN.md, compile-artifact cache).

    The image stands for the framework, SDK and compiler versions it pins. Replicas, resources, placement and
    the server port are not in it: changing them never recompiles. spec.neuronConfigOverrides is in it only when it
    has keys, so that a model without overrides keeps the key an operator before the field gave it (a changed key
    recompiles the model). Engine vllm's key is vllm_flags.key_inputs' digest instead: the flags vLLM compiles
    with, as the pods get them.
    """
    inputs = {
        "model": {"source": spec.model.source, "revision": spec.model.revision, "dtype": spec.model.dtype},
        "framework": spec.framework,
        "image": image,
        "instanceFamily": instance_family,
        "logicalCoreConfig": lnc,
        "parallelism": {"tensorParallelDegree": spec.parallelism.tensor_parallel_degree,
                        "nodes": spec.parallelism.nodes},
        "batching": spec.batching.model_dump(mode="json", by_alias=True),
        "sampling": spec.sampling.model_dump(mode="json", by_alias=True),
        "speculation": spec.speculation.model_dump(mode="json", by_alias=True),
        "shardedWeights": spec.compile_cache.sharded_weights,
    }
    if spec.neuron_config_overrides:
        inputs["neuronConfigOverrides"] = spec.neuron_config_overrides
    if spec.engine != api.DEFAULT_ENGINE:  # only then, so that every model before the field keeps its key
        inputs["engine"] = spec.engine
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def loading_gib(spec: NeuronModelSpec) -> float:
    """Host RAM (GiB) one node's pod takes while the weights load: the whole checkpoint, or with pre-sharded weights its
    nodes' share of it (0 when spec.model.parameters is unset: nothing to go by)."""
    parameters = spec.model.parameter_count()
    if parameters is None:
        return 0
    per_node = spec.parallelism.nodes if spec.compile_cache.sharded_weights else 1
    return devices.loading_gib(parameters, spec.model.dtype) / per_node


def _instance(spec: NeuronModelSpec, cores_per_pod: int) -> devices.InstanceType:
    if spec.instance_type is not None:
        instance = devices.INSTANCE_TYPES.get(spec.instance_type)
        if instance is None:
            raise SpecError(f"spec.instanceType: {spec.instance_type!r} is not a Neuron instance type; use one of "
                            f"{', '.join(devices.INSTANCE_TYPES)}, or framework torch for a CPU node")
        return instance
    instance = devices.smallest_instance_for(cores_per_pod, spec.framework, loading_gib(spec))
    if instance is None and devices.smallest_instance_for(cores_per_pod, spec.framework) is not None:
        raise SpecError(f"spec.model.parameters: loading {spec.model.parameters} parameters takes about "
                        f"{loading_gib(spec):.0f} GiB of host RAM, more than any Neuron instance type holding "
                        f"{cores_per_pod} NeuronCores per node has; raise parallelism.nodes, or set instanceType")
    if instance is None:
        raise SpecError(f"spec.parallelism: no Neuron instance type holds {cores_per_pod} NeuronCores per node "
                        f"(tensorParallelDegree {spec.parallelism.tensor_parallel_degree} / nodes "
                        f"{spec.parallelism.nodes}); raise nodes or use a supported TP degree")
    return instance


def _host_path_sources(spec: NeuronModelSpec) -> list[tuple[str, str]]:
    """(field, path) of every source that is a node path: mounted with hostPath."""
    sources = [("spec.model.source", spec.model.source), ("spec.compileCache.url", spec.compile_cache.url or "")]
    if spec.speculation.draft_model is not None and spec.speculation.mode in ("draft", "eagle"):
        sources.append(("spec.speculation.draftModel.source", spec.speculation.draft_model.source))
    return [(name, source) for name, source in sources if source.startswith("/")]


def check_host_paths(spec: NeuronModelSpec, defaults: OperatorDefaults) -> None:
    """Refuse node paths unless the operator allows them (OperatorDefaults.allow_host_path)."""
    found = _host_path_sources(spec)
    if found and not defaults.allow_host_path:
        name, source = found[0]
        raise SpecError(f"{name}: {source} is a node path (a hostPath volume), which this operator refuses: use "
                        "pvc:// (a PersistentVolumeClaim), s3:// or hf://, or run the operator with "
                        "--allow-host-path (chart value allowHostPath: true) on single-node and development clusters")


def scheduler_for(spec: NeuronModelSpec, instance: devices.InstanceType, lnc: int, request: devices.NeuronRequest,
                  defaults: OperatorDefaults) -> tuple[Optional[str], Optional[SpecWarning]]:
    """(schedulerName, warning) of a Neuron pod: spec.schedulerName when set; else the Neuron scheduler extension's
    when the pod takes more than one but not all of the node's NeuronCores (or devices) from the device plugin.

    The device plugin alone hands out any free cores; NxDI needs contiguous ones (a ring segment on inf2, 1/4/8/16
    devices on trn1's torus), which only the extension picks. A whole node needs no choice, one core is always
    contiguous, and the DRA driver places devices itself (spec.deviceAllocation dra, connected-group constraints).
    """
    if spec.scheduler_name:
        return spec.scheduler_name, None
    if spec.device_allocation == "dra":
        return None, None
    unit, total = (("NeuronCores", instance.cores(lnc)) if request.resource == devices.NEURONCORE_RESOURCE
                   else ("Neuron devices", instance.devices))
    if not 1 < request.count < total:
        return None, None
    if defaults.neuron_scheduler_name:
        return defaults.neuron_scheduler_name, None
    return None, SpecWarning(
        "NoNeuronScheduler",
        f"the pods take {request.count} of the {total} {unit} of one {instance.name} node, and no Neuron scheduler "
        "extension is configured: the default scheduler and the device plugin may hand out cores that are not "
        "contiguous, which NxDI cannot use; install the extension (the Neuron Helm chart with "
        "scheduler.enabled=true) and run the operator with --neuron-scheduler-name (chart value "
        "neuronSchedulerName, default my-scheduler), or set spec.schedulerName")


def _line(image: images.RuntimeImage, library: str) -> str:
    """`the runtime-nxdi-sdk2.28 image (NxDI 0.8.16251, Neuron SDK 2.28.0)`: an image's line, for messages."""
    name = {"nxdi": "NxDI", "tnx": "transformers-neuronx"}[library]
    return f"the {image.target} image ({name} {image.framework_version(library)}, Neuron SDK {image.sdk})"


def support_warning(spec: NeuronModelSpec, image: str, family: str,
                    defaults: OperatorDefaults) -> Optional[SpecWarning]:
    """A warning (never a refusal) when the pods run NxDI on trn2, which AWS supports no more from SDK 2.34
    (`NxdiUnsupportedOnTrn2`), or a Neuron library line AWS no longer patches on `family` (`UnpatchedRuntime`: the
    SDK 2.28 image, TNx), with the fix.

    The line is the library the pods run on the image (images.runs: auto is NxDI where the image has it); an image
    the table does not know (a custom spec.image, the operator's --runtime-image) is judged by spec.framework alone:
    NxDI on trn2 is unsupported whatever the image.
    """
    known = images.target_of(image)
    library = images.runs(known, spec.framework) if known else (
        spec.framework if spec.framework in ("nxdi", "tnx") else None)
    if library is None:
        return None
    what = _line(known, library) if known else f"the image {image}"
    if library == "nxdi" and images.family_of(family) == "trn2":
        return SpecWarning(
            "NxdiUnsupportedOnTrn2",
            f"NxDI on trn2, from {what}: {NXDI_UNSUPPORTED_ON_TRN.says}. The operator keeps serving NxDI on trn2 "
            "from the SDK 2.31.1 image, the last with NxDI, but AWS fixes nothing there any more: move to vLLM "
            "Neuron (engine: vllm): the compile Job compiles it while these pods keep serving")
    support = images.support(known, spec.framework, family) if known else None
    if support is None or support.patched:
        return None
    source = defaults.image_source(spec)
    steps = (["use framework nxdi (or auto)"] if library == "tnx" else []) + ([f"remove {source}"] if source else [])
    fix = " and ".join(steps or ["use an image AWS patches"])
    fix = fix[0].upper() + fix[1:]
    default = images.image_for(family, "nxdi")
    default_support = images.support(default, "nxdi", family)
    if default_support is not None and default_support.patched:
        fix += f", for {_line(default, 'nxdi')}, the default, which AWS patches on {images.family_of(family)}"
    if known.use:
        fix += f"; keep this image only for {known.use}"
    return SpecWarning("UnpatchedRuntime", f"{what[0].upper()}{what[1:]} is on a line AWS no longer patches: "
                       f"{support.says}. {fix}")


def check_multi_node_image(spec: NeuronModelSpec, image: str, defaults: OperatorDefaults) -> None:
    """Refuse the transformers-neuronx line across nodes (the CRD refuses framework tnx; here also an image of that
    line, whatever it runs): its image, on the SDK 2.25 DLC, has no EFA userspace (libfabric's EFA provider: that DLC
    never runs efa_installer.sh, the NxDI ones do), so the Neuron runtime's collectives between nodes have no
    transport. Refused rather than installed: AWS's installer cannot be built or tested here."""
    if spec.parallelism.nodes == 1:
        return
    known = images.target_of(image)
    if spec.framework != "tnx" and (known is None or known.framework != "tnx"):
        return
    fix = "use framework nxdi (or auto)" if spec.framework == "tnx" else f"remove {defaults.image_source(spec)}"
    raise SpecError(f"spec.parallelism.nodes: {spec.parallelism.nodes} nodes on the transformers-neuronx image: it "
                    "(Neuron SDK 2.25) has no EFA userspace, so the collectives between the nodes cannot run; "
                    f"{fix} for an NxDI image, which has it, or set parallelism.nodes 1")


def check_device_top_k(spec: NeuronModelSpec) -> None:
    """Refuse a global top-k above the device's limit when a Neuron runner samples on the device (the CRD's rule;
    here for a spec that reached the operator past an older CRD)."""
    if spec.sampling.on_device and spec.sampling.global_top_k > devices.MAX_DEVICE_TOP_K:
        raise SpecError(f"spec.sampling.globalTopK: {spec.sampling.global_top_k} is above "
                        f"{devices.MAX_DEVICE_TOP_K}, the most Neuron's on-device sampler takes; set it to "
                        f"{devices.MAX_DEVICE_TOP_K} or less, or spec.sampling.onDevice false to sample on the host")


def resolve(spec: NeuronModelSpec, defaults: OperatorDefaults) -> Resolved:
    check_host_paths(spec, defaults)
    if spec.engine == "vllm":
        engines.check_vllm(spec)
    compile_job = spec.compile_cache.url is not None and spec.compile_cache.policy != "Never"
    cores_per_pod = spec.parallelism.tensor_parallel_degree // spec.parallelism.nodes
    if spec.framework == "torch":  # the CPU reference runner: no NeuronCores, even on a Neuron instance
        if spec.neuron_config_overrides:
            raise SpecError("spec.neuronConfigOverrides: framework torch (the reference runner) has no NeuronConfig; "
                            "remove the overrides, or use framework auto, nxdi or tnx")
        instance = devices.INSTANCE_TYPES.get(spec.instance_type or "")
        family = instance.family.name if instance else None
        image = defaults.image_for(spec, family)
        key = compile_key(spec, image, family, None)
        topology_key = group_topology_key(spec, defaults)
        surge = placement.surge_warning(spec, topology_key)
        return Resolved(spec.framework, spec.instance_type, family, None, 0, 0, {}, image, key, compile_job,
                        (SpecWarning("SurgeNeedsSpareNodeGroup", surge),) if surge else (),
                        scheduler_name=spec.scheduler_name, group_topology_key=topology_key)
    if spec.parallelism.tensor_parallel_degree % spec.parallelism.nodes:
        raise SpecError("spec.parallelism.nodes must divide spec.parallelism.tensorParallelDegree")
    check_device_top_k(spec)
    instance = _instance(spec, cores_per_pod)
    family = instance.family
    if spec.framework == "tnx" and spec.compile_cache.sharded_weights:
        raise SpecError("spec.compileCache.shardedWeights: transformers-neuronx saves pre-sharded weights only with "
                        "on-device embedding, which this runtime does not compile; remove it or use framework nxdi")
    if spec.parallelism.nodes > 1 and spec.compile_cache.sharded_weights:
        raise SpecError("spec.compileCache.shardedWeights with parallelism.nodes > 1: NxDI's compile writes the "
                        "pre-sharded weights of the compiling host's ranks only, so the other hosts' would be missing; "
                        "set shardedWeights false (each host shards its ranks at load)")
    if spec.framework == "tnx" and not family.transformers_neuronx:
        raise SpecError(f"spec.framework: transformers-neuronx never supported {family.name}; use nxdi or auto")
    lnc_asked = spec.parallelism.logical_core_config
    if lnc_asked is not None and lnc_asked not in family.lnc_choices:
        raise SpecError(f"spec.parallelism.logicalCoreConfig applies to trn2 only, not {instance.name}: remove it "
                        f"or set a trn2 instanceType")
    lnc = devices.lnc_of(instance, lnc_asked)
    legal = devices.legal_tp_degrees(instance, lnc)
    if cores_per_pod not in legal:
        raise SpecError(f"spec.parallelism: {cores_per_pod} NeuronCores per node is not a TP degree NxDI supports "
                        f"on {instance.name} (legal: {', '.join(map(str, legal))})")
    # DRA allocates whole devices, like the device plugin's aws.amazon.com/neuron
    dra = spec.device_allocation == "dra"
    request = devices.neuron_request(instance, lnc, cores_per_pod, "neuron" if dra else spec.neuron_resource)
    if refusal := placement.dra_refusal(spec, instance, request.devices):
        raise SpecError(refusal)
    scheduler, scheduler_warning = scheduler_for(spec, instance, lnc, request, defaults)
    warnings = [scheduler_warning] if scheduler_warning else []
    if (parameters := spec.model.parameter_count()) is not None:
        fit = devices.fit_warning(parameters, spec.model.dtype, instance, lnc, spec.parallelism.tensor_parallel_degree)
        # pre-sharded weights are the fix on one node only (refused across nodes, above)
        host = devices.host_memory_warning(loading_gib(spec), instance,
                                           spec.compile_cache.sharded_weights or spec.parallelism.nodes > 1)
        warnings += [SpecWarning(reason, text) for reason, text in (("ModelMayNotFit", fit),
                                                                    ("HostMemoryShort", host)) if text]
    trn2_lnc = lnc if len(family.lnc_choices) > 1 else None
    image = defaults.image_for(spec, family.name)
    check_multi_node_image(spec, image, defaults)
    fetch_image = None
    if spec.engine == "vllm":
        line = images.vllm_image_for(family.name)
        engines.check_vllm_line(spec, line)
        fetch_image = defaults.fetch_image()
        key = keys.digest(vllm_flags.key_inputs(spec, image, line, family.name, trn2_lnc))
    else:
        if support := support_warning(spec, image, family.name, defaults):
            warnings.append(support)
        key = compile_key(spec, image, family.name, trn2_lnc)
    topology_key = group_topology_key(spec, defaults)
    if surge := placement.surge_warning(spec, topology_key):
        warnings.append(SpecWarning("SurgeNeedsSpareNodeGroup", surge))
    return Resolved(spec.framework, instance.name, family.name, trn2_lnc, request.cores, request.devices,
                    {} if dra else request.as_resources(), image, key, compile_job, tuple(warnings),
                    scheduler_name=scheduler, fetch_image=fetch_image, efa_per_pod=efa_per_pod(spec, instance),
                    group_topology_key=topology_key)


def efa_per_pod(spec: NeuronModelSpec, instance: devices.InstanceType) -> int:
    """Every EFA device of the node for each pod of a multi-node group (one pod per node): with parallelism.efa
    true, or unset where the instance type has EFA; 0 for one node.

    Raises:
        SpecError: parallelism.efa true on an instance type without EFA.
    """
    efa = spec.parallelism.efa
    if spec.parallelism.nodes == 1 or efa is False:
        return 0
    if efa and not instance.efa_interfaces:
        having = ", ".join(name for name, t in devices.INSTANCE_TYPES.items() if t.efa_interfaces)
        raise SpecError(f"spec.parallelism.efa: {instance.name} has no EFA devices (EFA is on {having}); choose one "
                        "of them as instanceType, or set parallelism.efa false")
    return instance.efa_interfaces


def group_topology_key(spec: NeuronModelSpec, defaults: OperatorDefaults) -> Optional[str]:
    """The exclusive-topology key of a multi-node group: spec.parallelism.groupTopologyKey, else the operator's
    ('' in either: none); None for one node."""
    if spec.parallelism.nodes == 1:
        return None
    key = spec.parallelism.group_topology_key
    return (defaults.group_topology_key if key is None else key) or None
