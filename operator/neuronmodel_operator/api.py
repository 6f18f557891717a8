"""The NeuronModel API: group/version/kind, labels, annotations and env names in one place, and the typed spec.

`NeuronModelSpec` is the single definition of the spec: the operator parses every object with it once, at the
edge (`parse_spec`), and `crdgen.py` generates the CRD's openAPIV3Schema from it, with its descriptions,
defaults, enums and the CEL rules (`x-kubernetes-validations`) attached here (those across the whole spec's fields
are spec_rules.py's). A rule's message says how to fix.
CEL catches what it can at admission; `resolve.py` refuses what it cannot (the operator's Failed condition).

What the spec shares with the runtime comes from the runtime's contract (neuronmodel_runtime.config): the source
grammar (the CEL patterns), the rules across fields (their CEL rules and messages, naming the spec's fields through
RUNTIME_FIELDS), the choices of the fields the RuntimeConfig copies, and the pods' environment variable names.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from neuronmodel_operator import devices, spec_rules
from neuronmodel_operator.devices import MAX_DEVICE_TOP_K
from neuronmodel_runtime.config import env as runtime_env
from neuronmodel_runtime.config import rules, sources
from neuronmodel_runtime.config.model import CachePolicy, Dtype, Framework

GROUP = "neuronmodel.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "NeuronModel"
PLURAL = "neuronmodels"
SINGULAR = "neuronmodel"
SHORT_NAMES = ("nm",)
CRD_NAME = f"{PLURAL}.{GROUP}"
#: Revision of the CRD's schema, written into it as the annotation crdgen.ANNOTATION_REVISION. Bump it with every
#: schema change (tests/operator_tests/test_crd.py fails until you do): the operator refuses to start on a cluster
#: whose CRD is older (crd_check.py), since Helm never upgrades the CRDs of a chart's crds/.
CRD_REVISION = 6

FIELD_MANAGER = "neuronmodel-operator"
#: The field manager that takes spec.replicas over from FIELD_MANAGER when a model switches to spec.autoscaling (the
#: server-side apply ownership-transfer recipe): the operator's next apply omits the field without resetting it.
HANDOVER_FIELD_MANAGER = "neuronmodel-operator-handover"
OPERATOR_NAME = "neuronmodel-operator"

# Labels on every child (pod templates too). Only these: never the owner's labels (Helm/Argo tracking fights).
LABEL_NAME = f"{GROUP}/name"  # the NeuronModel's name; selects a model's children
LABEL_COMPONENT = "app.kubernetes.io/component"  # server | compile
LABEL_APP_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
APP_NAME = "neuronmodel"

# Annotations written by the operator.
ANNOTATION_COMPILE_KEY = f"{GROUP}/compile-key"  # on the compile Job and the pod template
ANNOTATION_SERVED = f"{GROUP}/served"  # on the workload: the spec its pods run and its resolution (compile gating)
ANNOTATION_SERVED_SPEC = f"{GROUP}/served-spec"  # the same, spec only, as operator 0.1.0 wrote it (read only)

# Environment of the operator process (the chart sets them).
ENV_RUNTIME_IMAGE = "NEURONMODEL_RUNTIME_IMAGE"  # default spec.image
ENV_HPA_METRIC = "NEURONMODEL_HPA_METRIC"  # default spec.autoscaling.metric
ENV_INSTANCE_FAMILY = runtime_env.INSTANCE_FAMILY  # set on runtime pods: the family artifacts are compiled for
DEFAULT_HPA_METRIC = "vllm:num_requests_waiting"  # as prometheus-adapter exposes vLLM's metric

SERVER_PORT_NAME = "http"
#: Longest NeuronModel name: children append suffixes (`-compile-<key>`, pod hashes) and Services need DNS-1035.
MAX_NAME_LENGTH = 40
NAME_RE = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"

# The runtime's source grammar, as CEL matches it. The rules quote the patterns as raw CEL strings, r'...': `\s` is
# not an escape CEL's ordinary string literals accept (the CRD would not install).
_SOURCE_RE = sources.SOURCE_PATTERN
CACHE_URL_PATTERN = sources.CACHE_URL_PATTERN
_SOURCE_FORMS = "hf://org/name, s3://bucket/prefix, pvc://claim/path or an absolute path"

#: RuntimeConfig field (dotted) -> the spec field (dotted, camelCase, under spec) it comes from: how the CEL rules
#: of rules.py name their fields here, and how the operator names a field the runtime refuses (builders/configmap.py,
#: which copies these). The RuntimeConfig's other fields are the operator's own (compile, server.host, ...).
RUNTIME_FIELDS = {
    "model": "model.source",
    "framework": "framework",
    "dtype": "model.dtype",
    "max_num_seqs": "batching.maxBatchSize",
    "max_model_len": "batching.maxSeqLen",
    "max_context_length": "batching.maxContextLength",
    "neuron_config_overrides": "neuronConfigOverrides",
    "sampling.on_device": "sampling.onDevice",
    "sampling.global_top_k": "sampling.globalTopK",
    "speculation.mode": "speculation.mode",
    "speculation.draft_model": "speculation.draftModel",
    "speculation.num_speculative_tokens": "speculation.numSpeculativeTokens",
    "speculation.prompt_lookup_min": "speculation.promptLookupMin",
    "speculation.prompt_lookup_max": "speculation.promptLookupMax",
    "parallelism.tensor_parallel_degree": "parallelism.tensorParallelDegree",
    "parallelism.nodes": "parallelism.nodes",
    "compile_cache.url": "compileCache.url",
    "compile_cache.policy": "compileCache.policy",
    "compile_cache.sharded_weights": "compileCache.shardedWeights",
    "server.port": "server.port",
    "server.served_model_name": "model.servedModelName",
}

#: Most keys of spec.neuronConfigOverrides. An OpenAPI bound (maxProperties), not CEL: the API server's CEL sees an
#: object that preserves unknown fields as a type without fields, with no size() (a rule on it does not compile).
MAX_NEURON_CONFIG_OVERRIDES = 64
#: The serving engines: neuronmodel (our runtime) and vllm (vLLM Neuron's own `vllm serve` from AWS's image).
Engine = Literal["neuronmodel", "vllm"]
DEFAULT_ENGINE = "neuronmodel"


#: A Kubernetes label key: an optional DNS-subdomain prefix and "/", then a name of 1-63 characters.
LABEL_KEY_PATTERN = (r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                     r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def _rules(*rules: tuple[str, str]) -> dict[str, Any]:
    """json_schema_extra carrying CEL rules: (rule, message saying how to fix)."""
    return {"x-kubernetes-validations": [{"rule": rule, "message": message} for rule, message in rules]}


def _shared(*shared: rules.Rule) -> dict[str, Any]:
    """json_schema_extra carrying the runtime's rules across fields (rules.py) as CEL, naming the spec's fields."""
    return _rules(*(rule.cel(RUNTIME_FIELDS.__getitem__) for rule in shared))


class _Spec(BaseModel):
    """camelCase keys as in the CRD; unknown keys are errors (the API server rejects them first)."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)


class SecretKeyRef(_Spec):
    name: str = Field(description="Secret in the NeuronModel's namespace.", max_length=253)
    key: str = Field("token", description="Key in the Secret.", max_length=253)


class DraftModel(_Spec):
    source: str = Field(description=f"Where the draft model is: {_SOURCE_FORMS}.", max_length=1024,
                        json_schema_extra=_rules((f"self.matches(r'{_SOURCE_RE}')",
                                                  f"draftModel.source must be {_SOURCE_FORMS}")))
    revision: Optional[str] = Field(None, description="hf:// revision (branch, tag or commit); default main.",
                                    max_length=256)
    eagle3: Optional[bool] = Field(
        None, description="Mode eagle: the draft is an EAGLE3 checkpoint (its config.json names an Eagle3 "
        "architecture). Engine vllm on inf2/trn1 needs it to compile the draft as EAGLE3 (vLLM Neuron 0.5 never sets "
        "NxDI's is_eagle3; the operator sets it); our runtime reads it from the checkpoint, and vLLM Neuron on trn2 "
        "takes EAGLE3 drafts only.")


class ModelSpec(_Spec):
    source: str = Field(
        description=f"Where the model is: {_SOURCE_FORMS}. hf:// and s3:// are downloaded by an init container "
        "(`neuronmodel-runtime fetch`); pvc:// and paths are mounted.", max_length=1024,
        json_schema_extra=_rules((f"self.matches(r'{_SOURCE_RE}')", f"model.source must be {_SOURCE_FORMS}")))
    revision: Optional[str] = Field(None, description="hf:// revision (branch, tag or commit); default main. "
                                    "Pin a commit for reproducible compile-cache keys.", max_length=256)
    token_secret_ref: Optional[SecretKeyRef] = Field(
        None, description="Secret holding the Hugging Face token (HF_TOKEN) for gated or private repos.")
    dtype: Dtype = Field(
        "auto", description="Weights dtype; auto is bfloat16 on Neuron, float32 on CPU.")
    served_model_name: Optional[str] = Field(
        None, description="The `model` name clients send; default: the NeuronModel's name.", max_length=256)
    parameters: Optional[str] = Field(
        None, description="Parameter count, e.g. 8B or 135M: lets the operator warn when TP x HBM cannot hold it.",
        pattern=r"^[0-9]+(\.[0-9]+)?[KMBT]$", max_length=16)

    def parameter_count(self) -> Optional[float]:
        if self.parameters is None:
            return None
        scale = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}[self.parameters[-1]]
        return float(self.parameters[:-1]) * scale


class Parallelism(_Spec):
    model_config = ConfigDict(json_schema_extra=_shared(rules.NODES))

    tensor_parallel_degree: int = Field(1, ge=1, le=1024, description="NeuronCores the model is sharded over, "
                                        "across all nodes of a serving group.")
    nodes: int = Field(1, ge=1, le=64, description="Nodes per serving group; > 1 makes a LeaderWorkerSet.")
    logical_core_config: Optional[Literal[1, 2]] = Field(
        None, description="trn2 only: logical NeuronCore config (NEURON_LOGICAL_NC_CONFIG), 2 by default; must "
        "match the nodes' setting.")
    efa: Optional[bool] = Field(
        None, description="nodes > 1: request the instance type's EFA devices (vpc.amazonaws.com/efa, from the EFA "
        "device plugin) for the collectives between the group's nodes; default on where the instance type has "
        "them (trn1.32xlarge 8, trn1n.32xlarge 16, trn2.48xlarge 16, trn2u.48xlarge 16).")
    group_topology_key: Optional[str] = Field(
        None, max_length=316, pattern=f"^(|{LABEL_KEY_PATTERN})$",
        description="nodes > 1: the node label whose value a serving group has to itself (LeaderWorkerSet's "
        "exclusive-topology: one group per node group or placement group, never two sharing one); default the "
        "operator's (chart value multiNode.groupTopologyKey, eks.amazonaws.com/nodegroup); '' for none.")


class Batching(_Spec):
    model_config = ConfigDict(json_schema_extra=_shared(rules.CONTEXT_LENGTH))

    max_batch_size: int = Field(8, ge=1, le=1024, description="Batch slots per replica (Neuron's compiled batch).")
    max_context_length: int = Field(1024, ge=1, le=1048576, description="Longest prompt in tokens.")
    max_seq_len: int = Field(2048, ge=2, le=1048576, description="Longest sequence (prompt + output) in tokens.")


class Sampling(_Spec):
    on_device: bool = Field(True, description="Sample on the NeuronCores; logprobs need false.")
    global_top_k: int = Field(256, ge=1, le=65536, description="Candidates per row before per-request top-k/top-p; "
                              f"at most {MAX_DEVICE_TOP_K} on a Neuron device (onDevice true, framework other than "
                              "torch).")


class Speculation(_Spec):
    model_config = ConfigDict(json_schema_extra=_shared(rules.DRAFT_MODEL, rules.PROMPT_LOOKUP))

    mode: rules.SpeculationMode = Field(
        "none", description="none | draft (a smaller draft model) | eagle (an EAGLE draft; Neuron runners) | "
        "promptLookup (n-grams of the request itself, no draft model).")
    draft_model: Optional[DraftModel] = Field(None, description="The draft model of mode draft or eagle.")
    num_speculative_tokens: int = Field(4, ge=1, le=16, description="k: tokens proposed per step.")
    prompt_lookup_min: int = Field(2, ge=1, le=64, description="Smallest n-gram prompt lookup matches.")
    prompt_lookup_max: int = Field(4, ge=1, le=64, description="Largest n-gram prompt lookup matches.")


class CompileCache(_Spec):
    url: Optional[str] = Field(
        None, description="Compiled-artifact cache: s3://bucket/prefix, pvc://claim/path or a node path. With "
        "policy IfNotCached or Always a compile Job fills it before the serving pods start. Framework torch "
        "compiles its graphs (torch.compile) only with a cache.", max_length=1024,
        json_schema_extra=_rules((f"self.matches(r'{CACHE_URL_PATTERN}')",
                                  "compileCache.url must be s3://bucket/prefix, pvc://claim/path or an absolute path")))
    policy: CachePolicy = Field(
        "IfNotCached", description="IfNotCached: compile on a miss; Always: recompile; Never: serving pods never "
        "compile (a miss fails the pod).")
    sharded_weights: bool = Field(
        False, description="Store the weights pre-sharded per TP rank with the compiled artifacts (NxDI's "
        "save_sharded_checkpoint): pods load their rank's shard instead of sharding the checkpoint at start; the "
        "cache entry grows by the model's size. Not with framework tnx; framework torch (one process) has nothing to "
        "shard and always stores its converted weights.")


class Autoscaling(_Spec):
    model_config = ConfigDict(json_schema_extra=_rules((
        "self.minReplicas <= self.maxReplicas", "autoscaling.minReplicas must be <= autoscaling.maxReplicas")))

    min_replicas: int = Field(1, ge=1, le=1000, description="Fewest replicas (Neuron cold starts take minutes).")
    max_replicas: int = Field(ge=1, le=1000, description="Most replicas.")
    metric: Optional[str] = Field(
        None, description="Per-pod metric the HPA averages; default the operator's (vllm:num_requests_waiting, "
        "as prometheus-adapter exposes it).", max_length=253)
    target_average_value: str = Field(
        "4", description="Target average of the metric per pod (a quantity).", max_length=32,
        pattern=r"^[0-9]+(\.[0-9]+)?(m|k|M|G)?$")


class Rollout(_Spec):
    max_unavailable: Optional[Union[int, str]] = Field(
        None, description="Pods (groups when nodes > 1) that may be unavailable during a rollout; default 0 on one "
        "node (serving capacity kept), 1 for nodes > 1 (a group is replaced in place).",
        json_schema_extra={"x-kubernetes-int-or-string": True})
    max_surge: Optional[Union[int, str]] = Field(
        None, description="Extra pods (groups when nodes > 1) during a rollout; default 1 on one node, where the "
        "surge pod needs spare NeuronCores (with none free, set maxSurge 0 and maxUnavailable 1), and 0 for nodes > 1: "
        "with an exclusive group topology key (parallelism.groupTopologyKey) a surge group needs a whole free node "
        "group, which a cluster sized one node group per replica never has; set it only with a spare one.",
        json_schema_extra={"x-kubernetes-int-or-string": True})


class Server(_Spec):
    port: int = Field(8000, ge=1, le=65535, description="HTTP port of the OpenAI-compatible server.")
    api_key_secret_ref: Optional[SecretKeyRef] = Field(
        None, description="Secret holding the bearer token required on /v1/* (never in the ConfigMap).")


class Toleration(_Spec):
    key: Optional[str] = Field(None, max_length=253, description="Taint key; empty with operator Exists matches all.")
    operator: Optional[Literal["Exists", "Equal"]] = Field(None, description="Exists or Equal (default).")
    value: Optional[str] = Field(None, max_length=253, description="Taint value for operator Equal.")
    effect: Optional[Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]] = Field(None, description="Taint effect.")
    toleration_seconds: Optional[int] = Field(None, description="How long a NoExecute taint is tolerated.")


class Resources(_Spec):
    requests: dict[str, Union[int, str]] = Field(
        default_factory=dict, description="cpu, memory, ... requested by the runtime container.",
        json_schema_extra={"additionalProperties": {"x-kubernetes-int-or-string": True}})
    limits: dict[str, Union[int, str]] = Field(
        default_factory=dict, description="Limits of the runtime container (Neuron resources are added).",
        json_schema_extra={"additionalProperties": {"x-kubernetes-int-or-string": True}})


class NeuronModelSpec(_Spec):
    """What a user asks for. Everything has a default except model.source (no replicas and no autoscaling: one
    replica, as a Deployment)."""

    model_config = ConfigDict(json_schema_extra=_rules(*spec_rules.SPEC_RULES))

    model: ModelSpec = Field(description="The model to serve.")
    framework: Framework = Field(
        "auto", description="auto (NxDI if the image has it, else TNx) | nxdi | tnx (end of support upstream) | "
        "torch (the PyTorch reference runner, CPU).")
    engine: Engine = Field(
        DEFAULT_ENGINE, description="neuronmodel: our runtime (neuronmodel-runtime serve); vllm: vLLM Neuron's own "
        "`vllm serve` from AWS's vLLM Neuron image of the instance family (the native plugin on trn2, the NxDI-based "
        "one on inf2/trn1), with the spec translated into vLLM's flags; framework auto only, speculation none or "
        "eagle, one node; with compileCache, the same compile Job, cache and policies as our runtime (serving "
        "pods never compile: a miss fails them).")
    parallelism: Parallelism = Field(default_factory=Parallelism, description="Tensor parallelism.")
    batching: Batching = Field(default_factory=Batching, description="Compiled batch and sequence shapes.")
    sampling: Sampling = Field(default_factory=Sampling, description="On-device sampling.")
    speculation: Speculation = Field(default_factory=Speculation, description="Speculative decoding.")
    compile_cache: CompileCache = Field(default_factory=CompileCache, description="Compiled-artifact cache.")
    neuron_config_overrides: dict[str, Any] = Field(
        default_factory=dict, max_length=MAX_NEURON_CONFIG_OVERRIDES,
        description="NxDI / transformers-neuronx NeuronConfig keywords the runtime merges last, as vLLM's "
        "--additional-config '{\"override_neuron_config\": {...}}': fused QKV, kernels, quantization, sequence "
        "parallelism (e.g. {fused_qkv: true, sequence_parallel_enabled: true}); values are any JSON. The runtime "
        "checks the keys against the installed NxDI / TNx release at start: an unknown key fails the pod and the "
        "compile Job, naming the key. Keys the runtime derives from other spec fields (batch sizes, sequence "
        "lengths, tp_degree, speculation, on-device sampling, dtype, sharded weights) are refused: set those "
        "fields. Part of the compile key: a change recompiles. At most "
        f"{MAX_NEURON_CONFIG_OVERRIDES} keys; not with framework torch (the reference runner has no NeuronConfig). "
        "With engine vllm they go to vLLM Neuron, which does not check them (NxDI logs a keyword it lacks, the "
        "native plugin ignores one): into override_neuron_config (NxDI keywords) on inf2/trn1, into the native "
        "plugin's neuron_config (its own keys) on trn2; keys the operator sets through vLLM's flags are refused.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})
    replicas: Optional[int] = Field(None, ge=0, le=1000, description="Serving replicas (groups when nodes > 1); "
                                    "exclusive with autoscaling.")
    autoscaling: Optional[Autoscaling] = Field(None, description="An HPA on a per-pod queue metric; exclusive "
                                               "with replicas.")
    rollout: Rollout = Field(default_factory=Rollout, description="How pods are replaced on a change.")
    instance_type: Optional[str] = Field(
        None, description="EC2 instance type the pods run on (node.kubernetes.io/instance-type), e.g. inf2.xlarge; "
        "unset: the smallest Neuron instance that holds the TP degree.", max_length=63)
    device_allocation: Literal["devicePlugin", "dra"] = Field(
        "devicePlugin", description="devicePlugin: request NeuronCores or devices from the Neuron device plugin "
        "(extended resources; pods on part of a node use the Neuron scheduler extension); dra: a ResourceClaim per "
        "pod from a ResourceClaimTemplate on the Neuron DRA driver's DeviceClass neuron.aws.com, whole devices "
        "(neuronResource does not apply), a connected group of 4, 8 or 16, the LNC in its config (Kubernetes >= "
        "1.34, nodes without the device plugin). Several devices per pod only on EFA-enabled instance types (the "
        "driver publishes its connected-group attributes there only: not inf2); not on Karpenter or EKS Auto Mode "
        "nodes, where EKS runs the device plugin.")
    neuron_resource: devices.NeuronResource = Field(
        "neuroncore", description="neuroncore: request aws.amazon.com/neuroncore = TP/nodes; neuron: request "
        "whole aws.amazon.com/neuron devices.")
    resources: Resources = Field(default_factory=Resources, description="cpu/memory of the runtime container.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Extra node labels the pods require.")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32,
                                          description="Extra tolerations (aws.amazon.com/neuron is always tolerated "
                                          "on Neuron instances).")
    scheduler_name: Optional[str] = Field(None, max_length=253, description="e.g. the Neuron scheduler extension "
                                          "(my-scheduler), needed for contiguous cores on partial nodes.")
    image: Optional[str] = Field(None, max_length=1024, description="Runtime image; default the operator's.")
    service_account_name: Optional[str] = Field(None, max_length=253, description="Pods' ServiceAccount (IRSA / "
                                                "Pod Identity for s3:// sources and caches).")
    server: Server = Field(default_factory=Server, description="The OpenAI-compatible HTTP server.")

    def replica_count(self) -> int:
        """Fixed replicas, or the autoscaler's minimum as the starting point."""
        if self.replicas is not None:
            return self.replicas
        return self.autoscaling.min_replicas if self.autoscaling else 1


Phase = Literal["Pending", "Compiling", "Loading", "Ready", "Degraded", "Failed"]
ConditionType = Literal["ArtifactsReady", "Available", "Progressing", "Ready", "Autoscaling"]
CONDITION_TYPES: tuple[str, ...] = ("ArtifactsReady", "Available", "Progressing", "Ready")


class Condition(_Spec):
    """A metav1.Condition-shaped condition."""

    type: ConditionType = Field(description="ArtifactsReady | Available | Progressing | Ready, and Autoscaling "
                                "under spec.autoscaling (the HPA's ScalingActive / AbleToScale).")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason, e.g. Compiled, CompileFailed, Unschedulable.", max_length=1024)
    message: str = Field("", description="What happened and, for a problem, how to fix it.", max_length=32768)
    last_transition_time: Optional[str] = Field(None, description="When status last changed (RFC 3339).")
    observed_generation: Optional[int] = Field(None, description="The spec generation this condition is about.")


class ResolvedStatus(_Spec):
    """What the operator decided for the spec (what "auto" and defaults became)."""

    framework: Optional[str] = Field(None, description="Framework the pods run (auto: the image decides).")
    instance_type: Optional[str] = Field(None, description="Instance type the pods are placed on.")
    instance_family: Optional[str] = Field(None, description="inf2, trn1 or trn2.")
    logical_core_config: Optional[int] = Field(None, description="trn2's logical NeuronCore config.")
    neuron_cores_per_pod: Optional[int] = Field(None, description="NeuronCores each pod gets.")
    neuron_devices_per_pod: Optional[int] = Field(None, description="Neuron devices those cores span.")
    efa_devices_per_pod: Optional[int] = Field(None, description="EFA devices each pod of a multi-node group "
                                               "requests (vpc.amazonaws.com/efa).")
    group_topology_key: Optional[str] = Field(None, description="The node label whose value each multi-node group "
                                              "has to itself (LeaderWorkerSet exclusive-topology).")
    image: Optional[str] = Field(None, description="Runtime image.")
    compile_key: Optional[str] = Field(None, description="sha256 of everything that changes the compiled graphs.")
    model_revision: Optional[str] = Field(None, description="The hf:// commit every replica serves (an unpinned "
                                          "revision resolved once, at the first reconcile of the source).")
    draft_revision: Optional[str] = Field(None, description="The draft model's hf:// commit, likewise.")
    revisions: dict[str, str] = Field(default_factory=dict, description="Each hf:// source as the spec names it "
                                      "(source@revision) and the commit it was resolved to, once: kept while the "
                                      "source and revision stay.")
    scheduler_name: Optional[str] = Field(None, description="The scheduler the pods ask for (the Neuron scheduler "
                                          "extension's for pods that take part of a node).")


class Timings(_Spec):
    compile_seconds: Optional[float] = Field(None, description="Compile Job start to completion.")
    load_seconds: Optional[float] = Field(None, description="Serving pod start to its first Ready (slowest pod).")
    time_to_ready_seconds: Optional[float] = Field(None, description="Spec change (or creation) to Ready.")


class NeuronModelStatus(_Spec):
    """What the operator observed and decided; written by the operator only (status subresource)."""

    phase: Optional[Phase] = Field(None, description="Pending, Compiling, Loading, Ready, Degraded or Failed.")
    conditions: list[Condition] = Field(default_factory=list, description="ArtifactsReady, Available, "
                                        "Progressing, Ready.",
                                        json_schema_extra={"x-kubernetes-list-type": "map",
                                                           "x-kubernetes-list-map-keys": ["type"]})
    replicas: Optional[int] = Field(None, description="Serving pods (groups when nodes > 1), ready or not: the "
                                    "scale subresource reads this.")
    ready_replicas: Optional[int] = Field(None, description="Serving pods (groups) that are ready.")
    ready: Optional[str] = Field(None, description="readyReplicas/desired, for kubectl get.")
    selector: Optional[str] = Field(None, description="Label selector of the serving pods (scale subresource).")
    endpoint: Optional[str] = Field(None, description="In-cluster URL of the OpenAI-compatible API.")
    resolved: Optional[ResolvedStatus] = Field(None, description="What the operator resolved the spec to.")
    timings: Optional[Timings] = Field(None, description="Compile, load and time to ready, in seconds.")
    warnings: list[str] = Field(default_factory=list, description="Problems that do not stop the rollout.")
    observed_generation: Optional[int] = Field(None, description="The spec generation last reconciled.")


class SpecError(ValueError):
    """A spec the operator cannot serve; the message names the field and the fix."""


def parse_spec(spec: Mapping[str, Any]) -> NeuronModelSpec:
    """The typed spec of a NeuronModel body's `spec`, or SpecError naming every bad field."""
    try:
        return NeuronModelSpec.model_validate(dict(spec))
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = "spec." + ".".join(str(p) for p in err["loc"]) if err["loc"] else "spec"
            message = "unknown field" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
            problems.append(f"{where}: {message}")
        raise SpecError("; ".join(problems)) from None
