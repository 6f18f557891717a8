"""The pod shared by the Deployment, the LeaderWorkerSet (leader and worker) and the compile Job.

One container, `runtime`, running a `neuronmodel-runtime` command against /etc/neuronmodel/config.json, under the
restricted Pod Security profile (non-root, no privilege escalation, all capabilities dropped, seccomp
RuntimeDefault, read-only root filesystem). What it writes goes to emptyDirs: /tmp (HOME), /var/cache/neuronmodel
(NEURONMODEL_CACHE), /var/tmp (the Neuron compiler's cache, NEURON_COMPILE_CACHE_URL) and /dev/shm (memory).
Models are mounted or downloaded as `sources.py` says. Neuron device nodes come from the device plugin (or the
DRA driver, `dra.py`); a non-root runtime needs them accessible to uid 1000 (check on real nodes, in the hardware
issue).

Sizing (`sizing.py`): the runtime container requests its share of the node's CPU and RAM and the ephemeral
storage its emptyDirs may fill, each emptyDir has a sizeLimit, and spec.resources overrides any of these requests.
Serving pods spread over nodes and zones (`topology_spread`).

Engine vllm (spec.engine) changes the containers only: AWS's vLLM Neuron image running `vllm serve` as its command
(PID 1, so SIGTERM drains it) with the spec as vLLM's flags and environment (`vllm.py`), probed on /health (vLLM has
no /ready), and no RuntimeConfig volume; its download init containers, and with a compile cache the ones that hand
vLLM's compiled folder in and out of the store (`fetch-artifacts`, and in the compile Job `install-supervisor` and
`store-artifacts`, beside vLLM under its supervisor), run our runtime image (Resolved.fetch_image). Everything else
is shared.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional, Sequence

from neuronmodel_operator import api, devices
from neuronmodel_operator.api import SpecError
from neuronmodel_operator.builders import dra, sizing, sources, vllm
from neuronmodel_operator.builders.common import COMPONENT_COMPILE, COMPONENT_SERVER, Target, labels, selector
from neuronmodel_operator.builders.configmap import DRAIN_TIMEOUT_S
from neuronmodel_runtime.config import env as runtime_env

Role = Literal["serve", "worker", "compile"]

CONTAINER_NAME = "runtime"
RUN_AS = 1000
CACHE_DIR = "/var/cache/neuronmodel"
NEURON_COMPILE_CACHE = "/var/tmp/neuron-compile-cache"
#: SIGTERM -> the runtime drains in-flight requests for DRAIN_TIMEOUT_S, then exits; the rest is margin.
TERMINATION_GRACE_S = DRAIN_TIMEOUT_S + 15

#: What the Neuron runtime's collectives over EFA read (libfabric), as AWS's trn1 multi-node scripts export them.
EFA_ENV = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"}
GROUP_PORT_NAME = "group"

SERVE_COMMAND = ("neuronmodel-runtime", "serve", "--config", sources.CONFIG_FILE)
WORKER_COMMAND = ("neuronmodel-runtime", "worker", "--config", sources.CONFIG_FILE)
COMPILE_COMMAND = ("neuronmodel-runtime", "compile", "--config", sources.CONFIG_FILE)

#: The startupProbe's period: a pod turns Ready at most this long after it could (the real-node e2e: a warm
#: replica's whole start is about 10 s), for one /ready request per period while it starts.
STARTUP_PERIOD_S = 5
#: Startup budgets (seconds) of `startup_budget_s`.
BUDGET_TORCH_S = 10 * 60
BUDGET_CACHED_S = 30 * 60
BUDGET_COMPILE_IN_POD_S = vllm.COMPILE_BUDGET_S


def startup_budget_s(target: Target) -> int:
    """How long a serving pod may take from container start to /ready (its startupProbe), by what it must do.

    - framework torch (the CPU reference runner): load only, 10 min;
    - a Neuron runner with a compile cache (spec.compileCache.url): the artifacts come from the cache (the compile
      Job filled it, or policy Never says they are there), so load plus a cache read, 30 min;
    - a Neuron runner without one compiles inside the pod at every start: 4 h (large models compile for hours).

    Downloads (hf://, s3://) run in init containers, before the probe starts counting.
    """
    if target.spec.framework == "torch":
        return BUDGET_TORCH_S
    if target.spec.compile_cache.url is not None:
        return BUDGET_CACHED_S
    return BUDGET_COMPILE_IN_POD_S


def security_context() -> dict[str, Any]:
    """The restricted container security context (every container, init containers too)."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True}


def pod_security_context() -> dict[str, Any]:
    # OnRootMismatch: the kubelet chowns a volume to fsGroup only when its root is not already right; a recursive
    # chown of a large compile-cache or model PVC at every pod start would take minutes.
    return {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
            "fsGroupChangePolicy": "OnRootMismatch", "seccompProfile": {"type": "RuntimeDefault"}}


def _secret_env(name: str, ref: api.SecretKeyRef) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


def efa_devices(target: Target, role: Role) -> int:
    """EFA devices the pod of `role` requests: a multi-node group's serving pods only (the compile Job compiles
    alone)."""
    return 0 if role == "compile" else target.resolved.efa_per_pod


def _env(target: Target, role: Role) -> list[dict[str, Any]]:
    env = []
    if target.spec.server.api_key_secret_ref is not None:
        env.append(_secret_env(runtime_env.API_KEY, target.spec.server.api_key_secret_ref))
    if target.resolved.instance_family is not None:  # part of the compiled artifacts' cache key (the target)
        env.append({"name": runtime_env.INSTANCE_FAMILY, "value": target.resolved.instance_family})
    if target.resolved.logical_core_config is not None:
        env.append({"name": runtime_env.LOGICAL_NC_CONFIG, "value": str(target.resolved.logical_core_config)})
    env += [{"name": runtime_env.CACHE, "value": CACHE_DIR},
            {"name": "HOME", "value": "/tmp"},
            {"name": runtime_env.NEURON_COMPILE_CACHE_URL, "value": NEURON_COMPILE_CACHE}]
    if efa_devices(target, role):
        env += [{"name": name, "value": value} for name, value in EFA_ENV.items()]
    return env


def _quantities(values: Mapping[str, Any]) -> dict[str, str]:
    return {key: str(value) for key, value in sorted(values.items())}


def resources(target: Target, defaults: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, Any]:
    """spec.resources; `defaults` for each request it sets neither a request nor a limit of (a limit alone makes
    the request equal to it); `extra` (the Neuron device-plugin request) in both requests and limits (extended
    resources must have requests == limits)."""
    spec = target.spec.resources
    unset = {key: value for key, value in defaults.items() if key not in spec.requests and key not in spec.limits}
    out = {}
    requests = _quantities({**unset, **spec.requests, **extra})
    limits = _quantities({**spec.limits, **extra})
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def runtime_resources(target: Target, role: Role) -> dict[str, Any]:
    """The runtime container's: default requests, the device plugin's resource or the DRA claim, and its EFA
    devices (`efa_devices`)."""
    extra = dict(target.resolved.neuron_resources)
    if efa := efa_devices(target, role):
        extra[devices.EFA_RESOURCE] = str(efa)
    out = resources(target, sizing.default_requests(target), extra)
    if dra.uses_dra(target):
        out["claims"] = [{"name": dra.CLAIM}]
    return out


def _http_get(path: str) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": api.SERVER_PORT_NAME}}


def probes(target: Target) -> dict[str, Any]:
    """startupProbe on /ready sized by `startup_budget_s`; then readiness /ready and liveness /health. vLLM has no
    /ready: its /health answers only once the engine is up (the port opens after compile and warm-up), so engine
    vllm is probed on /health throughout.

    Liveness only starts once the startup probe has passed, so a long compile is never killed by it.
    """
    ready = "/health" if target.runs_vllm else "/ready"
    return {
        "startupProbe": {**_http_get(ready), "periodSeconds": STARTUP_PERIOD_S, "timeoutSeconds": 5,
                         "failureThreshold": startup_budget_s(target) // STARTUP_PERIOD_S},
        "readinessProbe": {**_http_get(ready), "periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**_http_get("/health"), "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3},
    }


def _mounts(target: Target) -> list[sources.SourceMount]:
    spec = target.spec
    return [m for m in (sources.model_mount(spec), sources.draft_mount(spec), sources.compile_cache_mount(spec))
            if m is not None]


def _empty_dir(name: str, size: str, medium: Optional[str] = None) -> dict[str, Any]:
    return {"name": name, "emptyDir": {**({"medium": medium} if medium else {}), "sizeLimit": size}}


def volumes_and_mounts(target: Target,
                       config_map: Optional[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's volumes (the RuntimeConfig from ConfigMap `config_map`, none for engine vllm; emptyDirs sized by
    `volume_sizes_gib`) and the runtime container's volumeMounts."""
    sizes = {name: f"{gib}Gi" for name, gib in sizing.volume_sizes_gib(target).items()}
    volumes = [_empty_dir("shm", sizing.shm_size(target), "Memory"),
               _empty_dir("tmp", sizes["tmp"]),
               _empty_dir("cache", sizes["cache"]),
               _empty_dir("neuron-cache", sizes["neuron-cache"])]
    mounts = [{"name": "shm", "mountPath": "/dev/shm"},
              {"name": "tmp", "mountPath": "/tmp"},
              {"name": "cache", "mountPath": CACHE_DIR},
              {"name": "neuron-cache", "mountPath": "/var/tmp"}]
    if config_map is not None:
        volumes.insert(0, {"name": "config", "configMap": {"name": config_map}})
        mounts.insert(0, {"name": "config", "mountPath": sources.CONFIG_DIR, "readOnly": True})
    for placed in _mounts(target):
        if placed.volume is None or any(v["name"] == placed.volume["name"] for v in volumes):
            continue  # an s3:// cache; or the models emptyDir that the model and the draft share
        volumes.append(_empty_dir(sources.MODELS_VOLUME, sizes[sources.MODELS_VOLUME])
                       if placed.fetch is not None else placed.volume)
        mounts.append(placed.mount)
    paths = [m["mountPath"] for m in mounts]
    if len(set(paths)) != len(paths):
        duplicate = next(p for p in paths if paths.count(p) > 1)
        raise SpecError(f"spec: two sources are both mounted at {duplicate}; use distinct paths")
    return volumes, mounts


def _fetch_image(target: Target) -> str:
    return target.resolved.fetch_image or target.resolved.image  # the vLLM image has no neuronmodel-runtime


def init_containers(target: Target) -> list[dict[str, Any]]:
    """One `fetch-<role>` per downloaded source (hf://, s3://): `neuronmodel-runtime fetch` writes it into the
    models emptyDir atomically. The HF token (spec.model.tokenSecretRef, used for the draft too: a gated draft of
    the same family needs it) reaches only these containers, as HF_TOKEN from a secretKeyRef; s3:// credentials
    come from the ServiceAccount (IRSA / Pod Identity)."""
    containers = []
    for placed in _mounts(target):
        if placed.fetch is None:
            continue
        env = []
        token = target.spec.model.token_secret_ref
        if token is not None and placed.source.startswith("hf://"):
            env.append(_secret_env(runtime_env.HF_TOKEN, token))
        env.append({"name": "HOME", "value": "/tmp"})
        init: dict[str, Any] = {"name": placed.init_name, "image": _fetch_image(target),
                                "command": list(placed.fetch), "env": env,
                                "resources": resources(target, sizing.fetch_requests(target), {})}
        init["securityContext"] = security_context()
        init["volumeMounts"] = [{"name": sources.MODELS_VOLUME, "mountPath": sources.MODELS_DIR},
                                {"name": "tmp", "mountPath": "/tmp"}]
        containers.append(init)
    return containers


def _placement(target: Target) -> dict[str, Any]:
    spec, resolved = target.spec, target.resolved
    out: dict[str, Any] = {}
    node_selector = dict(spec.node_selector)
    if resolved.instance_type is not None:  # the resolved instance type wins over a conflicting spec.nodeSelector
        node_selector[devices.INSTANCE_TYPE_LABEL] = resolved.instance_type
    if node_selector:
        out["nodeSelector"] = dict(sorted(node_selector.items()))
    tolerations = []
    if resolved.instance_family is not None:
        tolerations.append({"key": devices.NEURON_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"})
    tolerations += [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in spec.tolerations]
    if tolerations:
        out["tolerations"] = tolerations
    if resolved.scheduler_name:
        out["schedulerName"] = resolved.scheduler_name
    if spec.service_account_name:
        out["serviceAccountName"] = spec.service_account_name
    return out


def topology_spread(target: Target) -> list[dict[str, Any]]:
    """Replicas spread over nodes and then zones, so that one node or zone going down takes as few as possible.

    ScheduleAnyway (a scoring preference, not a filter): Neuron capacity is often in one zone only (capacity
    blocks, ODCRs) or one node, and DoNotSchedule would leave replicas Pending there, or block a rollout's surge
    pod. `pod-template-hash` keeps a rollout's new pods from counting the old ones they replace.
    """
    return [{"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": selector(target)}, "matchLabelKeys": ["pod-template-hash"]}
            for key in ("kubernetes.io/hostname", "topology.kubernetes.io/zone")]


def _container(target: Target, command: Sequence[str], role: Role, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """The `runtime` container; probes and the http port on serving pods only (role "serve"). Engine vllm: `vllm
    serve` is the command (`command` unused), in a writable working directory; in the compile Job under its
    supervisor (`vllm.compile_command`)."""
    out: dict[str, Any] = {"name": CONTAINER_NAME, "image": target.resolved.image}
    if target.runs_vllm:
        vllm_command = vllm.compile_command(target) if role == "compile" else vllm.serve_command(target)
        out.update(command=vllm_command, workingDir=vllm.WORKING_DIR)
    else:
        out["command"] = list(command)
    if role == "serve":
        out["ports"] = [{"name": api.SERVER_PORT_NAME, "containerPort": target.spec.server.port, "protocol": "TCP"}]
    if role == "serve" and target.multi_node:  # where the group's ranks meet (torch.distributed's rendezvous)
        out["ports"].append({"name": GROUP_PORT_NAME, "containerPort": runtime_env.DEFAULT_GROUP_PORT,
                             "protocol": "TCP"})
    out["env"] = vllm.env(target, role) if target.runs_vllm else _env(target, role)
    out["resources"] = runtime_resources(target, role)
    if role == "serve":
        out.update(probes(target))
    out["securityContext"] = security_context()
    # the status code reads why the runtime exited from the termination message, or its log's tail when it wrote none
    out["terminationMessagePolicy"] = "FallbackToLogsOnError"
    out["volumeMounts"] = mounts
    return out


def pod_spec(target: Target, command: Sequence[str], role: Role, config_map: Optional[str]) -> dict[str, Any]:
    """The PodSpec of `role`: "serve" (Deployment, LWS leader), "worker" (LWS workers: no probes, no port; a
    worker exits non-zero when it loses its group, and LeaderWorkerSet's RecreateGroupOnPodRestart then restarts
    the whole group) or "compile" (the compile Job: restartPolicy Never, no probes), reading its RuntimeConfig from
    ConfigMap `config_map` (None: engine vllm, which reads none)."""
    volumes, mounts = volumes_and_mounts(target, config_map)
    spec: dict[str, Any] = {
        # The runtime never calls the Kubernetes API. IRSA and EKS Pod Identity are unaffected: their webhooks
        # inject their own projected token volume, independent of this setting.
        "automountServiceAccountToken": False,
        # No Docker-link variables: a Service named `neuronmodel` would set NEURONMODEL_PORT=tcp://..., which the
        # runtime reads as server.port.
        "enableServiceLinks": False,
        "restartPolicy": "Never" if role == "compile" else "Always",
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "securityContext": pod_security_context(),
        **_placement(target),
    }
    if role == "serve" and not target.multi_node:
        # a multi-node group belongs close together (one zone, EFA): LeaderWorkerSet's placement, not a spread
        spec["topologySpreadConstraints"] = topology_spread(target)
    if dra.uses_dra(target):
        spec["resourceClaims"] = [{"name": dra.CLAIM, "resourceClaimTemplateName": dra.claim_template_name(target)}]
    inits, containers = init_containers(target), [_container(target, command, role, mounts)]
    if target.runs_vllm and target.spec.compile_cache.url is not None:
        inits, containers = _vllm_artifacts(target, role, inits, containers)
    if inits:
        spec["initContainers"] = inits
    spec["containers"] = containers
    spec["volumes"] = volumes
    return spec


def _artifacts_container(target: Target, name: str, command: list[str]) -> dict[str, Any]:
    """One of our runtime's `artifacts` containers of an engine vllm pod: vLLM's compiled folder on the cache
    emptyDir, the compile cache, the key's inputs."""
    cache = sources.compile_cache_mount(target.spec)
    mounts = [{"name": "cache", "mountPath": CACHE_DIR}, {"name": "tmp", "mountPath": "/tmp"}]
    if cache is not None and cache.mount is not None:
        mounts.append(cache.mount)
    return {"name": name, "image": _fetch_image(target), "command": command,
            "env": [vllm.key_env(target), {"name": "HOME", "value": "/tmp"}],
            "resources": resources(target, sizing.artifacts_requests(target), {}),
            "securityContext": security_context(), "terminationMessagePolicy": "FallbackToLogsOnError",
            "volumeMounts": mounts}


def _vllm_artifacts(target: Target, role: Role, inits: list[dict[str, Any]],
                    containers: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(init containers, containers) of an engine vllm pod with a compile cache: serving pods fetch the entry first
    (`--required`: a miss fails the pod, naming the key); the compile Job fetches it unless its policy is Always (a
    hit starts vLLM warm), installs vLLM's supervisor, then runs vLLM under it beside `store-artifacts`, which stores
    its folder and stops it (a vLLM that exits fails the pod: never a restartable sidecar, whose crash loop the Job
    would never count). vLLM itself never mounts the compile cache."""
    for container in containers:
        container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "compile-cache"]
    if role != "compile":
        fetch = _artifacts_container(target, vllm.FETCH_ARTIFACTS, vllm.fetch_artifacts_command(target, True))
        return [*inits, fetch], containers
    if target.spec.compile_cache.policy != "Always":
        inits = [*inits, _artifacts_container(target, vllm.FETCH_ARTIFACTS, vllm.fetch_artifacts_command(target,
                                                                                                          False))]
    supervisor = {**_artifacts_container(target, vllm.INSTALL_SUPERVISOR, vllm.install_supervisor_command()),
                  "env": [{"name": "HOME", "value": "/tmp"}], "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}
    store = _artifacts_container(target, vllm.STORE_ARTIFACTS, vllm.store_artifacts_command(target))
    return [*inits, supervisor], [*containers, store]


def pod_template(target: Target, role: Role, config_map: Optional[str],
                 command: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """A pod template: our labels; the compile key; Prometheus scrape annotations on serving pods. `config_map` is
    the content-named ConfigMap of its RuntimeConfig (a new config is a new name, so it rolls the pods, and a pod of
    an older revision keeps reading its own). `command` defaults to the role's."""
    if command is None:
        command = {"serve": SERVE_COMMAND, "worker": WORKER_COMMAND, "compile": COMPILE_COMMAND}[role]
    annotations: dict[str, str] = {}
    if role == "serve":
        annotations.update({"prometheus.io/scrape": "true", "prometheus.io/port": str(target.spec.server.port),
                            "prometheus.io/path": "/metrics"})
    annotations[api.ANNOTATION_COMPILE_KEY] = target.resolved.compile_key
    component = COMPONENT_COMPILE if role == "compile" else COMPONENT_SERVER
    return {"metadata": {"labels": labels(target, component), "annotations": annotations},
            "spec": pod_spec(target, command, role, config_map)}
