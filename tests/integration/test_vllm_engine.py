"""Engine vllm on the real control plane: a model with a compile cache goes compile Job -> Deployment on the kwok
trn2 node, its status following the Job; the API server accepts the Job's vLLM container under its supervisor and the
pods' artifacts init container as the operator builds them.

kwok runs no containers (its pods of Jobs complete, the others become Ready): what vLLM and the artifacts
containers do inside the pods is the real node's part (tests/integration/realnode/test_vllm_end_to_end.py).
"""

from __future__ import annotations

import pytest

from test_operator import neuronmodel

pytestmark = pytest.mark.slow

VLLM_SPEC = {"model": {"source": "s3://models/llama-8b"}, "engine": "vllm", "instanceType": "trn2.48xlarge",
             "parallelism": {"tensorParallelDegree": 8}, "replicas": 2,
             "batching": {"maxBatchSize": 4, "maxContextLength": 512, "maxSeqLen": 1024},
             "compileCache": {"url": "s3://neuron-cache/vllm", "policy": "IfNotCached"}}


def _key_of(template) -> str:
    return template.metadata.annotations["neuronmodel.dev/compile-key"]


def test_a_cached_vllm_model_compiles_in_a_job_then_serves_and_its_next_key_compiles_first(api, wait_until):
    api.apply(neuronmodel("vllm8b", VLLM_SPEC))
    job = wait_until("the compile Job", lambda: api.batch.list_namespaced_job(api.ns).items, 30)[0]
    assert api.deployment("vllm8b") is None or job.status.succeeded  # nothing serves before the artifacts
    template = job.spec.template.spec
    # vLLM is an ordinary container under its supervisor (its exit fails the pod), never a restartable sidecar
    assert not [c for c in template.init_containers if c.restart_policy == "Always"]
    assert [c.name for c in template.init_containers][-1] == "install-supervisor"
    assert [c.name for c in template.containers] == ["runtime", "store-artifacts"]
    engine = template.containers[0].command
    assert engine[0] == "python" and engine[1].endswith("/supervise.py") and \
        engine[engine.index("--") + 1:][:2] == ["vllm", "serve"], engine
    assert not api.core.list_namespaced_config_map(api.ns, label_selector="neuronmodel.dev/name=vllm8b").items

    body = api.phase("vllm8b", "Ready")
    key = body["status"]["resolved"]["compileKey"]
    artifacts = next(c for c in body["status"]["conditions"] if c["type"] == "ArtifactsReady")
    assert artifacts["reason"] == "Compiled" and job.metadata.name in artifacts["message"]
    served = api.deployment("vllm8b").spec.template
    assert _key_of(served) == _key_of(job.spec.template) == key == job.metadata.annotations[
        "neuronmodel.dev/compile-key"]
    fetch = next(c for c in served.spec.init_containers if c.name == "fetch-artifacts")
    assert fetch.command[-1] == "--required" and "s3://neuron-cache/vllm" in fetch.command
    pods = api.core.list_namespaced_pod(api.ns, label_selector="neuronmodel.dev/name=vllm8b,"
                                                               "app.kubernetes.io/component=server").items
    assert len([p for p in pods if p.spec.node_name and p.spec.node_name.startswith("kwok-trn2")]) == 2
    row = next(line for line in api.plane.kubectl("get", "nm", "-n", api.ns).stdout.splitlines()
               if line.startswith("vllm8b "))
    assert row.split()[1:6] == ["Ready", "vllm", "auto", "8", "2/2"]

    # a new compiled shape: compiled first while the old pods serve, then rolled
    api.patch("vllm8b", {"batching": {"maxSeqLen": 2048}})
    new_key = wait_until("a new compile key", lambda: (k := api.get("vllm8b")["status"]["resolved"]["compileKey"])
                         != key and k, 30)
    wait_until("the new key's Job done", lambda: any(
        j.status.succeeded and j.metadata.annotations["neuronmodel.dev/compile-key"] == new_key
        for j in api.batch.list_namespaced_job(api.ns).items), 60)
    wait_until("the Deployment rolled", lambda: _key_of(api.deployment("vllm8b").spec.template) == new_key, 30)
    assert "--max-model-len" in (args := api.deployment("vllm8b").spec.template.spec.containers[0].command) and \
        args[args.index("--max-model-len") + 1] == "2048" and args[:2] == ["vllm", "serve"]
    api.phase("vllm8b", "Ready")

    # replicas change nothing compiled: no new Job
    jobs = len(api.batch.list_namespaced_job(api.ns).items)
    api.patch("vllm8b", {"replicas": 3})
    wait_until("three ready", lambda: api.get("vllm8b")["status"].get("readyReplicas") == 3, 60)
    assert len(api.batch.list_namespaced_job(api.ns).items) <= jobs


def test_policy_never_serves_without_a_job(api, wait_until):
    api.apply(neuronmodel("vllm-never", {**VLLM_SPEC, "replicas": 1,
                                         "compileCache": {"url": "s3://neuron-cache/vllm", "policy": "Never"}}))
    body = api.phase("vllm-never", "Ready")
    assert next(c for c in body["status"]["conditions"] if c["type"] == "ArtifactsReady")["reason"] == "NotRequired"
    assert not api.batch.list_namespaced_job(api.ns, label_selector="neuronmodel.dev/name=vllm-never").items
