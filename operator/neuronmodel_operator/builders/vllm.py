"""The containers of an engine vllm pod: `vllm serve` with the spec as vLLM's own flags (vllm_flags.py), its
environment, and our runtime's containers that hand vLLM's compiled artifacts in and out of the store. Pure.

`vllm serve ...` is the container's command, never args to the image's ENTRYPOINT: AWS's vLLM Neuron images run their
args under `python vllm_entrypoint.py` (DLC common/vllm_entrypoint.py, `subprocess.check_call(sys.argv[1:])`), which
as PID 1 with no SIGTERM handler ignores the kubelet's SIGTERM, so vLLM would never drain and every stop would wait
out the grace period. As PID 1 itself, vLLM gets SIGTERM; what it does with the requests in flight is its release's
rule: vLLM aborts them unless `--shutdown-timeout` is above 0 (its default is 0), so the native line's pods pass
the drain timeout our runtime uses (`DRAIN_TIMEOUT_S`, inside the grace period). vLLM 0.16 (the NxDI line) has no
such flag: its shutdown aborts the streams in flight (vllm/entrypoints/launcher.py). The model and the draft are the
local paths sources.py places them at (the fetch init container downloads hf:// and s3://).

With a compile cache (spec.compileCache.url), vLLM's compile folder is handed through our store, named by the
compile key (vllm_flags.key_inputs, the status' compileKey), by our runtime image (`neuronmodel-runtime artifacts`,
artifacts/handoff.py):
- serving pods: init container `fetch-artifacts` fetches the entry into the folder vLLM reads (the native line's
  VLLM_CACHE_ROOT, the NxDI line's NEURON_COMPILED_ARTIFACTS) with `--required`: a miss fails the pod at once with
  a message naming the key (status ArtifactsMissing); and the native line runs with
  VLLM_NEURON_DISABLE_WARMUP_COMPILE=1, so a graph missing from the entry is an error too, never an in-pod compile;
- the compile Job (job.py): after a `fetch-artifacts` without `--required` (a hit starts it warm; skipped under
  policy Always) and `install-supervisor`, which copies artifacts/supervise.py into the pod's /tmp, two containers:
  vLLM, run by that supervisor with the image's python, and `store-artifacts`, which waits for vLLM's /health (it
  compiles before it serves), stores the folder under the key and tells the supervisor to stop vLLM. A vLLM that
  exits on its own fails the pod at once (its last log lines are the termination message) and `store-artifacts`
  with it, so the Job counts a failure and retries under its backoffLimit; never a crash loop until the deadline.
"""

from __future__ import annotations

from typing import Any, Optional

from neuronmodel_operator import images, vllm_flags
from neuronmodel_operator.builders import sources
from neuronmodel_operator.builders.common import Target
from neuronmodel_operator.builders.configmap import DRAIN_TIMEOUT_S
from neuronmodel_runtime.config import env as runtime_env
from neuronmodel_runtime.config.keys import canonical_json

#: Where vLLM and the Neuron compilers write, under the pod's `cache` emptyDir (pod.CACHE_DIR), in folders of their
#: own so that an entry fetched from the store can replace one whole: VLLM_CACHE_ROOT (the native line's compile
#: cache, torch.compile's), the NxDI line's compiled model; and the working directory (the image's own,
#: /workspace/vllm, is root's, and compilers write their logs into the working directory).
VLLM_CACHE_ROOT = "/var/cache/neuronmodel/vllm"
NXDI_ARTIFACTS = "/var/cache/neuronmodel/neuron-compiled-artifacts"
WORKING_DIR = "/tmp"
FETCH_ARTIFACTS = "fetch-artifacts"
#: The compile Job's folder shared by vLLM's supervisor and `store-artifacts` (on the tmp emptyDir), and the
#: supervisor's path there (artifacts/supervise.py).
HANDOFF_DIR = "/tmp/neuronmodel-engine"
SUPERVISOR = f"{HANDOFF_DIR}/supervise.py"
INSTALL_SUPERVISOR = "install-supervisor"
#: The native line's compile library (libtorch-neuronx-lite) caches its graphs under NEURON_LIBTORCH_CACHE_ROOT
#: (default under HOME) where the 2.32 docs put them under VLLM_CACHE_ROOT/neuron/compile_cache: both under the
#: folder the store hands out, and `store-artifacts` refuses a folder with no *.neff in either.
NATIVE_GRAPH_FOLDERS = ("neuron/compile_cache", "neuron-libtorch")
#: How long vLLM may take to compile (pod.BUDGET_COMPILE_IN_POD_S: large models compile for hours).
COMPILE_BUDGET_S = 4 * 60 * 60
STORE_ARTIFACTS = "store-artifacts"


def line_of(target: Target) -> images.VllmImage:
    """The vLLM Neuron line the pods run: the image table's entry of the instance family (spec.image replaces the
    image, not the line: it must be an image of the same line)."""
    return images.vllm_image_for(target.resolved.instance_family or "")


def compiled_folder(target: Target) -> str:
    """The folder vLLM compiles into and loads from on the target's line."""
    return NXDI_ARTIFACTS if line_of(target).line == "nxdi" else VLLM_CACHE_ROOT


def key_inputs(target: Target) -> dict[str, Any]:
    """The compile key's inputs of the target (its digest is resolved.compile_key)."""
    resolved = target.resolved
    return vllm_flags.key_inputs(target.spec, resolved.image, line_of(target), resolved.instance_family or "",
                                 resolved.logical_core_config)


def speculative_config(target: Target) -> Optional[dict[str, Any]]:
    """`--speculative-config`: the line's method and k, and the draft's path in the pod; None without speculation."""
    found = vllm_flags.speculation(target.spec, line_of(target).line)
    draft = sources.draft_mount(target.spec)
    if found is None or draft is None:
        return None
    return {**found, "model": draft.path}


def serve_command(target: Target) -> list[str]:
    """The container's command: `vllm serve <model path>` and its flags."""
    spec, line = target.spec, line_of(target).line
    command = ["vllm", "serve", sources.model_mount(spec).path,
               "--served-model-name", spec.model.served_model_name or target.name,
               "--host", "0.0.0.0", "--port", str(spec.server.port)]
    if line == "native":  # drain in-flight requests on SIGTERM (vLLM's default, 0, aborts them)
        command += ["--shutdown-timeout", str(DRAIN_TIMEOUT_S)]
    command += vllm_flags.shape_args(spec, line)
    if (speculative := speculative_config(target)) is not None:
        command += ["--speculative-config", vllm_flags.as_json(speculative)]
    return command


def compile_command(target: Target) -> list[str]:
    """The compile Job's vLLM container command: `vllm serve` under the supervisor, with the image's python."""
    return ["python", SUPERVISOR, HANDOFF_DIR, "--", *serve_command(target)]


def env(target: Target, role: str) -> list[dict[str, Any]]:
    """The vLLM container's environment: the API key (VLLM_API_KEY, which vLLM's server reads when --api-key is not
    given: vllm/envs.py), the logical NeuronCore config as for our runtime, an offline Hub (the model is local),
    vLLM's cache on the cache emptyDir, and no timeout inside the pod shorter than a compile (vLLM waits
    VLLM_ENGINE_READY_TIMEOUT_S, 600 s by default, for the engine, which compiles first): the pod's startupProbe
    is what bounds its start. Serving pods of a model with a compile cache on the native line never compile
    (VLLM_NEURON_DISABLE_WARMUP_COMPILE: a miss is fatal); apart from that, the compile Job's vLLM and the serving
    pods' get the same environment, since vLLM's compile cache hashes some of it into its keys.

    PROMETHEUS_MULTIPROC_DIR is left to vLLM: unset, it makes a fresh directory under /tmp (an emptyDir) at every
    start and removes it at exit, while a set one "must be wiped between vLLM runs" (vllm/v1/metrics/prometheus.py),
    which an emptyDir is not when the container restarts in the same pod.
    """
    resolved, line = target.resolved, line_of(target).line
    out: list[dict[str, Any]] = []
    if (ref := target.spec.server.api_key_secret_ref) is not None:
        out.append({"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    if resolved.logical_core_config is not None:
        out.append({"name": runtime_env.LOGICAL_NC_CONFIG, "value": str(resolved.logical_core_config)})
    out += [{"name": "HOME", "value": "/tmp"},
            {"name": "HF_HUB_OFFLINE", "value": "1"},
            {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
            {"name": "VLLM_CACHE_ROOT", "value": VLLM_CACHE_ROOT},
            {"name": "VLLM_ENGINE_READY_TIMEOUT_S", "value": str(COMPILE_BUDGET_S)}]
    if line == "nxdi":
        # the plugin loads the compiled model from here, else compiles and saves it here; unset, it would write
        # next to the model, on a read-only mount. NxDI compiles through libneuronxla, whose cache the URL places.
        out += [{"name": runtime_env.COMPILED_ARTIFACTS, "value": NXDI_ARTIFACTS},
                {"name": runtime_env.NEURON_COMPILE_CACHE_URL, "value": "/var/tmp/neuron-compile-cache"}]
    else:
        # the SDK's deployment guide: without EFA the server does not start unless told; these pods request no EFA.
        # The compile timeout under both its names: the plugin's (the tutorials') and the compile library's (the
        # 2.32 reference), in case one is no longer read.
        out += [{"name": "NEURON_SKIP_EFA_AFFINITY", "value": "1"},
                {"name": "NEURON_LIBTORCH_CACHE_ROOT", "value": f"{VLLM_CACHE_ROOT}/{NATIVE_GRAPH_FOLDERS[1]}"},
                {"name": "VLLM_NEURON_COMPILATION_TIMEOUT", "value": str(COMPILE_BUDGET_S)},
                {"name": "NEURON_LIBTORCH_COMPILATION_TIMEOUT", "value": str(COMPILE_BUDGET_S)}]
        if role == "serve" and target.spec.compile_cache.url is not None:
            out.append({"name": "VLLM_NEURON_DISABLE_WARMUP_COMPILE", "value": "1"})
    return out


def key_env(target: Target) -> dict[str, str]:
    """The environment of our `artifacts` containers: the compile key's inputs (their digest names the entry)."""
    return {"name": runtime_env.ARTIFACT_KEY_INPUTS, "value": canonical_json(key_inputs(target))}


def fetch_artifacts_command(target: Target, required: bool) -> list[str]:
    """`neuronmodel-runtime artifacts fetch` of the compile cache's entry into vLLM's compiled folder."""
    cache = sources.compile_cache_mount(target.spec)
    command = ["neuronmodel-runtime", "artifacts", "fetch", compiled_folder(target), "--store", cache.path]
    return command + (["--required"] if required else [])


def store_artifacts_command(target: Target) -> list[str]:
    """`neuronmodel-runtime artifacts store` of vLLM's compiled folder, once vLLM answers on its health URL (or
    until its supervisor says it exited); on the native line, only a folder with a NEFF in it."""
    cache = sources.compile_cache_mount(target.spec)
    command = ["neuronmodel-runtime", "artifacts", "store", compiled_folder(target), "--store", cache.path,
               "--policy", target.spec.compile_cache.policy,
               "--ready-url", f"http://127.0.0.1:{target.spec.server.port}/health", "--engine-dir", HANDOFF_DIR]
    if line_of(target).line == "native":
        command += [arg for folder in NATIVE_GRAPH_FOLDERS for arg in ("--neff-in", folder)]
    return command


def install_supervisor_command() -> list[str]:
    """`neuronmodel-runtime artifacts supervisor`: the supervisor's script into the pod's /tmp."""
    return ["neuronmodel-runtime", "artifacts", "supervisor", SUPERVISOR]


__all__ = ["FETCH_ARTIFACTS", "HANDOFF_DIR", "INSTALL_SUPERVISOR", "NATIVE_GRAPH_FOLDERS", "NXDI_ARTIFACTS",
           "STORE_ARTIFACTS", "SUPERVISOR", "VLLM_CACHE_ROOT", "WORKING_DIR", "compile_command", "compiled_folder",
           "env", "fetch_artifacts_command", "install_supervisor_command", "key_env", "key_inputs", "line_of",
           "serve_command", "speculative_config", "store_artifacts_command"]
