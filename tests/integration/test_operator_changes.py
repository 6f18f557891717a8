"""A serving model keeps serving while a platform team changes it: each scenario starts from a Ready NeuronModel on
the real control plane (kwok nodes, the real LeaderWorkerSet controller, the operator as its own ServiceAccount),
edits, upgrades or scales it as a user would, and checks what kept serving and what the user sees.
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client as kube

from runtime_tests.helpers.fake_hf_hub import FakeHub
from k8s.operator_process import OperatorProcess
from neuronmodel_operator import images
from test_operator import TINY_SPEC, neuronmodel

pytestmark = pytest.mark.slow

CACHED = {**TINY_SPEC, "compileCache": {"url": "s3://neuron-cache/artifacts"}}
#: inf2.xlarge has 2 NeuronCores: while the serving pod holds them, a new compile Job cannot start, so a held
#: rollout stays held for as long as a test looks at it.
ONE_CORE_PAIR = {"model": {"source": "s3://models/tiny"}, "framework": "nxdi", "instanceType": "inf2.xlarge",
                 "parallelism": {"tensorParallelDegree": 2}, "replicas": 1,
                 "compileCache": {"url": "s3://neuron-cache/artifacts"}}
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"


def settled(api, name: str, timeout: float = 90) -> dict:
    """The model once it is Ready at its current generation (a Ready of the previous spec does not count)."""
    def done():
        body = api.get(name)
        state = body.get("status") or {}
        return body if state.get("phase") == "Ready" and \
            state.get("observedGeneration") == body["metadata"]["generation"] else None
    try:
        return api.wait_until(f"{name} Ready at its generation", done, timeout)
    except TimeoutError:
        raise AssertionError(f"{name} never settled: status {api.get(name).get('status')}") from None


def ready_count(api, name: str) -> int:
    return (api.get(name).get("status") or {}).get("readyReplicas", 0)


def jobs(api) -> list[str]:
    return sorted(job.metadata.name for job in api.batch.list_namespaced_job(api.ns).items)


def never_failed(api, name: str) -> None:
    failures = [(e.reason, e.message) for e in api.events(name) if e.type == "Warning"]
    assert not failures, failures


def ready_endpoints(api, service: str) -> int:
    slices = kube.DiscoveryV1Api(api.apps.api_client).list_namespaced_endpoint_slice(
        api.ns, label_selector=f"kubernetes.io/service-name={service}").items
    return sum(1 for s in slices for e in (s.endpoints or []) if e.conditions and e.conditions.ready)


def lws(api, name: str):
    try:
        return api.custom.get_namespaced_custom_object("leaderworkerset.x-k8s.io", "v1", api.ns,
                                                       "leaderworkersets", f"{name}-lws")
    except kube.exceptions.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def ready_replicas(api, name: str, multi_node: bool) -> int:
    if multi_node:
        group = lws(api, name)
        return ((group or {}).get("status") or {}).get("readyReplicas", 0)
    deployment = api.deployment(name)
    return (deployment.status.ready_replicas or 0) if deployment else 0


def test_everyday_edits_on_a_cached_model_roll_without_a_compile(api, wait_until):
    api.core.create_namespaced_service_account(api.ns, {"metadata": {"name": "model-reader"}})
    api.apply(neuronmodel("edited", CACHED))
    api.phase("edited", "Ready", timeout=120)
    compiled = jobs(api)
    assert len(compiled) == 1
    edits = (
        ({"resources": {"requests": {"memory": "1536Mi"}}},
         lambda pod: pod.containers[0].resources.requests["memory"] == "1536Mi"),
        ({"schedulerName": "my-scheduler"}, lambda pod: pod.scheduler_name == "my-scheduler"),
        ({"server": {"port": 9000}}, lambda pod: pod.containers[0].ports[0].container_port == 9000),
        ({"serviceAccountName": "model-reader"}, lambda pod: pod.service_account_name == "model-reader"),
    )
    for edit, landed in edits:
        api.patch("edited", edit)
        wait_until(f"{edit} in the Deployment", lambda: landed(api.deployment("edited").spec.template.spec), 30)
        settled(api, "edited")
        assert jobs(api) == compiled, edit  # the compile key did not change: nothing to compile
    assert api.core.read_namespaced_service("edited", api.ns).spec.ports[0].port == 9000
    never_failed(api, "edited")


def test_an_edit_during_a_compile_replaces_the_job(api, wait_until):
    api.apply(neuronmodel("recompile", ONE_CORE_PAIR))
    api.phase("recompile", "Ready", timeout=120)
    compiled = jobs(api)
    api.patch("recompile", {"batching": {"maxSeqLen": 4096}})  # a new key; its Job waits for the cores
    first = wait_until("the new key's Job", lambda: (found := jobs(api)) != compiled and len(found) == 1 and found, 30)
    api.patch("recompile", {"resources": {"requests": {"memory": "12Gi"}}})  # its pod template changes
    wait_until("the Job replaced", lambda: (found := jobs(api)) != first and len(found) == 1, 30)
    body = api.phase("recompile", "Compiling")
    assert {c["type"]: c["status"] for c in body["status"]["conditions"]}["Available"] == "True"
    never_failed(api, "recompile")


def test_an_operator_upgrade_compiles_first_while_the_old_pods_serve(api, operator, operator_rbac, control_plane,
                                                                     wait_until):
    def operator_at(version: str) -> OperatorProcess:
        process = OperatorProcess(operator_rbac.kubeconfig, control_plane.data_dir / "logs" / f"operator-{version}.log",
                                  None, "--runtime-image-version", version)
        process.start(timeout=60)
        return process

    operator.stop()
    try:
        old = operator_at("0.1.0")
        try:
            api.apply(neuronmodel("upgraded", ONE_CORE_PAIR))
            api.phase("upgraded", "Ready", timeout=120)
        finally:
            old.stop()
        served = api.deployment("upgraded").spec.template
        assert served.spec.containers[0].image == images.default_image("inf2", "nxdi", version="0.1.0")
        compiled = jobs(api)
        new = operator_at("0.2.0")  # the new release's default image: a new compile key for this model
        try:
            wait_until("the new release's compile Job", lambda: any(
                job.spec.template.spec.containers[0].image == images.default_image("inf2", "nxdi", version="0.2.0")
                for job in api.batch.list_namespaced_job(api.ns).items), 60)
            assert jobs(api) != compiled
            body = api.phase("upgraded", "Compiling")
            assert {c["type"]: c["status"] for c in body["status"]["conditions"]}["Available"] == "True"
            time.sleep(3)
            assert api.deployment("upgraded").spec.template == served  # held: nothing rolled onto new artifacts
            api.patch("upgraded", {"replicas": 0})  # frees the NeuronCores: the Job compiles, then it rolls
            wait_until("rolled onto 0.2.0", lambda: api.deployment("upgraded").spec.template.spec.containers[0]
                       .image == images.default_image("inf2", "nxdi", version="0.2.0"), 60)
        finally:
            new.stop()
    finally:
        operator.start()


@pytest.mark.parametrize("before,after", [(1, 2), (2, 1)], ids=["deployment-to-group", "group-to-deployment"])
def test_a_workload_kind_change_serves_until_the_new_one_is_ready(api, wait_until, before, after):
    spec = {**TINY_SPEC, "parallelism": {"tensorParallelDegree": 2, "nodes": before}}
    api.apply(neuronmodel("kind", spec))
    api.phase("kind", "Ready", timeout=120)
    wait_until("the Service's endpoint", lambda: ready_endpoints(api, "kind") >= 1, 30)
    api.patch("kind", {"parallelism": {"nodes": after}})
    seen = []  # (old workload exists, new workload ready, ready endpoints) every poll until the switch is done

    def switched():
        old = api.deployment("kind") if before == 1 else lws(api, "kind")
        seen.append((old is not None, ready_replicas(api, "kind", multi_node=after > 1) >= 1,
                     ready_endpoints(api, "kind")))
        return old is None
    wait_until("the old workload removed", switched, 120)
    assert all(endpoints >= 1 for _, _, endpoints in seen), seen  # the Service always had a ready pod
    assert all(old for old, new_ready, _ in seen if not new_ready), seen  # never removed before the new was ready
    selector = api.core.read_namespaced_service("kind", api.ns).spec.selector
    assert (WORKER_INDEX in selector) == (after > 1)
    settled(api, "kind", timeout=60)


def test_replicas_to_autoscaling_keeps_the_serving_pods(api, wait_until):
    api.apply(neuronmodel("scaling", {**TINY_SPEC, "replicas": 3}))
    wait_until("3 ready", lambda: ready_count(api, "scaling") == 3, 90)
    autoscaled = {key: value for key, value in TINY_SPEC.items() if key != "replicas"}
    api.apply(neuronmodel("scaling", {**autoscaled, "autoscaling": {"minReplicas": 1, "maxReplicas": 6}}))
    autoscaling = kube.AutoscalingV2Api(api.apps.api_client)
    wait_until("the HPA", lambda: autoscaling.list_namespaced_horizontal_pod_autoscaler(api.ns).items, 30)
    for _ in range(10):  # the no-replicas apply has landed (the HPA exists); nothing scales it down
        assert api.deployment("scaling").spec.replicas == 3
        time.sleep(0.5)
    managers = {f.manager for f in api.deployment("scaling").metadata.managed_fields}
    assert "neuronmodel-operator-handover" in managers
    api.apply(neuronmodel("scaling", {**TINY_SPEC, "replicas": 2}))
    wait_until("2 replicas", lambda: api.deployment("scaling").spec.replicas == 2, 30)
    wait_until("the HPA removed", lambda: not autoscaling.list_namespaced_horizontal_pod_autoscaler(api.ns).items, 30)


def test_a_minimal_spec_runs_one_replica(api):
    api.apply(neuronmodel("minimal", {"model": TINY_SPEC["model"], "framework": "torch"}))
    body = api.phase("minimal", "Ready", timeout=90)
    assert body["status"]["ready"] == "1/1" and api.deployment("minimal").spec.replicas == 1


def config_map_of(pod_spec) -> str:
    (name,) = [v.config_map.name for v in pod_spec.volumes if v.config_map]
    return name


def test_an_old_pod_restarted_mid_rollout_reads_its_own_config(api, wait_until):
    api.apply(neuronmodel("rolling", {**TINY_SPEC, "replicas": 2}))
    wait_until("2 ready", lambda: ready_count(api, "rolling") == 2, 90)
    old_config = config_map_of(api.deployment("rolling").spec.template.spec)
    # a new config whose pods cannot be placed: the rollout stops half-way, the old pods keep serving
    api.patch("rolling", {"batching": {"maxBatchSize": 4}, "nodeSelector": {"example.com/no-such-node": "true"}})
    new_config = wait_until("the new revision", lambda: (c := config_map_of(api.deployment("rolling").spec.template
                                                                             .spec)) != old_config and c, 30)
    selector = "neuronmodel.dev/name=rolling"
    wait_until("a surge pod pending", lambda: any(
        p.status.phase == "Pending" for p in api.core.list_namespaced_pod(api.ns, label_selector=selector).items), 30)
    old_pod = next(p for p in api.core.list_namespaced_pod(api.ns, label_selector=selector).items
                   if config_map_of(p.spec) == old_config)
    api.core.delete_namespaced_pod(old_pod.metadata.name, api.ns, grace_period_seconds=0)
    replacement = wait_until("the old ReplicaSet's replacement pod", lambda: next(
        (p for p in api.core.list_namespaced_pod(api.ns, label_selector=selector).items
         if p.metadata.name != old_pod.metadata.name and config_map_of(p.spec) == old_config
         and p.status.phase == "Running"), None), 60)
    assert config_map_of(replacement.spec) == old_config
    old, new = (api.core.read_namespaced_config_map(name, api.ns) for name in (old_config, new_config))
    assert old.immutable and new.immutable
    assert '"max_num_seqs": 2' in old.data["config.json"] and '"max_num_seqs": 4' in new.data["config.json"]
    # the killed pod's replacement (old config) serves again: back to the serving count once it is ready
    wait_until("2 ready again", lambda: ready_count(api, "rolling") == 2, 60)


def fetched_revisions(pod_spec) -> list[str]:
    return [init.command[init.command.index("--revision") + 1] for init in pod_spec.init_containers or []]


def test_an_unpinned_hf_source_serves_one_commit_on_every_replica(api, operator, operator_rbac, control_plane,
                                                                  wait_until):
    with FakeHub("org/tiny", {"config.json": b"{}"}) as hub:
        operator.stop()
        pinning = OperatorProcess(operator_rbac.kubeconfig, control_plane.data_dir / "logs" / "operator-hub.log",
                                  operator.image, env={"HF_ENDPOINT": hub.url})  # a mirror, as HF_ENDPOINT names one
        try:
            pinning.start(timeout=60)
            api.apply(neuronmodel("pinned", {**TINY_SPEC, "model": {"source": "hf://org/tiny"}}))
            first = hub.commit
            resolved = settled(api, "pinned")["status"]["resolved"]
            assert resolved["modelRevision"] == first and resolved["revisions"] == {"hf://org/tiny@": first}
            hub.commit = "feed" * 10  # main moves on the Hub
            api.patch("pinned", {"replicas": 3})
            wait_until("3 ready", lambda: ready_count(api, "pinned") == 3, 90)
            pods = api.core.list_namespaced_pod(api.ns, label_selector="neuronmodel.dev/name=pinned").items
            assert len(pods) == 3 and all(fetched_revisions(p.spec) == [first] for p in pods)
            assert api.get("pinned")["status"]["resolved"]["compileKey"] == resolved["compileKey"]
        finally:
            pinning.stop()
            operator.start()


def scale(api, name: str, multi_node: bool, replicas: int) -> None:
    """What the HPA does: the scale subresource of the workload."""
    if multi_node:
        api.custom.patch_namespaced_custom_object_scale("leaderworkerset.x-k8s.io", "v1", api.ns, "leaderworkersets",
                                                        f"{name}-lws", {"spec": {"replicas": replicas}})
    else:
        api.apps.patch_namespaced_deployment_scale(name, api.ns, {"spec": {"replicas": replicas}})


@pytest.mark.parametrize("before,after", [(1, 2), (2, 1)], ids=["deployment-to-group", "group-to-deployment"])
def test_a_kind_change_under_autoscaling_keeps_the_scaled_count(api, wait_until, before, after):
    autoscaled = {key: value for key, value in TINY_SPEC.items() if key != "replicas"}
    # no exclusive topology: the torch pods fit only the harness's one CPU node, which takes the three groups
    exclusive = {1: {"groupTopologyKey": None}, 2: {"groupTopologyKey": ""}}
    parallelism = {"tensorParallelDegree": 2, "nodes": before, **({"groupTopologyKey": ""} if before > 1 else {})}
    api.apply(neuronmodel("scaled", {**autoscaled, "autoscaling": {"minReplicas": 1, "maxReplicas": 4},
                                     "parallelism": parallelism}))
    api.phase("scaled", "Ready", timeout=120)
    scale(api, "scaled", before > 1, 3)  # the HPA scaled it to 3 (here: no metrics API, so it keeps 3)
    wait_until("3 ready", lambda: ready_replicas(api, "scaled", multi_node=before > 1) == 3, 120)
    api.patch("scaled", {"parallelism": {"nodes": after, **exclusive[after]}})
    seen = []  # (old workload exists, new workload's ready count) every poll until the switch is done

    def switched():
        old = api.deployment("scaled") if before == 1 else lws(api, "scaled")
        seen.append((old is not None, ready_replicas(api, "scaled", multi_node=after > 1)))
        return old is None
    def diagnose() -> str:
        pods = api.core.list_namespaced_pod(api.ns, label_selector="neuronmodel.dev/name=scaled").items
        return f"status {api.get('scaled').get('status')}\nLWS {(lws(api, 'scaled') or {}).get('status')}\npods " + \
            str([(p.metadata.name, p.status.phase, [(c.type, c.status, c.message) for c in p.status.conditions or []])
                 for p in pods])
    wait_until("the old workload removed", switched, 180, diagnose)
    assert all(old for old, ready in seen if ready < 3), seen  # never switched before all 3 were ready
    new = lws(api, "scaled")["spec"] if after > 1 else api.deployment("scaled").spec.to_dict()
    assert new["replicas"] == 3
    assert ready_replicas(api, "scaled", multi_node=after > 1) == 3
