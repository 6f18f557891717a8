"""Placement and sizing on the real control plane: the Neuron scheduler extension's name on pods that take part of a
node, default requests and emptyDir size limits on the live objects (and the kwok Neuron nodes still hold them),
node paths refused by an operator without --allow-host-path, and the DRA objects accepted by the apiserver.

The harness's kube-scheduler has a second profile named `my-scheduler` standing in for the Neuron scheduler
extension (scripts/k8s/cluster.py), so pods that ask for it are scheduled.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from k8s.operator_process import OperatorProcess  # scripts/ is on sys.path (conftest)
from kubernetes import client as kube

from neuronmodel_operator import api as nm_api
from neuronmodel_operator import builders
from neuronmodel_operator.builders import dra
from neuronmodel_operator.resolve import OperatorDefaults

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "assets" / "tiny" / "target"
GROUP, VERSION, PLURAL = "neuronmodel.dev", "v1alpha1", "neuronmodels"  # as in conftest.Api
#: 8 of inf2.48xlarge's 24 NeuronCores: a pod on part of a node
PARTIAL = {"model": {"source": "s3://models/tiny"}, "framework": "nxdi", "instanceType": "inf2.48xlarge",
           "parallelism": {"tensorParallelDegree": 8}, "replicas": 2}
#: TP 2 on inf2.xlarge: the whole node
WHOLE = {"model": {"source": "s3://models/tiny"}, "framework": "nxdi", "instanceType": "inf2.xlarge",
         "parallelism": {"tensorParallelDegree": 2}, "replicas": 1}


def neuronmodel(name: str, spec: dict) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "NeuronModel", "metadata": {"name": name}, "spec": spec}


def pods(api, name: str) -> list:
    return api.core.list_namespaced_pod(api.ns, label_selector=f"neuronmodel.dev/name={name}").items


def test_partial_node_pods_get_the_neuron_scheduler_and_go_ready(api):
    api.apply(neuronmodel("partial", PARTIAL))
    body = api.phase("partial", "Ready", timeout=120)
    assert body["status"]["resolved"]["schedulerName"] == "my-scheduler" and not body["status"].get("warnings")
    running = pods(api, "partial")
    assert len(running) == 2
    assert {p.spec.scheduler_name for p in running} == {"my-scheduler"}
    assert all(p.spec.node_name == "kwok-inf2-48xlarge" for p in running)


def test_whole_node_pods_use_the_default_scheduler(api):
    api.apply(neuronmodel("whole", WHOLE))
    body = api.phase("whole", "Ready", timeout=120)
    assert "schedulerName" not in body["status"]["resolved"]
    assert api.deployment("whole").spec.template.spec.scheduler_name == "default-scheduler"  # the API's default
    assert [p.spec.scheduler_name for p in pods(api, "whole")] == ["default-scheduler"]


def test_requests_size_limits_and_spread_on_the_live_deployment(api):
    api.apply(neuronmodel("sized", {**PARTIAL, "model": {"source": "s3://models/llama", "parameters": "8B"}}))
    api.phase("sized", "Ready", timeout=120)  # scheduled: the kwok Neuron node holds the requests
    template = api.deployment("sized").spec.template.spec
    (runtime,) = template.containers
    requests = runtime.resources.requests
    assert {"cpu", "memory", "ephemeral-storage", "aws.amazon.com/neuroncore"} <= set(requests)
    assert requests["aws.amazon.com/neuroncore"] == "8" and runtime.termination_message_policy == \
        "FallbackToLogsOnError"
    (fetch,) = template.init_containers
    assert "ephemeral-storage" in fetch.resources.requests
    empty_dirs = {v.name: v.empty_dir for v in template.volumes if v.empty_dir is not None}
    assert set(empty_dirs) == {"shm", "tmp", "cache", "neuron-cache", "models"}
    assert all(d.size_limit for d in empty_dirs.values()), empty_dirs
    assert empty_dirs["models"].size_limit == "19Gi"  # 8B in bf16: 14.9 GiB, +20% (18), +1 GiB
    spread = {(c.topology_key, c.when_unsatisfiable) for c in template.topology_spread_constraints}
    assert spread == {("kubernetes.io/hostname", "ScheduleAnyway"), ("topology.kubernetes.io/zone", "ScheduleAnyway")}


def test_an_operator_as_the_chart_defaults_it_refuses_node_paths_and_warns_without_a_scheduler(
        api, operator, operator_rbac, control_plane):
    """The session operator serves node paths (the harness passes --allow-host-path). One started without it and
    without a Neuron scheduler name, watching only this namespace: a node path fails naming the flag; a model on part
    of a node is served by the default scheduler, with a warning in its status and a Warning Event."""
    operator.stop()
    restricted = OperatorProcess(operator_rbac.kubeconfig, control_plane.data_dir / "logs" / "operator-no-host.log",
                                 operator.image, "--verbose", "--namespace", api.ns, "--neuron-scheduler-name", "",
                                 allow_host_path=False)
    try:
        restricted.start(timeout=60)
        api.apply(neuronmodel("node-path", {"model": {"source": str(TINY)}, "framework": "torch", "replicas": 1}))
        api.apply(neuronmodel("unplaced", {**PARTIAL, "replicas": 1}))
        body = api.phase("node-path", "Failed")
        ready = next(c for c in body["status"]["conditions"] if c["type"] == "Ready")
        assert ready["reason"] == "InvalidSpec"
        assert ready["message"].startswith("spec.model.source: ") and "--allow-host-path" in ready["message"]
        assert api.deployment("node-path") is None
        body = api.phase("unplaced", "Ready", timeout=120)
        (warning,) = body["status"]["warnings"]
        assert "contiguous" in warning and "--neuron-scheduler-name" in warning
        assert "schedulerName" not in body["status"]["resolved"]
        api.warning("unplaced", "NoNeuronScheduler", contains="--neuron-scheduler-name")
    finally:
        restricted.stop()
        operator.start(timeout=60)
    api.phase("node-path", "Ready", timeout=120)  # the session operator (allowed) serves it


def _dra_target(namespace: str) -> builders.Target:
    body = {"apiVersion": nm_api.API_VERSION, "kind": nm_api.KIND,
            "metadata": {"name": "qwen-dra", "namespace": namespace, "uid": "00000000-0000-0000-0000-000000000001"},
            "spec": {"model": {"source": "s3://models/qwen"}, "instanceType": "trn2.48xlarge",
                     "parallelism": {"tensorParallelDegree": 16}, "deviceAllocation": "dra", "replicas": 1}}
    return builders.target_from_body(body, OperatorDefaults(image="neuronmodel-runtime:test"))


def test_the_apiserver_serves_resource_k8s_io_v1(control_plane):
    status, body = control_plane.get("/apis/resource.k8s.io/v1")
    assert status == 200, body
    assert "resourceclaimtemplates" in {r["name"] for r in body["resources"]}


def _dry_run(api, manifest: dict) -> dict:
    """`manifest` created with dryRun=All (validated and defaulted, nothing stored), as the apiserver returns it."""
    manifest = {**manifest, "metadata": {k: v for k, v in manifest["metadata"].items()
                                         if k != "ownerReferences"}}  # no such owner exists in the namespace
    out = api.plane.kubectl("create", "--dry-run=server", "-o", "json", "-n", api.ns, "-f", "-",
                            stdin=json.dumps(manifest), check=False)
    assert out.returncode == 0, f"{manifest['kind']} refused: {out.stderr}"
    return json.loads(out.stdout)


def test_dra_objects_pass_a_server_side_dry_run(api):
    """The ResourceClaimTemplate (4 connected trn2 devices, LNC 2) and the Deployment whose pods claim from it, as
    the apiserver validates them."""
    target = _dra_target(api.ns)
    template = dra.resource_claim_template(target)
    devices = _dry_run(api, template)["spec"]["spec"]["devices"]
    assert devices["requests"][0]["exactly"]["count"] == 4
    assert devices["constraints"] == [{"requests": ["neuron"], "matchAttribute": "resource.aws.com/devicegroup4_id"}]
    assert devices["config"][0]["opaque"] == {"driver": "neuron.aws.com", "parameters": {
        "apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 2}}
    pod = _dry_run(api, builders.deployment(target))["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [{"name": "neuron", "resourceClaimTemplateName": template["metadata"]["name"]}]
    assert pod["containers"][0]["resources"]["claims"] == [{"name": "neuron"}]
    with pytest.raises(kube.exceptions.ApiException):  # nothing was stored
        kube.ResourceV1Api(api.core.api_client).read_namespaced_resource_claim_template(
            template["metadata"]["name"], api.ns)


def test_a_dra_model_gets_its_claim_template_from_the_operator(api, wait_until):
    """The operator applies the ResourceClaimTemplate under its own RBAC; the pods claim from it (and stay Pending:
    no Neuron DRA driver publishes devices here)."""
    api.apply(neuronmodel("qwen-dra", {"model": {"source": "s3://models/qwen"}, "instanceType": "trn2.48xlarge",
                                       "parallelism": {"tensorParallelDegree": 16}, "deviceAllocation": "dra",
                                       "replicas": 1}))
    resource = kube.ResourceV1Api(api.core.api_client)
    (template,) = wait_until("the ResourceClaimTemplate", lambda: resource.list_namespaced_resource_claim_template(
        api.ns).items, 60)
    assert template.spec.spec.devices.requests[0].exactly.count == 4
    assert template.metadata.owner_references[0].name == "qwen-dra"
    deployment = wait_until("the Deployment", lambda: api.deployment("qwen-dra"), 60)
    claims = deployment.spec.template.spec.resource_claims
    assert [(c.name, c.resource_claim_template_name) for c in claims] == [("neuron", template.metadata.name)]
