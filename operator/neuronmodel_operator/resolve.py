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

from neuronmodel_operator import api, devices, images
from neuronmodel_operator.api import NeuronModelSpec, SpecError


@dataclass(frozen=True)
class OperatorDefaults:
    """Operator-wide settings that fill what a spec leaves unset (the chart sets them).

    The runtime image of a spec without `image` is `image` when set (one image for every model: tests, a local
    cluster, a mirror of one target), else the images.py target for the model's instance family and framework,
    tagged `<image_repository>:<image_version>-<target>`. A spec without compileCache.url gets `compile_cache`
    (url and policy) when set: one cache for every model of the cluster.
    """

    image: Optional[str] = None  # --runtime-image: overrides the per-family choice for every model
    hpa_metric: str = api.DEFAULT_HPA_METRIC  # the queue metric the HPA averages
    image_repository: str = images.DEFAULT_REPOSITORY
    image_version: str = field(default_factory=images.package_version)
    compile_cache: Optional[api.CompileCache] = None  # --compile-cache-url / --compile-cache-policy

    def filled(self, spec: NeuronModelSpec) -> NeuronModelSpec:
        """`spec` with the operator's compile cache when it names none of its own."""
        if spec.compile_cache.url is not None or self.compile_cache is None:
            return spec
        cache = self.compile_cache.model_copy(update={"sharded_weights": spec.compile_cache.sharded_weights})
        return spec.model_copy(update={"compile_cache": cache})

    def image_for(self, spec: NeuronModelSpec, family: Optional[str]) -> str:
        """The runtime image of `spec` on instance `family` (None: a node without Neuron)."""
        if spec.image or self.image:
            return spec.image or self.image
        try:
            return images.default_image(family, spec.framework, self.image_repository, self.image_version)
        except LookupError as exc:
            raise SpecError(f"spec.framework: {exc}; set spec.image, or another framework") from None


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
    warnings: tuple[str, ...]  # e.g. the model clearly does not fit

    def as_status(self) -> dict:
        status = {"framework": self.framework, "instanceType": self.instance_type,
                  "instanceFamily": self.instance_family, "logicalCoreConfig": self.logical_core_config,
                  "neuronCoresPerPod": self.cores_per_pod, "neuronDevicesPerPod": self.devices_per_pod,
                  "image": self.image, "compileKey": self.compile_key}
        return {key: value for key, value in status.items() if value is not None}


def compile_key(spec: NeuronModelSpec, image: str, instance_family: Optional[str], lnc: Optional[int]) -> str:
    """sha256 of the canonical JSON of what changes the compiled graphs (DESIGN.md, compile-artifact cache).

    The image stands for the framework, SDK and compiler versions it pins. Replicas, resources, placement and
    the server port are not in it: changing them never recompiles.
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
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _instance(spec: NeuronModelSpec, cores_per_pod: int) -> devices.InstanceType:
    if spec.instance_type is not None:
        instance = devices.INSTANCE_TYPES.get(spec.instance_type)
        if instance is None:
            raise SpecError(f"spec.instanceType: {spec.instance_type!r} is not a Neuron instance type; use one of "
                            f"{', '.join(devices.INSTANCE_TYPES)}, or framework torch for a CPU node")
        return instance
    instance = devices.smallest_instance_for(cores_per_pod, spec.framework)
    if instance is None:
        raise SpecError(f"spec.parallelism: no Neuron instance type holds {cores_per_pod} NeuronCores per node "
                        f"(tensorParallelDegree {spec.parallelism.tensor_parallel_degree} / nodes "
                        f"{spec.parallelism.nodes}); raise nodes or use a supported TP degree")
    return instance


def resolve(spec: NeuronModelSpec, defaults: OperatorDefaults) -> Resolved:
    compile_job = spec.compile_cache.url is not None and spec.compile_cache.policy != "Never"
    cores_per_pod = spec.parallelism.tensor_parallel_degree // spec.parallelism.nodes
    if spec.framework == "torch":  # the CPU reference runner: no NeuronCores, even on a Neuron instance
        instance = devices.INSTANCE_TYPES.get(spec.instance_type or "")
        family = instance.family.name if instance else None
        image = defaults.image_for(spec, family)
        key = compile_key(spec, image, family, None)
        return Resolved(spec.framework, spec.instance_type, family, None, 0, 0, {}, image, key, compile_job, ())
    if spec.parallelism.tensor_parallel_degree % spec.parallelism.nodes:
        raise SpecError("spec.parallelism.nodes must divide spec.parallelism.tensorParallelDegree")
    instance = _instance(spec, cores_per_pod)
    family = instance.family
    if spec.framework == "tnx" and spec.compile_cache.sharded_weights:
        raise SpecError("spec.compileCache.shardedWeights: transformers-neuronx saves pre-sharded weights only with "
                        "on-device embedding, which this runtime does not compile; remove it or use framework nxdi")
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
    request = devices.neuron_request(instance, lnc, cores_per_pod, spec.neuron_resource)
    warnings = []
    if (parameters := spec.model.parameter_count()) is not None:
        warning = devices.fit_warning(parameters, spec.model.dtype, instance, lnc,
                                      spec.parallelism.tensor_parallel_degree)
        if warning:
            warnings.append(warning)
    trn2_lnc = lnc if len(family.lnc_choices) > 1 else None
    image = defaults.image_for(spec, family.name)
    key = compile_key(spec, image, family.name, trn2_lnc)
    return Resolved(spec.framework, instance.name, family.name, trn2_lnc, request.cores, request.devices,
                    request.as_resources(), image, key, compile_job, tuple(warnings))
