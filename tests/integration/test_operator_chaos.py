"""Operator chaos on the real control plane (issue 25, part 4): the operator killed mid-reconcile of 50 models, the
API server and etcd restarted under it, a NeuronModel edited in a tight loop, a second field manager on a child, the
compile Job's pod killed mid-compile. Everything converges to the last spec, with no duplicate or orphaned children
and a status that says what is true.

Covered elsewhere and not repeated here: a child deleted or edited by hand (test_operator.py,
test_a_deleted_or_edited_child_is_restored), deleting a model while the operator is down (test_operator.py).
"""

from __future__ import annotations

import json
import time

import pytest

from test_operator import GROUP, PLURAL, TINY_SPEC, VERSION, mounted_config_map, neuronmodel
from test_operator_changes import CACHED, jobs, settled

pytestmark = pytest.mark.slow

MANAGED = "app.kubernetes.io/managed-by=neuronmodel-operator"
OPERATOR_MANAGER = "neuronmodel-operator"
QUIET_S = 4.0  # longer than a refresh takes: a fight or a hot loop writes within it


def all_settled(api, names: list[str], phase: str, timeout: float) -> dict[str, dict]:
    """Every named model in `phase` at its generation, by one list per poll."""
    def done():
        models = {m["metadata"]["name"]: m for m in api.custom.list_namespaced_custom_object(
            GROUP, VERSION, api.ns, PLURAL)["items"]}
        ready = {n: m for n, m in models.items() if (m.get("status") or {}).get("phase") == phase
                 and m["status"].get("observedGeneration") == m["metadata"]["generation"]}
        return models if set(names) <= set(ready) else None

    def diagnose():
        models = {m["metadata"]["name"]: m.get("status") for m in api.custom.list_namespaced_custom_object(
            GROUP, VERSION, api.ns, PLURAL)["items"]}
        return "\n".join(f"{n}: {json.dumps(models.get(n))}" for n in names
                         if (models.get(n) or {}).get("phase") != phase)
    return api.wait_until(f"{len(names)} models {phase}", done, timeout, diagnose)


def children(api) -> list:
    """Every object the operator labelled as its own in the test's namespace."""
    return [*api.apps.list_namespaced_deployment(api.ns, label_selector=MANAGED).items,
            *api.core.list_namespaced_service(api.ns, label_selector=MANAGED).items,
            *api.core.list_namespaced_config_map(api.ns, label_selector=MANAGED).items,
            *api.batch.list_namespaced_job(api.ns, label_selector=MANAGED).items]


def assert_one_set_of_children_each(api, models: dict[str, dict]) -> None:
    """One Deployment, Service and runtime ConfigMap per model, each controlled by its live model: no duplicate,
    no orphan."""
    uids = {m["metadata"]["uid"]: n for n, m in models.items()}
    per_model: dict[tuple[str, str], list[str]] = {}
    for child in children(api):
        (ref,) = [r for r in child.metadata.owner_references or [] if r.controller]
        assert ref.uid in uids, f"{child.kind} {child.metadata.name} is an orphan (owner uid {ref.uid})"
        kind = type(child).__name__.removeprefix("V1")
        per_model.setdefault((uids[ref.uid], kind), []).append(child.metadata.name)
    for name in models:
        assert [len(per_model.get((name, kind), [])) for kind in ("Deployment", "Service", "ConfigMap")] == \
            [1, 1, 1], {kind: per_model.get((name, kind)) for kind in ("Deployment", "Service", "ConfigMap")}


def quiet_for(api, read, seconds: float = QUIET_S) -> None:
    """`read()` (a generation, say) stays the same for `seconds`: no one keeps writing."""
    first, deadline = read(), time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert read() == first, f"still written after it settled: {first} -> {read()}"
        time.sleep(0.5)


def test_killed_mid_reconcile_of_50_models_converges_without_duplicates_or_orphans(api, operator):
    # replicas 0: every child and the status, but no pods (the kwok CPU node holds about a dozen torch pods)
    names = [f"chaos-{i:02d}" for i in range(50)]
    for name in names:
        api.custom.create_namespaced_custom_object(GROUP, VERSION, api.ns, PLURAL,
                                                   neuronmodel(name, {**TINY_SPEC, "replicas": 0}))
    api.wait_until("the first children", lambda: api.apps.list_namespaced_deployment(
        api.ns, label_selector=MANAGED).items, 60)
    operator.kill()  # some reconciled, some halfway, most not started
    done_before = len(api.apps.list_namespaced_deployment(api.ns, label_selector=MANAGED).items)
    operator.start()
    models = all_settled(api, names, "Pending", 120)
    assert_one_set_of_children_each(api, models)
    for model in models.values():
        ready = next(c for c in model["status"]["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "ScaledToZero"), model["status"]
        assert model["status"]["ready"] == "0/0", model["status"]
    assert done_before < len(names), "the operator was killed after all of them: not mid-reconcile"


def test_an_api_server_and_etcd_restart_is_survived(api, operator, control_plane):
    api.apply(neuronmodel("before", TINY_SPEC))
    settled(api, "before")
    control_plane.restart("etcd", "kube-apiserver")
    api.patch("before", {"replicas": 2})  # the operator's watches reconnect: a change made after is seen
    api.apply(neuronmodel("after", TINY_SPEC))
    assert settled(api, "before", timeout=120)["status"]["ready"] == "2/2"
    settled(api, "after", timeout=60)
    assert operator.process.poll() is None, operator.tail()
    assert_one_set_of_children_each(api, {n: api.get(n) for n in ("before", "after")})


def test_a_tight_loop_of_edits_converges_to_the_last_spec(api, operator):
    api.apply(neuronmodel("churn", TINY_SPEC))
    settled(api, "churn")
    for size in range(3, 23):  # 20 edits, each a new runtime config, as fast as the API takes them
        api.patch("churn", {"batching": {"maxBatchSize": size}})
    body = settled(api, "churn", timeout=120)
    assert body["metadata"]["generation"] >= 21
    deployment = api.deployment("churn")
    config = api.core.read_namespaced_config_map(mounted_config_map(deployment), api.ns).data["config.json"]
    assert '"max_num_seqs": 22' in config
    assert operator.process.poll() is None, operator.tail()
    # spec writes only (status writes go on while the last rollout finishes): a fight or a hot loop bumps it
    quiet_for(api, lambda: api.deployment("churn").metadata.generation)

    def unused_configs() -> set[str]:
        """The model's runtime ConfigMaps that no ReplicaSet the Deployment keeps (its revision history) mounts."""
        selector = f"{MANAGED},neuronmodel.dev/name=churn"
        used = {mounted_config_map(rs) for rs in api.apps.list_namespaced_replica_set(api.ns, label_selector=selector)
                .items}
        return {c.metadata.name for c in api.core.list_namespaced_config_map(api.ns, label_selector=selector).items
                if c.metadata.name.startswith("churn-runtime-")} - used

    # The Deployment controller prunes the old ReplicaSets after the rollout, when no reconcile runs: their
    # ConfigMaps are swept on those ReplicaSets' watch events.
    api.wait_until("only the runtime ConfigMaps of kept revisions", lambda: not unused_configs(), 60,
                   lambda: f"unused: {sorted(unused_configs())}")


def test_a_second_field_manager_keeps_its_own_fields_and_loses_the_operators(api):
    api.apply(neuronmodel("shared", TINY_SPEC))
    settled(api, "shared")
    image = api.deployment("shared").spec.template.spec.containers[0].image
    # a platform team's tool applies its annotation, and (forcing the conflict) an image of its own
    api.plane.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=platform-team",
                      "-n", api.ns, "-f", "-", stdin=json.dumps({
                          "apiVersion": "apps/v1", "kind": "Deployment",
                          "metadata": {"name": "shared", "annotations": {"example.com/cost-center": "ml-42"}},
                          "spec": {"template": {"spec": {"containers": [
                              {"name": "runtime", "image": "someone/else:latest"}]}}}}))
    restored = api.wait_until("the operator's image back", lambda: (d := api.deployment("shared")) and
                              d.spec.template.spec.containers[0].image == image and d, 30)
    assert restored.metadata.annotations["example.com/cost-center"] == "ml-42"  # not the operator's to remove
    image_owners = {f.manager for f in restored.metadata.managed_fields if "'f:image'" in str(f.fields_v1)}
    assert image_owners == {OPERATOR_MANAGER}, restored.metadata.managed_fields
    quiet_for(api, lambda: (api.deployment("shared").metadata.generation,  # no fight over the image
                            api.deployment("shared").spec.template.spec.containers[0].image))


def test_a_compile_pod_killed_mid_compile_is_retried_and_the_model_serves(api, control_plane):
    with control_plane.paused("kwok"):  # the node's kubelet reports nothing: the compile pod stays as it is
        api.apply(neuronmodel("recompiled", CACHED))
        (job,) = api.wait_until("the compile Job", lambda: api.batch.list_namespaced_job(api.ns).items, 30)
        selector = f"job-name={job.metadata.name}"
        pod = api.wait_until("its pod on a node", lambda: next(
            (p for p in api.core.list_namespaced_pod(api.ns, label_selector=selector).items if p.spec.node_name),
            None), 30)
        # what the kubelet reports of a compiler killed by SIGKILL (the OOM killer, kill -9)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        # (with the pod IP it ran with: kwok's pod-ready stage takes a pod without one for a new pod)
        api.core.patch_namespaced_pod_status(pod.metadata.name, api.ns, {"status": {
            "phase": "Failed", "podIP": "10.244.99.99", "podIPs": [{"ip": "10.244.99.99"}], "containerStatuses": [{
                "name": c.name, "image": c.image, "imageID": "", "ready": False, "restartCount": 0,
                "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "startedAt": now,
                                         "finishedAt": now}}} for c in pod.spec.containers]}})
    body = api.phase("recompiled", "Ready", timeout=90)  # the Job controller's retry (after 10 s) compiles
    artifacts = next(c for c in body["status"]["conditions"] if c["type"] == "ArtifactsReady")
    assert artifacts["reason"] == "Compiled"
    (job,) = api.batch.list_namespaced_job(api.ns).items
    assert (job.status.failed, job.status.succeeded) == (1, 1)
    assert jobs(api) == [job.metadata.name]
