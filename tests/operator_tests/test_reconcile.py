"""reconcile.Reconcile against an in-memory API server: which children exist after a reconcile, what the status
says, and the compile-key rollout (the Deployment keeps serving the old spec until the new key's Job is done)."""

from __future__ import annotations

import copy
import json
from typing import Optional

import pytest
from operator_tests.merge_patch import merge_patch
from runtime_tests.helpers.fake_hf_hub import FakeHub

from neuronmodel_operator import api
from neuronmodel_operator.k8s import ApiError, Kube
from neuronmodel_operator.reconcile import Outcome, Reconcile
from neuronmodel_operator.resolve import OperatorDefaults

NS = "team"
NAME = "llama"
UID = "0b0c4c1e-1d5e-4c59-9a51-5f2b7e4e7a10"
DEFAULTS = OperatorDefaults(image="registry.example/neuronmodel-runtime:1.0", hpa_metric="queue", allow_host_path=True)
COMPLETE = {"conditions": [{"type": "Complete", "status": "True"}],
            "startTime": "2026-01-01T00:00:00Z", "completionTime": "2026-01-01T00:20:00Z", "succeeded": 1}
RUNNING = {"active": 1, "startTime": "2026-01-01T00:00:00Z"}


WORKLOADS = ("Deployment", "LeaderWorkerSet")


class FakeKube:
    """The methods of k8s.Kube over dicts. `statuses[(kind, name)]` scripts the status the API returns for a
    child (what its controller wrote); apply never overwrites it, as server-side apply of a manifest without a
    status does not.

    It refuses what the real API server refuses, and forgets what server-side apply forgets:
    - a Job's spec.template is immutable, and so is the data of a ConfigMap with `immutable: true` (422);
    - spec.replicas of a workload belongs to the field managers that applied it: an apply by its sole owner that
      omits it removes it, and the API server defaults it to 1; another manager's apply of a partial object (the
      ownership hand-over) merges into the live one.
    """

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.statuses: dict[tuple[str, str], dict] = {}
        self.applied: list[dict] = []
        self.deleted: list[tuple[str, str]] = []
        self.status_patches: list[dict] = []
        self.events: list[tuple[str, str, str]] = []
        self.fail_apply: dict[str, ApiError] = {}  # kind -> the error apply raises
        self.lagging: set[tuple[str, str]] = set()  # (kind, name) whose controller has not observed the spec yet
        self.replicas_owners: dict[tuple[str, str], set[str]] = {}  # (kind, name) -> managers of spec.replicas
        self.got: list[tuple[str, str]] = []  # (kind, name) of each GET
        self.requests: list[tuple[str, str]] = []  # (verb, kind) of every request, in order

    # --- test helpers
    def put(self, obj: dict) -> None:
        meta = obj["metadata"]
        self.objects[obj["kind"], meta["namespace"], meta["name"]] = copy.deepcopy(obj)

    def children(self) -> dict[tuple[str, str], dict]:
        return {(kind, name): obj for (kind, _, name), obj in self.objects.items() if kind != api.KIND}

    def kinds(self) -> list[str]:
        return sorted(kind for kind, _ in self.children())

    def one(self, kind: str) -> dict:
        found = [obj for (k, _), obj in self.children().items() if k == kind]
        assert len(found) == 1, f"{len(found)} {kind}s: {sorted(self.children())}"
        return found[0]

    def model(self) -> dict:
        return self.objects[api.KIND, NS, NAME]

    def _with_status(self, kind: str, obj: dict) -> dict:
        """The object with its scripted status; a Deployment's controller has observed its generation unless the
        test lists it in `lagging` (as right after an apply on a busy cluster)."""
        out = copy.deepcopy(obj)
        name = obj["metadata"]["name"]
        if kind in WORKLOADS:
            out["metadata"]["managedFields"] = self._managed_fields(kind, name)
        scripted = self.statuses.get((kind, name))
        if scripted is not None:
            out["status"] = copy.deepcopy(scripted)
        if kind == "Deployment" and (kind, name) not in self.lagging:
            out.setdefault("status", {}).setdefault("observedGeneration", out["metadata"]["generation"])
        return out

    def _managed_fields(self, kind: str, name: str) -> list[dict]:
        return [{"manager": manager, "operation": "Apply", "fieldsV1": {"f:spec": {"f:replicas": {}}}}
                for manager in sorted(self.replicas_owners.get((kind, name), ()))]

    # --- k8s.Kube
    def apply(self, manifest: dict, field_manager: str = api.FIELD_MANAGER) -> dict:
        kind, meta = manifest["kind"], manifest["metadata"]
        self.requests.append(("apply", kind))
        if kind in self.fail_apply:
            raise self.fail_apply[kind]
        assert "status" not in manifest, "the operator never applies a child's status"
        self.applied.append(copy.deepcopy(manifest))
        key = (kind, meta["namespace"], meta["name"])
        before = self.objects.get(key)
        if field_manager != api.FIELD_MANAGER:  # a partial object of another manager: merged into the live one
            assert before is not None, "the hand-over applies to a live object only"
            stored = merge_patch(before, manifest)
        else:
            stored = copy.deepcopy(manifest)
        if before is not None and kind == "Job" and before["spec"]["template"] != stored["spec"]["template"]:
            raise ApiError(422, f'Job.batch "{meta["name"]}" is invalid: spec.template: Invalid value: ...: '
                                f'field is immutable')
        if before is not None and kind == "ConfigMap" and before.get("immutable") and \
                before.get("data") != stored.get("data"):
            raise ApiError(422, f'ConfigMap "{meta["name"]}" is invalid: data: Forbidden: field is immutable when '
                                f'`immutable` is set')
        if kind in WORKLOADS:
            owners = self.replicas_owners.setdefault((kind, meta["name"]), set())
            if "replicas" in manifest["spec"]:
                owners.clear()  # force: the other managers lose the field
                owners.add(field_manager)
            else:
                owners.discard(field_manager)
                live = (before or {}).get("spec", {}).get("replicas", 1)
                stored["spec"]["replicas"] = live if owners else 1  # nobody owns it: the default
        generation = (before or {}).get("metadata", {}).get("generation", 0)
        changed = before is None or before.get("spec") != stored.get("spec")
        stored["metadata"]["generation"] = generation + 1 if changed else generation
        self.objects[key] = stored
        return self._with_status(kind, stored)

    def get(self, kind: str, namespace: str, name: str) -> Optional[dict]:
        self.got.append((kind, name))
        self.requests.append(("get", kind))
        obj = self.objects.get((kind, namespace, name))
        return None if obj is None else self._with_status(kind, obj)

    def list(self, kind: str, namespace: str, selector: str) -> list[dict]:
        self.requests.append(("list", kind))
        wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
        found = []
        for (k, ns, _), obj in self.objects.items():
            labels = obj["metadata"].get("labels") or {}
            if k == kind and ns == namespace and all(labels.get(key) == value for key, value in wanted.items()):
                found.append(self._with_status(kind, obj))
        return found

    def delete(self, kind: str, namespace: str, name: str) -> None:
        self.requests.append(("delete", kind))
        self.deleted.append((kind, name))
        self.objects.pop((kind, namespace, name), None)

    def patch_status(self, namespace: str, name: str, status: dict) -> Optional[dict]:
        self.requests.append(("patch", "status"))
        self.status_patches.append(copy.deepcopy(status))
        body = self.objects.get((api.KIND, namespace, name))
        if body is None:
            return None
        body["status"] = merge_patch(body.get("status") or {}, status)
        return copy.deepcopy(body)

    def event(self, owner: dict, type_: str, reason: str, message: str) -> None:
        assert owner["metadata"]["uid"] == UID
        self.requests.append(("create", "Event"))
        self.events.append((type_, reason, message))


def body(spec: dict, generation: int = 1) -> dict:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": NAME, "namespace": NS, "uid": UID, "generation": generation,
                         "creationTimestamp": "2026-01-01T00:00:00Z", "labels": {"team": "ml"}},
            "spec": spec}


def set_spec(kube: FakeKube, spec: dict) -> None:
    """A user edits the spec: the API server bumps metadata.generation, the status stays."""
    model = kube.model()
    model["spec"] = copy.deepcopy(spec)
    model["metadata"]["generation"] += 1


TORCH = {"model": {"source": "/opt/neuronmodel/models/tiny"}, "framework": "torch", "replicas": 1}
NEURON_A = {"model": {"source": "hf://meta-llama/Llama-3.2-1B-Instruct"}, "framework": "nxdi",
            "instanceType": "inf2.xlarge", "parallelism": {"tensorParallelDegree": 2},
            "compileCache": {"url": "s3://acme-cache/prod"}, "replicas": 1}


def spec_b(replicas: int = 3) -> dict:
    """NEURON_A with another compile key (a bigger batch) and another replica count."""
    spec = copy.deepcopy(NEURON_A)
    spec["batching"] = {"maxBatchSize": 16}
    spec["replicas"] = replicas
    return spec


def jobs(kube: FakeKube) -> list[dict]:
    return [obj for (kind, _), obj in kube.children().items() if kind == "Job"]


def job_key(job: dict) -> str:
    return job["metadata"]["annotations"][api.ANNOTATION_COMPILE_KEY]


def template_key(deployment: dict) -> str:
    return deployment["spec"]["template"]["metadata"]["annotations"][api.ANNOTATION_COMPILE_KEY]


def served(deployment: dict) -> dict:
    """The spec the workload records as served."""
    return json.loads(deployment["metadata"]["annotations"][api.ANNOTATION_SERVED])["spec"]


def runtime_configmaps(kube: FakeKube) -> dict[str, dict]:
    return {name: obj for (kind, name), obj in kube.children().items()
            if kind == "ConfigMap" and obj["metadata"]["labels"][api.LABEL_COMPONENT] == "server"}


def config_map_of(workload: dict) -> str:
    (name,) = [v["configMap"]["name"] for v in workload["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    return name


HF_REPO = "meta-llama/Llama-3.2-1B-Instruct"  # NEURON_A's model, unpinned


@pytest.fixture(scope="module")
def running_hub():
    with FakeHub(HF_REPO, {"config.json": b"{}"}) as hub:
        yield hub


@pytest.fixture(autouse=True)
def hub(running_hub, monkeypatch):
    """The Hub the operator pins hf:// sources against (a mirror at HF_ENDPOINT), main at its first commit."""
    monkeypatch.setattr(running_hub, "commit", running_hub.commit)  # put back after a test moves main
    monkeypatch.setenv("HF_ENDPOINT", running_hub.url)
    return running_hub


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def reconcile(kube: FakeKube) -> Reconcile:
    return Reconcile(kube, DEFAULTS)


def owned_by_us(obj: dict) -> bool:
    refs = obj["metadata"].get("ownerReferences") or []
    return any(ref["uid"] == UID and ref.get("controller") for ref in refs)


# --- first reconcile, idempotence ----------------------------------------------------------------------------

def test_first_reconcile_of_a_torch_model(kube, reconcile):
    kube.put(body(TORCH))
    outcome = reconcile(NS, NAME, cleanup=True)
    assert outcome == Outcome()
    assert kube.kinds() == ["ConfigMap", "Deployment", "Service"]
    for obj in kube.children().values():
        assert owned_by_us(obj)
        assert obj["metadata"]["labels"][api.LABEL_NAME] == NAME
        assert "team" not in obj["metadata"]["labels"]  # the owner's labels never reach a child
    deployment = kube.one("Deployment")
    assert deployment["metadata"]["name"] == NAME and deployment["spec"]["replicas"] == 1
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    limits = (container.get("resources") or {}).get("limits") or {}
    assert not any(key.startswith("aws.amazon.com/") for key in limits)  # torch: no NeuronCores
    status = kube.model()["status"]
    assert len(kube.status_patches) == 1
    assert status["observedGeneration"] == 1
    assert status["endpoint"] == f"http://{NAME}.{NS}.svc.cluster.local:8000"
    assert status["phase"] == "Pending"
    assert status["resolved"]["framework"] == "torch"
    assert {c["type"] for c in status["conditions"]} == set(api.CONDITION_TYPES)
    api.NeuronModelStatus.model_validate(status)  # what the CRD's status schema accepts


def test_reconcile_twice_is_idempotent(kube, reconcile):
    kube.put(body(TORCH))
    reconcile(NS, NAME, cleanup=True)
    children, patches, events = copy.deepcopy(kube.children()), len(kube.status_patches), len(kube.events)
    for cleanup in (True, False):
        assert reconcile(NS, NAME, cleanup=cleanup) == Outcome()
        assert kube.children() == children
        assert kube.deleted == []
        assert len(kube.status_patches) == patches  # nothing changed: no status write
        assert len(kube.events) == events  # and no Event


def test_ready_pods_make_phase_ready(kube, reconcile):
    kube.put(body(TORCH))
    reconcile(NS, NAME, cleanup=True)
    kube.statuses["Deployment", NAME] = {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1,
                                         "availableReplicas": 1, "updatedReplicas": 1}
    labels = kube.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    kube.put({"kind": "Pod", "metadata": {"name": f"{NAME}-abc", "namespace": NS, "labels": labels},
              "status": {"phase": "Running", "startTime": "2026-01-01T00:01:00Z",
                         "conditions": [{"type": "PodScheduled", "status": "True"},
                                        {"type": "Ready", "status": "True",
                                         "lastTransitionTime": "2026-01-01T00:02:00Z"}]}})
    reconcile(NS, NAME, cleanup=False)
    status = kube.model()["status"]
    assert status["phase"] == "Ready" and status["readyReplicas"] == 1 and status["ready"] == "1/1"
    assert ("Normal", "Ready") in [(t, r) for t, r, _ in kube.events]
    assert status["timings"]["loadSeconds"] == 60


def test_gone_or_deleting_model_builds_nothing(kube, reconcile):
    assert reconcile(NS, NAME, cleanup=True) == Outcome(gone=True)
    deleting = body(TORCH)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T01:00:00Z"
    kube.put(deleting)
    assert reconcile(NS, NAME, cleanup=True) == Outcome(gone=True)
    assert kube.children() == {} and kube.status_patches == []


# --- compile gating ------------------------------------------------------------------------------------------

def test_compile_job_first_then_the_deployment(kube, reconcile):
    kube.put(body(NEURON_A))
    outcome = reconcile(NS, NAME, cleanup=True)
    assert not outcome.spec_error
    assert kube.kinds() == ["ConfigMap", "Job", "Service"]
    (job,) = jobs(kube)
    assert kube.one("ConfigMap")["metadata"]["name"] == job["metadata"]["name"]  # the compile ConfigMap
    assert kube.model()["status"]["phase"] == "Compiling"
    # still compiling: nothing more
    kube.statuses["Job", job["metadata"]["name"]] = RUNNING
    reconcile(NS, NAME, cleanup=False)
    assert kube.kinds() == ["ConfigMap", "Job", "Service"]
    # compiled: the serving pods start, on the artifacts of this key
    kube.statuses["Job", job["metadata"]["name"]] = COMPLETE
    reconcile(NS, NAME, cleanup=False)
    assert kube.kinds() == ["ConfigMap", "ConfigMap", "Deployment", "Job", "Service"]
    deployment = kube.one("Deployment")
    assert template_key(deployment) == job_key(job)
    status = kube.model()["status"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["ArtifactsReady"]["status"] == "True" and conditions["ArtifactsReady"]["reason"] == "Compiled"
    assert status["timings"]["compileSeconds"] == 1200
    assert ("Normal", "Compiled") in [(t, r) for t, r, _ in kube.events]


def serve_a(kube: FakeKube, reconcile: Reconcile) -> tuple[dict, dict]:
    """NEURON_A compiled and serving: (its Job, its Deployment)."""
    kube.put(body(NEURON_A))
    reconcile(NS, NAME, cleanup=True)
    (job,) = jobs(kube)
    kube.statuses["Job", job["metadata"]["name"]] = COMPLETE
    reconcile(NS, NAME, cleanup=True)
    return job, copy.deepcopy(kube.one("Deployment"))


@pytest.mark.parametrize("cleanup", [True, False])
def test_new_compile_key_keeps_serving_the_old_spec_until_compiled(kube, reconcile, cleanup):
    job_a, deployment_a = serve_a(kube, reconcile)
    key_a = job_key(job_a)
    runtime_cm_a = copy.deepcopy(kube.children()["ConfigMap", config_map_of(deployment_a)])

    set_spec(kube, spec_b(replicas=3))
    outcome = reconcile(NS, NAME, cleanup=cleanup)
    assert outcome.held and not outcome.spec_error
    job_b = next(j for j in jobs(kube) if job_key(j) != key_a)
    key_b = job_key(job_b)
    assert key_b != key_a
    deployment = kube.one("Deployment")
    # still A's pods: the same template, the same served spec, the same runtime config...
    assert deployment["spec"]["template"] == deployment_a["spec"]["template"]
    assert template_key(deployment) == key_a
    assert served(deployment)["batching"]["maxBatchSize"] == 8
    assert kube.children()["ConfigMap", config_map_of(deployment)] == runtime_cm_a
    # ...but the NEW replica count
    assert deployment["spec"]["replicas"] == 3
    status = kube.model()["status"]
    assert status["phase"] == "Compiling"
    assert {c["type"]: c["reason"] for c in status["conditions"]}["Progressing"] == "WaitingForArtifacts"

    # B compiled: the Deployment becomes B's and A's compile leftovers go
    kube.statuses["Job", job_b["metadata"]["name"]] = COMPLETE
    outcome = reconcile(NS, NAME, cleanup=cleanup)
    assert not outcome.held
    deployment = kube.one("Deployment")
    assert template_key(deployment) == key_b
    assert served(deployment)["batching"]["maxBatchSize"] == 16
    assert deployment["spec"]["replicas"] == 3
    assert [job_key(j) for j in jobs(kube)] == [key_b]
    assert ("Job", job_a["metadata"]["name"]) in kube.deleted
    assert ("ConfigMap", job_a["metadata"]["name"]) in kube.deleted
    assert ("ConfigMap", job_b["metadata"]["name"]) in kube.children()
    assert ("ConfigMap", config_map_of(deployment)) in kube.children()  # the serving ConfigMap is never stale


def test_an_unreadable_served_record_holds_the_rollout(kube, reconcile):
    """A served record this operator cannot read (another release's spec field, a hand edit): the workload is left
    as it is until the new key's Job succeeds, never rolled onto artifacts nobody compiled."""
    job_a, deployment_a = serve_a(kube, reconcile)
    workload_ready(kube, "Deployment", 1)
    stored = kube.objects["Deployment", NS, NAME]
    stored["metadata"]["annotations"][api.ANNOTATION_SERVED] = json.dumps(
        {"spec": {**NEURON_A, "fieldOfANewerRelease": True}, "resolved": {}})
    before = copy.deepcopy(stored)
    set_spec(kube, spec_b(replicas=1))
    outcome = reconcile(NS, NAME, cleanup=True)
    assert outcome.held
    assert kube.objects["Deployment", NS, NAME] == before  # untouched
    assert ("Deployment", NAME) not in kube.deleted
    status = kube.model()["status"]
    assert status["phase"] == "Compiling"
    assert {c["type"]: c["status"] for c in status["conditions"]}["Available"] == "True"
    job_b = next(j for j in jobs(kube) if job_key(j) != job_key(job_a))
    kube.statuses["Job", job_b["metadata"]["name"]] = COMPLETE
    assert not reconcile(NS, NAME, cleanup=True).held
    assert template_key(kube.one("Deployment")) == job_key(job_b)


def serving_pod(kube: FakeKube, ready: bool) -> tuple[tuple[str, str], dict]:
    """A pod of the Deployment, as its watch event shows it: (its key, the pod)."""
    labels = kube.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    pod = {"kind": "Pod", "metadata": {"name": f"{NAME}-abc", "namespace": NS, "labels": labels},
           "status": {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"},
                                                         {"type": "Ready", "status": str(ready)}]}}
    kube.put(pod)
    return ("Pod", pod["metadata"]["name"]), pod


def test_a_compiled_model_costs_two_reads_per_pod_event_and_the_full_run_only_while_compiling(kube, reconcile):
    kube.put(body(NEURON_A))
    reconcile(NS, NAME, cleanup=True)
    (job,) = jobs(kube)
    kube.statuses["Job", job["metadata"]["name"]] = RUNNING
    kube.requests.clear()
    reconcile(NS, NAME, cleanup=False, body=kube.model(), changed={("Job", job["metadata"]["name"]): job})
    assert ("list", "Job") in kube.requests  # compiling: every event takes the full run (is the Job done?)
    kube.statuses["Job", job["metadata"]["name"]] = COMPLETE
    reconcile(NS, NAME, cleanup=False, body=kube.model(), changed={("Job", job["metadata"]["name"]): job})
    assert "Deployment" in kube.kinds()
    workload_ready(kube, "Deployment", 1)
    key, pod = serving_pod(kube, ready=True)
    kube.requests.clear()
    reconcile(NS, NAME, cleanup=False, body=kube.model(), changed={key: pod})
    # compiled and serving its key: the refresh reads the workload and its pods, and writes the status (Ready)
    assert kube.requests == [("get", "Deployment"), ("list", "Pod"), ("patch", "status"), ("create", "Event")]
    assert kube.model()["status"]["phase"] == "Ready"
    kube.requests.clear()
    reconcile(NS, NAME, cleanup=False, body=kube.model(), changed={key: pod})
    assert kube.requests == [("get", "Deployment"), ("list", "Pod")]  # nothing changed: nothing written


def test_a_third_key_while_held_still_serves_the_first(kube, reconcile):
    job_a, deployment_a = serve_a(kube, reconcile)
    set_spec(kube, spec_b(replicas=2))
    reconcile(NS, NAME, cleanup=True)
    spec_c = spec_b(replicas=2)
    spec_c["batching"] = {"maxBatchSize": 32}
    set_spec(kube, spec_c)
    assert reconcile(NS, NAME, cleanup=True).held
    assert kube.one("Deployment")["spec"]["template"] == deployment_a["spec"]["template"]


def test_replicas_only_change_keeps_the_pod_template(kube, reconcile):
    job_a, deployment_a = serve_a(kube, reconcile)
    applied_jobs = [m for m in kube.applied if m["kind"] == "Job"]
    scaled = copy.deepcopy(NEURON_A)
    scaled["replicas"] = 4
    set_spec(kube, scaled)
    outcome = reconcile(NS, NAME, cleanup=True)
    assert not outcome.held
    deployment = kube.one("Deployment")
    assert deployment["spec"]["template"] == deployment_a["spec"]["template"]  # no rollout
    assert deployment["spec"]["replicas"] == 4
    assert [job_key(j) for j in jobs(kube)] == [job_key(job_a)]  # no new compile
    new_jobs = [m for m in kube.applied if m["kind"] == "Job"][len(applied_jobs):]
    assert all(job_key(m) == job_key(job_a) for m in new_jobs)
    assert ("Job", job_a["metadata"]["name"]) not in kube.deleted
    assert "PodDisruptionBudget" in kube.kinds()


def test_a_same_key_change_rolls_at_once(kube, reconcile):
    _, deployment_a = serve_a(kube, reconcile)
    changed = copy.deepcopy(NEURON_A)
    changed["nodeSelector"] = {"karpenter.sh/capacity-type": "on-demand"}
    set_spec(kube, changed)
    outcome = reconcile(NS, NAME, cleanup=True)
    assert not outcome.held
    template = kube.one("Deployment")["spec"]["template"]
    assert template != deployment_a["spec"]["template"]
    assert template["spec"]["nodeSelector"]["karpenter.sh/capacity-type"] == "on-demand"


# --- bad specs, API errors -----------------------------------------------------------------------------------

BAD = {"model": {"source": "/m"}, "framework": "nxdi", "parallelism": {"tensorParallelDegree": 128}, "replicas": 1}
#: Specs the CRD admits that only building the children refuses (found by tests/integration/test_admission_fuzz.py:
#: they were an exception in the operator, retried with backoff forever, with no status).
BUILT_BAD = (({**TORCH, "model": {"source": "/tmp"}}, "spec.model.source: /tmp would be mounted over"),
             ({**TORCH, "speculation": {"mode": "draft", "draftModel": TORCH["model"]}},
              "two sources are both mounted at"))


@pytest.mark.parametrize("spec,message", ((BAD, "spec.parallelism"), *BUILT_BAD),
                         ids=["resolve", "model-over-tmp", "draft-at-the-model-path"])
def test_spec_error_fails_with_one_warning_and_no_children(kube, reconcile, spec, message):
    kube.put(body(spec))
    outcome = reconcile(NS, NAME, cleanup=True)
    assert outcome.spec_error and message in outcome.spec_error
    assert kube.children() == {}
    status = kube.model()["status"]
    assert status["phase"] == "Failed"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert outcome.spec_error in ready["message"]
    assert [(t, r) for t, r, _ in kube.events] == [("Warning", "InvalidSpec")]
    # a retry (kopf does not retry it, but a child event could) adds nothing: no hot loop of Events
    assert reconcile(NS, NAME, cleanup=True).spec_error == outcome.spec_error
    assert len(kube.events) == 1 and len(kube.status_patches) == 1


def test_a_support_warning_never_holds_the_rollout(kube, reconcile):
    # NxDI on trn2 (AWS supports none from SDK 2.34): served, with the warning in the status and one Warning Event
    kube.put(body({"model": {"source": "s3://acme-models/llama"}, "framework": "nxdi", "instanceType": "trn2.3xlarge",
                   "parallelism": {"tensorParallelDegree": 4}, "replicas": 1}))
    assert reconcile(NS, NAME, cleanup=True) == Outcome()
    assert "Deployment" in kube.kinds()
    status = kube.model()["status"]
    assert status["phase"] != "Failed"
    (warning,) = status["warnings"]
    assert "vLLM Neuron" in warning and "SDK 2.34" in warning
    assert [(t, r) for t, r, _ in kube.events if t == "Warning"] == [("Warning", "NxdiUnsupportedOnTrn2")]


def test_a_fixed_spec_recovers(kube, reconcile):
    kube.put(body(BAD))
    reconcile(NS, NAME, cleanup=True)
    set_spec(kube, TORCH)
    assert reconcile(NS, NAME, cleanup=True) == Outcome()
    assert kube.model()["status"]["phase"] != "Failed"
    assert "Deployment" in kube.kinds()


def test_pdb_goes_when_replicas_drop_to_one(kube, reconcile):
    three = copy.deepcopy(TORCH)
    three["replicas"] = 3
    kube.put(body(three))
    reconcile(NS, NAME, cleanup=True)
    assert "PodDisruptionBudget" in kube.kinds()
    set_spec(kube, TORCH)
    reconcile(NS, NAME, cleanup=True)
    assert "PodDisruptionBudget" not in kube.kinds()
    assert ("PodDisruptionBudget", NAME) in kube.deleted
    assert kube.one("Deployment")["spec"]["replicas"] == 1


def test_stale_cleanup_spares_what_others_own(kube, reconcile):
    kube.put(body(TORCH))
    foreign = {"kind": "PodDisruptionBudget", "metadata": {
        "name": "hand-made", "namespace": NS,
        "labels": {api.LABEL_NAME: NAME, api.LABEL_MANAGED_BY: api.OPERATOR_NAME},
        "ownerReferences": [{"uid": "someone-else", "controller": True}]}}
    kube.put(foreign)
    reconcile(NS, NAME, cleanup=True)
    assert ("PodDisruptionBudget", "hand-made") in kube.children()


def test_a_refused_child_is_reported_and_retried_not_failed_for_good(kube, reconcile):
    kube.put(body(TORCH))
    kube.fail_apply["Deployment"] = ApiError(422, 'Deployment.apps "llama" is invalid: spec.template: bad')
    outcome = reconcile(NS, NAME, cleanup=True)
    assert outcome.child_error and "is invalid" in outcome.child_error
    assert not outcome.spec_error  # not kopf's PermanentError: the handler retries it with backoff
    status = kube.model()["status"]
    assert status["phase"] == "Failed"
    assert "is invalid" in next(c for c in status["conditions"] if c["type"] == "Ready")["message"]
    assert [t for t, _, _ in kube.events] == ["Warning"]


class NotServing:
    """The kubernetes ApiClient as k8s.Kube uses it, for an API server that serves no API: every request gets the
    answer the real one gives for an API group it does not serve, a plain-text 404 (tests/integration/
    test_api_rules.py)."""

    class configuration:
        host = "https://127.0.0.1:6443"

    def update_params_for_auth(self, *args) -> None:
        pass

    def call_api(self, method: str, url: str, **_) -> object:
        data = b"404 page not found\n"
        return type("Response", (), {"status": 404, "reason": "Not Found", "data": data, "read": lambda self: data})()


def test_a_404_on_apply_is_an_error_naming_the_missing_api_in_the_status_and_an_event(kube, reconcile):
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
           "metadata": {"name": f"{NAME}-lws", "namespace": NS}, "spec": {}}
    with pytest.raises(ApiError) as missing:  # the LeaderWorkerSet CRD is not installed
        Kube(NotServing()).apply(lws)
    assert missing.value.status == 404 and not missing.value.retryable
    assert "LeaderWorkerSet leaderworkerset.x-k8s.io/v1 is not served by this cluster" in missing.value.message
    assert "install LeaderWorkerSet" in missing.value.message and "404 page not found" in missing.value.message
    assert Kube(NotServing()).get("LeaderWorkerSet", NS, "x") is None  # a GET's 404 is an absent object
    kube.fail_apply["LeaderWorkerSet"] = missing.value
    kube.put(body({**TORCH, "parallelism": {"tensorParallelDegree": 2, "nodes": 2}}))
    outcome = reconcile(NS, NAME, cleanup=True)
    assert outcome.child_error and "install LeaderWorkerSet" in outcome.child_error  # retried with backoff
    ready = next(c for c in kube.model()["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and "is not served by this cluster" in ready["message"]
    assert [(t, "install LeaderWorkerSet" in m) for t, _, m in kube.events] == [("Warning", True)]


@pytest.mark.parametrize("code", [401, 403, 409, 429, 500, 503, 0])
def test_retryable_api_error_propagates(kube, reconcile, code):
    kube.put(body(TORCH))
    kube.fail_apply["Deployment"] = ApiError(code, "try again")
    with pytest.raises(ApiError) as err:
        reconcile(NS, NAME, cleanup=True)
    assert err.value.status == code and err.value.retryable
    assert "status" not in kube.model()  # no Failed status for an error that heals by itself


def test_status_waits_for_the_deployment_controller_to_observe_the_new_spec(kube, reconcile):
    """Right after an apply the Deployment's status speaks of the old generation: the operator writes no status
    then (one NeuronModel write and one kopf event fewer per change), and writes it when the controller's status
    update arrives as a child event."""
    kube.put(body(TORCH))
    kube.lagging.add(("Deployment", NAME))
    reconcile(NS, NAME, cleanup=False)
    assert kube.one("Deployment") and not kube.status_patches and not kube.events
    kube.lagging.clear()
    deployment = kube.get("Deployment", NS, NAME)
    reconcile(NS, NAME, cleanup=False, changed={("Deployment", NAME): deployment})
    assert kube.status_patches and kube.model()["status"]["phase"] == "Pending"


# --- everyday edits keep a serving model serving -------------------------------------------------------------

def test_an_edit_outside_the_compile_key_rolls_at_once_without_a_compile(kube, reconcile):
    job_a, _ = serve_a(kube, reconcile)
    for edit in ({"resources": {"requests": {"memory": "64Gi"}}}, {"schedulerName": "neuron-scheduler"},
                 {"server": {"port": 9000}}, {"serviceAccountName": "model-reader"}):
        set_spec(kube, {**copy.deepcopy(kube.model()["spec"]), **edit})
        assert reconcile(NS, NAME, cleanup=True) == Outcome(), edit
        assert [j["metadata"]["name"] for j in jobs(kube)] == [job_a["metadata"]["name"]]  # compiled already
    template = kube.one("Deployment")["spec"]["template"]["spec"]
    assert template["serviceAccountName"] == "model-reader" and template["schedulerName"] == "neuron-scheduler"
    assert template["containers"][0]["ports"][0]["containerPort"] == 9000
    assert kube.model()["status"]["phase"] != "Failed"


def test_an_edit_while_compiling_replaces_the_job_never_a_422(kube, reconcile):
    kube.put(body(NEURON_A))
    reconcile(NS, NAME, cleanup=True)
    (first,) = jobs(kube)
    kube.statuses["Job", first["metadata"]["name"]] = {**RUNNING, "failed": 1}
    # the compile runs out of memory (a pod failed, the Job retries): the user raises it (the fake refuses a changed
    # Job template, as the API does)
    set_spec(kube, {**NEURON_A, "resources": {"requests": {"memory": "64Gi"}}})
    assert reconcile(NS, NAME, cleanup=True) == Outcome()
    (second,) = jobs(kube)
    assert second["metadata"]["name"] != first["metadata"]["name"] and job_key(second) == job_key(first)
    assert second["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"] == "64Gi"
    assert {("Job", first["metadata"]["name"]), ("ConfigMap", first["metadata"]["name"])} <= set(kube.deleted)


def compile_pod(kube: FakeKube, job: dict, scheduled: bool) -> None:
    """The Job controller's pod of `job`: running (scheduled) or pending."""
    kube.put({"kind": "Pod", "metadata": {"name": job["metadata"]["name"] + "-x", "namespace": NS,
                                          "labels": {"batch.kubernetes.io/job-name": job["metadata"]["name"]}},
              "status": {"phase": "Running" if scheduled else "Pending",
                         "conditions": [{"type": "PodScheduled", "status": "True" if scheduled else "False"}]}})


def test_a_failing_compile_says_why_in_the_status_and_the_event(kube, reconcile):
    """Each failed attempt's own error (vLLM's refusal under its supervisor, the runtime's line) reaches the status
    while the Job retries and the CompileFailed Event once it gives up: read from the Job's pods, and only once an
    attempt failed (a running compile lists none)."""
    kube.put(body(NEURON_A))
    reconcile(NS, NAME, cleanup=True)
    (job,) = jobs(kube)
    name = job["metadata"]["name"]
    kube.statuses["Job", name] = RUNNING
    reconcile(NS, NAME, cleanup=True)
    assert ("list", "Pod") not in kube.requests
    kube.put({"kind": "Pod", "metadata": {"name": name + "-a", "namespace": NS,
                                          "creationTimestamp": "2026-12-06T10:00:00Z",
                                          "labels": {"batch.kubernetes.io/job-name": name}},
              "status": {"phase": "Failed", "containerStatuses": [{"name": "runtime", "state": {"terminated": {
                  "exitCode": 2, "reason": "Error",
                  "message": "neuronmodel-runtime compile: model.dtype float8 is not supported; use bfloat16"}}}]}})
    kube.statuses["Job", name] = {**RUNNING, "failed": 1}
    reconcile(NS, NAME, cleanup=True)
    said = "container runtime exited 2: neuronmodel-runtime compile: model.dtype float8 is not supported; use bfloat16"
    artifacts = next(c for c in kube.model()["status"]["conditions"] if c["type"] == "ArtifactsReady")
    assert artifacts["message"].endswith(f"retrying, attempt 2 of 5; the last attempt: {said}"), artifacts
    kube.statuses["Job", name] = {"failed": 5, "conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
         "message": "Job has reached the specified backoff limit"}]}
    reconcile(NS, NAME, cleanup=True)
    assert kube.model()["status"]["phase"] == "Failed"
    ((type_, event),) = [(type_, message) for type_, reason, message in kube.events if reason == "CompileFailed"]
    assert f"the last attempt: {said}" in event and type_ == "Warning"


@pytest.mark.parametrize("edit", [{"tolerations": [{"key": "dedicated", "operator": "Exists"}]},
                                  {"serviceAccountName": "model-reader"}])
def test_a_template_only_edit_keeps_the_running_compile(kube, reconcile, edit):
    kube.put(body(NEURON_A))
    reconcile(NS, NAME, cleanup=True)
    (first,) = jobs(kube)
    kube.statuses["Job", first["metadata"]["name"]] = RUNNING
    compile_pod(kube, first, scheduled=True)
    set_spec(kube, {**NEURON_A, **edit})
    assert reconcile(NS, NAME, cleanup=True) == Outcome()
    assert jobs(kube) == [first] and kube.deleted == []  # hours of compile are not thrown away
    assert kube.model()["status"]["phase"] == "Compiling"
    kube.statuses["Job", first["metadata"]["name"]] = COMPLETE
    reconcile(NS, NAME, cleanup=True)
    template = kube.one("Deployment")["spec"]["template"]["spec"]  # serves the edited spec on its artifacts
    assert template_key(kube.one("Deployment")) == job_key(first)
    assert template.get("serviceAccountName") == edit.get("serviceAccountName", template.get("serviceAccountName"))
    assert jobs(kube) == [first]


def test_a_template_edit_replaces_a_compile_job_whose_pod_cannot_schedule(kube, reconcile):
    kube.put(body(NEURON_A))
    reconcile(NS, NAME, cleanup=True)
    (first,) = jobs(kube)
    kube.statuses["Job", first["metadata"]["name"]] = {"active": 1}
    compile_pod(kube, first, scheduled=False)  # the toleration the user adds is what lets it schedule
    set_spec(kube, {**NEURON_A, "tolerations": [{"key": "dedicated", "operator": "Exists"}]})
    reconcile(NS, NAME, cleanup=True)
    (second,) = jobs(kube)
    assert second["metadata"]["name"] != first["metadata"]["name"]
    assert second["spec"]["template"]["spec"]["tolerations"][-1]["key"] == "dedicated"


UNPINNED_IMAGE = {**NEURON_A}  # no spec.image: the image comes from the operator's defaults


@pytest.mark.parametrize("legacy", [False, True])
def test_an_operator_upgrade_that_changes_the_default_image_compiles_first(kube, legacy):
    old = OperatorDefaults(image_version="0.1.0", hpa_metric="queue", allow_host_path=True)
    job_a, deployment_a = serve_a(kube, Reconcile(kube, old))
    image_a = deployment_a["spec"]["template"]["spec"]["containers"][0]["image"]
    if legacy:  # a Deployment written by operator 0.1.0: the spec alone, the image and key in its template
        stored = kube.objects["Deployment", NS, NAME]
        record = json.loads(stored["metadata"]["annotations"].pop(api.ANNOTATION_SERVED))
        stored["metadata"]["annotations"][api.ANNOTATION_SERVED_SPEC] = json.dumps(record["spec"])
        deployment_a = copy.deepcopy(stored)
    upgraded = Reconcile(kube, OperatorDefaults(image_version="0.2.0", hpa_metric="queue", allow_host_path=True))
    outcome = upgraded(NS, NAME, cleanup=True)  # the restarted operator resumes every model
    assert outcome.held
    job_b = next(j for j in jobs(kube) if job_key(j) != job_key(job_a))
    assert "0.2.0" in job_b["spec"]["template"]["spec"]["containers"][0]["image"]
    deployment = kube.one("Deployment")
    assert deployment["spec"]["template"] == deployment_a["spec"]["template"]  # old pods keep serving
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == image_a
    kube.statuses["Job", job_b["metadata"]["name"]] = COMPLETE
    assert not upgraded(NS, NAME, cleanup=False).held
    assert "0.2.0" in kube.one("Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]


def lws_ready(kube: FakeKube, replicas: int = 1) -> None:
    kube.statuses["LeaderWorkerSet", f"{NAME}-lws"] = {"replicas": replicas, "readyReplicas": replicas,
                                                       "updatedReplicas": replicas}


def test_nodes_one_to_two_serves_from_the_deployment_until_the_group_is_ready(kube, reconcile):
    kube.put(body(TORCH))
    reconcile(NS, NAME, cleanup=True)
    deployment = kube.one("Deployment")
    set_spec(kube, {**TORCH, "parallelism": {"tensorParallelDegree": 2, "nodes": 2}})
    reconcile(NS, NAME, cleanup=True)
    assert ("Deployment", NAME) in kube.children() and ("LeaderWorkerSet", f"{NAME}-lws") in kube.children()
    assert ("ConfigMap", config_map_of(deployment)) in kube.children()  # the Deployment's pods still read it
    assert kube.one("Service")["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    # the group becomes ready: its event runs a full reconcile, which moves the Service and removes the Deployment
    lws_ready(kube)
    reconcile(NS, NAME, cleanup=False, changed={("LeaderWorkerSet", f"{NAME}-lws"):
                                                kube.get("LeaderWorkerSet", NS, f"{NAME}-lws")})
    assert ("Deployment", NAME) not in kube.children()
    assert kube.one("Service")["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"


def test_nodes_two_to_one_serves_from_the_group_until_the_deployment_is_ready(kube, reconcile):
    kube.put(body({**TORCH, "parallelism": {"tensorParallelDegree": 2, "nodes": 2}}))
    reconcile(NS, NAME, cleanup=True)
    lws_ready(kube)
    set_spec(kube, TORCH)
    reconcile(NS, NAME, cleanup=True)
    assert ("LeaderWorkerSet", f"{NAME}-lws") in kube.children() and ("Deployment", NAME) in kube.children()
    assert "leaderworkerset.sigs.k8s.io/worker-index" in kube.one("Service")["spec"]["selector"]
    kube.statuses["Deployment", NAME] = {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1,
                                         "availableReplicas": 1, "updatedReplicas": 1}
    reconcile(NS, NAME, cleanup=False, changed={("Deployment", NAME): kube.get("Deployment", NS, NAME)})
    assert ("LeaderWorkerSet", f"{NAME}-lws") not in kube.children()
    assert "leaderworkerset.sigs.k8s.io/worker-index" not in kube.one("Service")["spec"]["selector"]


AUTOSCALED = {**{key: value for key, value in TORCH.items() if key != "replicas"},
              "autoscaling": {"minReplicas": 1, "maxReplicas": 8}}
MULTI_NODE = {"parallelism": {"tensorParallelDegree": 2, "nodes": 2}}


def workload_ready(kube: FakeKube, kind: str, replicas: int) -> None:
    name = f"{NAME}-lws" if kind == "LeaderWorkerSet" else NAME
    kube.statuses[kind, name] = {"observedGeneration": kube.objects[kind, NS, name]["metadata"]["generation"],
                                 "replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas,
                                 "updatedReplicas": replicas}


@pytest.mark.parametrize("old,new", [(AUTOSCALED, {**AUTOSCALED, **MULTI_NODE}),
                                     ({**AUTOSCALED, **MULTI_NODE}, AUTOSCALED)], ids=["one-to-two", "two-to-one"])
def test_a_kind_switch_under_autoscaling_starts_at_the_live_count_and_switches_when_all_are_ready(kube, reconcile,
                                                                                                old, new):
    kube.put(body(old))
    reconcile(NS, NAME, cleanup=True)
    (old_kind, old_name), = [key for key in kube.children() if key[0] in WORKLOADS]
    kube.objects[old_kind, NS, old_name]["spec"]["replicas"] = 4  # the HPA scaled it (the scale subresource)
    workload_ready(kube, old_kind, 4)
    set_spec(kube, new)
    reconcile(NS, NAME, cleanup=True)
    (new_kind, new_name), = [key for key in kube.children() if key[0] in WORKLOADS and key[0] != old_kind]
    assert kube.objects[new_kind, NS, new_name]["spec"]["replicas"] == 4  # created at 4, not the default 1
    assert kube.one("HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]["kind"] == old_kind
    workload_ready(kube, new_kind, 1)  # one of four ready: the old one keeps serving all its traffic
    reconcile(NS, NAME, cleanup=False, changed={(new_kind, new_name): kube.get(new_kind, NS, new_name)})
    assert (old_kind, old_name) in kube.children()
    assert kube.objects[new_kind, NS, new_name]["spec"]["replicas"] == 4
    assert kube.replicas_owners[new_kind, new_name] == {api.HANDOVER_FIELD_MANAGER}  # the HPA's after the switch
    kube.objects[old_kind, NS, old_name]["spec"]["replicas"] = 5  # the HPA scales the old one meanwhile
    workload_ready(kube, old_kind, 5)
    reconcile(NS, NAME, cleanup=False, changed={(new_kind, new_name): kube.get(new_kind, NS, new_name)})
    assert kube.objects[new_kind, NS, new_name]["spec"]["replicas"] == 5
    kube.objects[old_kind, NS, old_name]["spec"]["replicas"] = 4
    workload_ready(kube, old_kind, 4)
    reconcile(NS, NAME, cleanup=False, changed={(new_kind, new_name): kube.get(new_kind, NS, new_name)})
    assert kube.objects[new_kind, NS, new_name]["spec"]["replicas"] == 4
    workload_ready(kube, new_kind, 4)
    reconcile(NS, NAME, cleanup=False, changed={(new_kind, new_name): kube.get(new_kind, NS, new_name)})
    assert (old_kind, old_name) not in kube.children()
    assert kube.one("HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]["kind"] == new_kind
    assert kube.objects[new_kind, NS, new_name]["spec"]["replicas"] == 4


def test_a_multi_node_status_reads_the_blockers_of_the_workers_too(kube, reconcile):
    kube.put(body({**TORCH, **MULTI_NODE}))
    reconcile(NS, NAME, cleanup=True)
    labels = kube.one("LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"]
    for index, waiting in (("0", None), ("1", {"reason": "ImagePullBackOff", "message": "Back-off pulling image"})):
        state = {"phase": "Running" if waiting is None else "Pending", "conditions": [
            {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}]}
        if waiting:
            state["containerStatuses"] = [{"name": "runtime", "state": {"waiting": waiting}}]
        kube.put({"kind": "Pod", "metadata": {"name": f"{NAME}-lws-0" + ("-1" if index == "1" else ""),
                                              "namespace": NS, "labels": {
                                                  **labels, "leaderworkerset.sigs.k8s.io/worker-index": index}},
                  "status": state})
    kube.statuses["LeaderWorkerSet", f"{NAME}-lws"] = {"replicas": 1, "readyReplicas": 0, "updatedReplicas": 1}
    reconcile(NS, NAME, cleanup=False, changed={("Pod", f"{NAME}-lws-0-1"): kube.get("Pod", NS, f"{NAME}-lws-0-1")})
    ready = next(c for c in kube.model()["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "Loading" and "container runtime: ImagePullBackOff" in ready["message"]


def test_replicas_to_autoscaling_keeps_the_live_count_then_back(kube, reconcile):
    kube.put(body({**TORCH, "replicas": 3}))
    reconcile(NS, NAME, cleanup=True)
    autoscaled = {key: value for key, value in TORCH.items() if key != "replicas"}
    set_spec(kube, {**autoscaled, "autoscaling": {"minReplicas": 1, "maxReplicas": 6}})
    reconcile(NS, NAME, cleanup=True)
    deployment = kube.one("Deployment")
    assert deployment["spec"]["replicas"] == 3  # not reset to 1 by the apply that leaves the field out
    assert kube.replicas_owners["Deployment", NAME] == {api.HANDOVER_FIELD_MANAGER}
    assert "HorizontalPodAutoscaler" in kube.kinds()
    set_spec(kube, {**TORCH, "replicas": 2})
    reconcile(NS, NAME, cleanup=True)
    assert kube.one("Deployment")["spec"]["replicas"] == 2
    assert "HorizontalPodAutoscaler" not in kube.kinds()


def test_a_minimal_spec_runs_one_replica(kube, reconcile):
    kube.put(body({key: value for key, value in TORCH.items() if key != "replicas"}))
    assert reconcile(NS, NAME, cleanup=True) == Outcome()
    assert kube.one("Deployment")["spec"]["replicas"] == 1


def test_runtime_config_maps_are_immutable_per_revision_and_kept_while_used(kube, reconcile):
    kube.put(body(TORCH))
    reconcile(NS, NAME, cleanup=True)
    first = kube.one("Deployment")
    old_name = config_map_of(first)
    old = copy.deepcopy(runtime_configmaps(kube)[old_name])
    assert old["immutable"] is True
    # the Deployment's first ReplicaSet still runs pods of the old template
    kube.put({"kind": "ReplicaSet", "metadata": {"name": f"{NAME}-1", "namespace": NS,
                                                  "labels": first["spec"]["template"]["metadata"]["labels"]},
              "spec": {"template": copy.deepcopy(first["spec"]["template"])}})
    set_spec(kube, {**TORCH, "batching": {"maxBatchSize": 4}})
    reconcile(NS, NAME, cleanup=True)
    new_name = config_map_of(kube.one("Deployment"))
    assert new_name != old_name
    assert runtime_configmaps(kube)[old_name] == old  # an old pod restarting reads its own revision's config
    assert json.loads(runtime_configmaps(kube)[new_name]["data"]["config.json"])["max_num_seqs"] == 4
    reconcile(NS, NAME, cleanup=False, changed={("Pod", f"{NAME}-other"): None})  # the revision's pods remain
    assert sorted(runtime_configmaps(kube)) == sorted([old_name, new_name])
    # The Deployment controller prunes the revision from its history long after the last edit: the watch event of
    # that ReplicaSet is the only news of it, and the ConfigMap only it used goes then.
    del kube.objects["ReplicaSet", NS, f"{NAME}-1"]
    reconcile(NS, NAME, cleanup=False, changed={("ReplicaSet", f"{NAME}-1"): None})
    assert sorted(runtime_configmaps(kube)) == [new_name]


def test_an_hpa_that_cannot_get_its_metric_shows_in_the_status(kube, reconcile):
    autoscaled = {key: value for key, value in TORCH.items() if key != "replicas"}
    kube.put(body({**autoscaled, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}}))
    kube.statuses["HorizontalPodAutoscaler", NAME] = {"conditions": [
        {"type": "AbleToScale", "status": "True", "reason": "SucceededGetScale"},
        {"type": "ScalingActive", "status": "False", "reason": "FailedGetPodsMetric",
         "message": "the HPA was unable to compute the replica count: unable to get metric queue"}]}
    reconcile(NS, NAME, cleanup=True)
    autoscaling = {c["type"]: c for c in kube.model()["status"]["conditions"]}["Autoscaling"]
    assert autoscaling["status"] == "False" and autoscaling["reason"] == "FailedGetPodsMetric"
    assert "unable to get metric" in autoscaling["message"]


def fetched_revisions(workload: dict) -> list[str]:
    inits = workload["spec"]["template"]["spec"].get("initContainers") or []
    return [init["command"][init["command"].index("--revision") + 1] for init in inits]


def test_an_unpinned_hf_source_is_pinned_once_and_every_replica_fetches_that_commit(kube, reconcile, hub):
    job_a, deployment_a = serve_a(kube, reconcile)
    first = hub.commit
    resolved = kube.model()["status"]["resolved"]
    assert resolved["modelRevision"] == first and resolved["revisions"] == {f"hf://{HF_REPO}@": first}
    assert fetched_revisions(deployment_a) == [first] and fetched_revisions(job_a) == [first]
    hub.commit = "feed" * 10  # main moves on the Hub
    set_spec(kube, {**NEURON_A, "replicas": 3})  # a scale-up: the new pods must fetch the same weights
    reconcile(NS, NAME, cleanup=True)
    deployment = kube.one("Deployment")
    assert deployment["spec"]["replicas"] == 3 and fetched_revisions(deployment) == [first]
    assert template_key(deployment) == job_key(job_a)  # the same compile key: nothing compiles again
    assert kube.model()["status"]["resolved"]["modelRevision"] == first


def test_a_refused_edit_keeps_the_pins_so_its_fix_serves_the_same_commit(kube, reconcile, hub):
    """A typo (InvalidSpec) and its fix: the Failed status in between still records the pins, so main, moved on the
    Hub meanwhile, is not resolved again: the same commit, the same compile key, nothing compiles again."""
    job_a, _ = serve_a(kube, reconcile)
    first = hub.commit
    hub.commit = "feed" * 10  # main moves on the Hub
    set_spec(kube, {**NEURON_A, "parallelism": {"tensorParallelDegree": 128}})  # the typo
    assert reconcile(NS, NAME, cleanup=True).spec_error
    assert kube.model()["status"]["resolved"]["revisions"] == {f"hf://{HF_REPO}@": first}
    set_spec(kube, NEURON_A)  # the fix
    assert reconcile(NS, NAME, cleanup=True) == Outcome()
    deployment = kube.one("Deployment")
    assert fetched_revisions(deployment) == [first] and template_key(deployment) == job_key(job_a)
    assert kube.model()["status"]["resolved"]["modelRevision"] == first


def conditions(kube: FakeKube) -> dict[str, dict]:
    return {c["type"]: c for c in kube.model()["status"]["conditions"]}


def test_a_hub_that_does_not_answer_is_retried_not_failed_and_says_so(kube, reconcile, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    kube.put(body(NEURON_A))
    outcome = reconcile(NS, NAME, cleanup=True)
    assert outcome.child_error and not outcome.spec_error
    assert kube.children() == {}
    status = kube.model()["status"]
    assert status["phase"] == "Pending" and "observedGeneration" not in status  # this generation is not served yet
    ready = conditions(kube)["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "HubUnavailable"
    assert f"resolving hf://{HF_REPO}@main: the Hub at http://127.0.0.1:9 did not answer" in ready["message"]
    assert "retrying" in ready["message"] and "hfEndpoint" in ready["message"]
    assert [(t, r) for t, r, _ in kube.events] == [("Warning", "HubUnavailable")]
    reconcile(NS, NAME, cleanup=True)  # the retry: nothing new to say
    assert len(kube.status_patches) == 1 and len(kube.events) == 1


def test_a_serving_model_whose_edit_waits_for_the_hub_keeps_serving_and_says_so(kube, reconcile, monkeypatch):
    _, deployment = serve_a(kube, reconcile)
    phase, ready = kube.model()["status"]["phase"], conditions(kube)["Ready"]
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    set_spec(kube, {**NEURON_A, "model": {**NEURON_A["model"], "revision": "v2"}})  # a revision not pinned yet
    assert reconcile(NS, NAME, cleanup=True).child_error
    assert kube.one("Deployment") == deployment  # untouched: the previous spec keeps serving
    status = kube.model()["status"]
    assert status["phase"] == phase and status["observedGeneration"] == 1
    assert status["resolved"]["revisions"] == {f"hf://{HF_REPO}@": kube.model()["status"]["resolved"]["modelRevision"]}
    assert conditions(kube)["Ready"] == ready
    progressing = conditions(kube)["Progressing"]
    assert progressing["reason"] == "HubUnavailable" and progressing["observedGeneration"] == 2
    assert f"hf://{HF_REPO}@v2" in progressing["message"]


# --- the fake API server refuses and forgets what the real one does (tests/integration/test_api_rules.py shows the
# --- real one doing it)

def job_manifest(memory: str) -> dict:
    container = {"name": "c", "resources": {"requests": {"memory": memory}}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": NS},
            "spec": {"template": {"spec": {"containers": [container]}}}}


def test_the_fake_refuses_a_changed_job_template_and_immutable_config_map_data(kube):
    kube.apply(job_manifest("1Gi"))
    with pytest.raises(ApiError) as refused:
        kube.apply(job_manifest("2Gi"))
    assert refused.value.status == 422 and "field is immutable" in refused.value.message
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": NS}, "immutable": True,
              "data": {"a": "1"}}
    kube.apply(config)
    with pytest.raises(ApiError) as refused:
        kube.apply({**config, "data": {"a": "2"}})
    assert refused.value.status == 422


def test_the_fake_resets_replicas_its_sole_manager_omits_but_not_handed_over_ones(kube):
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": NS},
                  "spec": {"replicas": 3}}
    kube.apply(deployment)
    kube.apply({**deployment, "spec": {}})
    assert kube.get("Deployment", NS, "d")["spec"]["replicas"] == 1
    kube.apply(deployment)
    kube.apply(deployment, field_manager=api.HANDOVER_FIELD_MANAGER)
    kube.apply({**deployment, "spec": {}})
    assert kube.get("Deployment", NS, "d")["spec"]["replicas"] == 3


# --- engine vllm ------------------------------------------------------------------------------------------------

VLLM = {"model": {"source": "pvc://models/llama"}, "engine": "vllm", "instanceType": "inf2.48xlarge",
        "parallelism": {"tensorParallelDegree": 8}, "replicas": 1}


def test_an_engine_vllm_model_has_no_config_map_and_turns_ready(kube, reconcile):
    kube.put(body(VLLM))
    assert reconcile(NS, NAME, cleanup=True) == Outcome()
    assert kube.kinds() == ["Deployment", "Service"]
    container = kube.one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["vllm", "serve"] and "args" not in container
    assert "vllm-neuronx" in container["image"]
    kube.statuses["Deployment", NAME] = {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1,
                                         "availableReplicas": 1, "updatedReplicas": 1}
    labels = kube.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    kube.put({"kind": "Pod", "metadata": {"name": f"{NAME}-abc", "namespace": NS, "labels": labels},
              "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
    reconcile(NS, NAME, cleanup=True)
    status = kube.model()["status"]
    assert status["phase"] == "Ready" and status["resolved"]["image"] == container["image"]


def test_switching_to_engine_vllm_removes_the_config_map_once_no_pod_uses_it(kube, reconcile):
    ours = {**VLLM, "engine": "neuronmodel"}
    kube.put(body(ours))
    reconcile(NS, NAME, cleanup=True)
    first = kube.one("Deployment")
    (old,) = runtime_configmaps(kube)
    kube.put({"kind": "ReplicaSet", "metadata": {"name": f"{NAME}-1", "namespace": NS,
                                                  "labels": first["spec"]["template"]["metadata"]["labels"]},
              "spec": {"template": copy.deepcopy(first["spec"]["template"])}})
    set_spec(kube, VLLM)
    reconcile(NS, NAME, cleanup=True)
    assert not any("configMap" in v for v in kube.one("Deployment")["spec"]["template"]["spec"]["volumes"])
    assert list(runtime_configmaps(kube)) == [old]  # an old pod that restarts mid-rollout still reads it
    del kube.objects["ReplicaSet", NS, f"{NAME}-1"]
    reconcile(NS, NAME, cleanup=True)
    assert runtime_configmaps(kube) == {} and kube.kinds() == ["Deployment", "Service"]
    set_spec(kube, ours)  # and back: a ConfigMap again
    reconcile(NS, NAME, cleanup=True)
    assert list(runtime_configmaps(kube)) == [old]


def test_a_child_event_handled_before_its_new_specs_full_run_takes_the_full_run(kube, reconcile):
    """The watch shows a new spec (replicas 1 -> 2) while a pod's event is queued: handled first, it must not write
    the new generation's status from the old children (Ready "1/1" at the generation that asks for 2)."""
    kube.put(body(TORCH))
    reconcile(NS, NAME, cleanup=True)
    workload_ready(kube, "Deployment", 1)
    key, pod = serving_pod(kube, ready=True)
    reconcile(NS, NAME, cleanup=False, body=kube.model(), changed={key: pod})
    assert kube.model()["status"]["ready"] == "1/1"
    set_spec(kube, {**TORCH, "replicas": 2})
    reconcile(NS, NAME, cleanup=False, body=kube.model(), changed={key: pod})
    assert kube.one("Deployment")["spec"]["replicas"] == 2
    status = kube.model()["status"]
    assert status["observedGeneration"] == 1 or status["ready"] == "0/2", status  # the controller has not caught up
    workload_ready(kube, "Deployment", 2)
    reconcile(NS, NAME, cleanup=False, body=kube.model(), changed={("Deployment", NAME): kube.get("Deployment", NS, NAME)})
    status = kube.model()["status"]
    assert (status["observedGeneration"], status["ready"]) == (2, "2/2")
