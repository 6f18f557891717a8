"""The `neuronmodel-operator` CLI (flags, env defaults) and the kopf settings and handler registry it runs.

The registry guard: kopf adds a finalizer to every NeuronModel when any handler needs one (a delete handler, a
timer, a daemon). Then deleting a NeuronModel while the operator is down hangs until it comes back. These
tests ask kopf's own decision functions (the ones its processing loop calls) as well as the handlers' flags.
"""

from __future__ import annotations

import logging

import kopf
import pytest
from kopf._cogs.structs import bodies, ephemera, patches, references
from kopf._core.intents import causes, handlers as kopf_handlers

from neuronmodel_operator import api, cli, handlers, images, metrics
from neuronmodel_operator.api import parse_spec
from neuronmodel_operator.builders.common import target_from_body
from neuronmodel_operator.builders.configmap import runtime_config
from neuronmodel_operator.resolve import resolve

ENV_NAMES = ("NEURONMODEL_OPERATOR_NAMESPACES", "NEURONMODEL_OPERATOR_LIVENESS", "NEURONMODEL_OPERATOR_LOG_FORMAT",
             "NEURONMODEL_OPERATOR_VERBOSE", "NEURONMODEL_OPERATOR_PEERING", "NEURONMODEL_OPERATOR_PRIORITY",
             "NEURONMODEL_OPERATOR_WORKERS", "NEURONMODEL_OPERATOR_WATCH_TIMEOUT_S", "NEURONMODEL_RUNTIME_IMAGE",
             "NEURONMODEL_RUNTIME_IMAGE_REPOSITORY", "NEURONMODEL_RUNTIME_IMAGE_VERSION", "NEURONMODEL_HPA_METRIC",
             "NEURONMODEL_OPERATOR_COMPILE_CACHE_URL", "NEURONMODEL_OPERATOR_COMPILE_CACHE_POLICY",
             "NEURONMODEL_OPERATOR_METRICS_PORT", "NEURONMODEL_OPERATOR_NEURON_SCHEDULER_NAME",
             "NEURONMODEL_OPERATOR_ALLOW_HOST_PATH", "KUBECONFIG")


@pytest.fixture
def env(monkeypatch):
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def parse(*argv: str):
    return cli.parser().parse_args(list(argv))  # a new parser: defaults are read from the env when it is built


# --- flags and env -------------------------------------------------------------------------------------------

def test_defaults_without_env(env):
    args = parse()
    assert args.namespaces == []  # all namespaces
    assert args.liveness == "http://0.0.0.0:8080/healthz"
    assert args.log_format == "text"
    assert args.verbose is False
    assert args.peering == ""  # standalone
    assert args.priority == 0
    assert args.runtime_image is None  # chosen per instance family and framework
    assert args.runtime_image_repository == "ghcr.io/neuronmodel/neuronmodel-runtime"
    assert args.runtime_image_version == images.package_version() == "0.1.0"
    assert args.hpa_metric == "vllm:num_requests_waiting"
    assert args.workers == 8
    assert args.watch_timeout_s == 300.0
    assert args.compile_cache_url is None and args.compile_cache_policy == "IfNotCached"
    assert args.metrics_port == 8081
    assert args.kubeconfig is None


def test_env_defaults(env):
    env.setenv("NEURONMODEL_OPERATOR_NAMESPACES", "team-a,team-b")
    env.setenv("NEURONMODEL_OPERATOR_LIVENESS", "")
    env.setenv("NEURONMODEL_OPERATOR_LOG_FORMAT", "json")
    env.setenv("NEURONMODEL_OPERATOR_VERBOSE", "true")
    env.setenv("NEURONMODEL_OPERATOR_PEERING", "neuronmodel")
    env.setenv("NEURONMODEL_OPERATOR_PRIORITY", "100")
    env.setenv("NEURONMODEL_OPERATOR_WORKERS", "3")
    env.setenv("NEURONMODEL_OPERATOR_WATCH_TIMEOUT_S", "120")
    env.setenv("NEURONMODEL_RUNTIME_IMAGE", "registry.example/runtime:9")
    env.setenv("NEURONMODEL_RUNTIME_IMAGE_REPOSITORY", "mirror.example/neuronmodel")
    env.setenv("NEURONMODEL_RUNTIME_IMAGE_VERSION", "0.2.0")
    env.setenv("NEURONMODEL_HPA_METRIC", "queue_depth")
    env.setenv("KUBECONFIG", "/tmp/kubeconfig")
    args = parse()
    assert args.namespaces == ["team-a", "team-b"]
    assert args.liveness == ""
    assert args.log_format == "json"
    assert args.verbose is True
    assert args.peering == "neuronmodel"
    assert args.priority == 100
    assert args.workers == 3
    assert args.watch_timeout_s == 120.0
    assert args.runtime_image == "registry.example/runtime:9"
    assert (args.runtime_image_repository, args.runtime_image_version) == ("mirror.example/neuronmodel", "0.2.0")
    assert args.hpa_metric == "queue_depth"
    assert args.kubeconfig == "/tmp/kubeconfig"


@pytest.mark.parametrize("value, namespaces", [
    ("", []), ("one", ["one"]), ("a,b,c", ["a", "b", "c"]), ("a,,b,", ["a", "b"]), ("a, b", ["a", "b"]),
])
def test_namespaces_from_the_comma_list(env, value, namespaces):
    env.setenv("NEURONMODEL_OPERATOR_NAMESPACES", value)
    assert parse().namespaces == namespaces


def test_verbose_env_1(env):
    env.setenv("NEURONMODEL_OPERATOR_VERBOSE", "1")
    assert parse().verbose is True
    env.setenv("NEURONMODEL_OPERATOR_VERBOSE", "0")
    assert parse().verbose is False


def test_flags(env):
    args = parse("-n", "a", "--namespace", "b", "--liveness", "", "--log-format", "full", "--verbose",
                 "--peering", "p", "--priority", "7", "--runtime-image", "img:2", "--hpa-metric", "m",
                 "--workers", "2", "--watch-timeout-s", "45", "--kubeconfig", "/k",
                 "--runtime-image-repository", "r.example/rt", "--runtime-image-version", "1.2.3")
    assert args.namespaces == ["a", "b"]
    assert (args.runtime_image_repository, args.runtime_image_version) == ("r.example/rt", "1.2.3")
    assert (args.liveness, args.log_format, args.verbose, args.peering, args.priority) == ("", "full", True, "p", 7)
    assert (args.runtime_image, args.hpa_metric, args.workers, args.watch_timeout_s, args.kubeconfig) == \
        ("img:2", "m", 2, 45.0, "/k")


def test_flags_win_over_env(env):
    env.setenv("NEURONMODEL_OPERATOR_NAMESPACES", "prod")
    env.setenv("NEURONMODEL_OPERATOR_WORKERS", "3")
    env.setenv("NEURONMODEL_RUNTIME_IMAGE", "from-env:1")
    args = parse("-n", "dev", "--workers", "5", "--runtime-image", "from-flag:2")
    assert args.namespaces == ["dev"]  # not prod + dev: a flag replaces the env's list, as every other flag does
    assert (args.workers, args.runtime_image) == (5, "from-flag:2")
    assert parse().namespaces == ["prod"]  # and the env's list is intact for the next parse


# --- the runtime image of a spec without spec.image -----------------------------------------------------------

def _image(args, **spec) -> str:
    body = {"model": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct"}, "replicas": 1, **spec}
    return resolve(parse_spec(body), cli.operator_defaults(args)).image


@pytest.mark.parametrize("spec, target", [
    ({"instanceType": "inf2.xlarge"}, "runtime-nxdi-sdk2.31"),
    ({"instanceType": "trn1.32xlarge", "framework": "nxdi"}, "runtime-nxdi-sdk2.31"),
    ({"instanceType": "trn2.48xlarge"}, "runtime-nxdi-sdk2.31"),
    ({"instanceType": "inf2.48xlarge", "framework": "tnx"}, "runtime-tnx-sdk2.25"),
    ({"framework": "torch"}, "runtime-cpu"),
])
def test_image_per_family_and_framework_by_default(env, spec, target):
    assert _image(parse(), **spec) == f"ghcr.io/neuronmodel/neuronmodel-runtime:0.1.0-{target}"
    env.setenv("NEURONMODEL_RUNTIME_IMAGE_REPOSITORY", "mirror.example/nm")
    assert _image(parse("--runtime-image-version", "9.9.9"), **spec) == f"mirror.example/nm:9.9.9-{target}"


def test_runtime_image_overrides_every_family(env):
    env.setenv("NEURONMODEL_RUNTIME_IMAGE", "neuronmodel-runtime:dev")  # what the local cluster and tests set
    for spec in ({"instanceType": "inf2.xlarge"}, {"instanceType": "trn2.48xlarge"}, {"framework": "torch"}):
        assert _image(parse(), **spec) == "neuronmodel-runtime:dev"
    assert _image(parse(), framework="torch", image="mine:1") == "mine:1"  # spec.image wins over everything
    env.setenv("NEURONMODEL_RUNTIME_IMAGE", "")  # set but empty (a chart value left blank): per family
    assert _image(parse(), framework="torch").endswith(":0.1.0-runtime-cpu")


def _cache(args, **spec) -> dict:
    body = {"model": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct"}, "replicas": 1, "framework": "torch", **spec}
    target = target_from_body({"metadata": {"name": "m", "namespace": "ns", "uid": "u"}, "spec": body},
                              cli.operator_defaults(args))
    return runtime_config(target, for_compile=True)["compile_cache"] | {"job": target.resolved.compile_job}


def test_the_operator_compile_cache_fills_specs_without_one(env):
    assert _cache(parse()) == {"url": None, "policy": "IfNotCached", "sharded_weights": False, "job": False}
    env.setenv("NEURONMODEL_OPERATOR_COMPILE_CACHE_URL", "s3://team-cache/neuron")
    env.setenv("NEURONMODEL_OPERATOR_COMPILE_CACHE_POLICY", "Always")
    assert _cache(parse()) == {"url": "s3://team-cache/neuron", "policy": "Always", "sharded_weights": False,
                               "job": True}
    own = _cache(parse(), compileCache={"url": "pvc://mine/cache", "policy": "Never"})  # a spec's own cache wins
    assert own["policy"] == "Never" and own["url"].startswith("/") and own["job"] is False
    asked = _cache(parse(), compileCache={"shardedWeights": True})
    assert asked["url"] == "s3://team-cache/neuron" and asked["sharded_weights"] is True


@pytest.mark.parametrize("url", ["ftp://cache", "relative/path", "s3://"])
def test_a_bad_operator_compile_cache_is_refused_at_start(env, url, capsys):
    with pytest.raises(api.SpecError, match="--compile-cache-url .*must be s3://bucket/prefix"):
        cli.operator_defaults(parse("--compile-cache-url", url))
    with pytest.raises(SystemExit):
        parse("--compile-cache-url", "s3://ok/x", "--compile-cache-policy", "Sometimes")


#: 8 of an inf2.48xlarge's 24 NeuronCores: a pod on part of a node
PARTIAL = {"model": {"source": "hf://org/m"}, "instanceType": "inf2.48xlarge",
           "parallelism": {"tensorParallelDegree": 8}}


def _resolved(args, **spec):
    return resolve(parse_spec({**PARTIAL, **spec}), cli.operator_defaults(args))


def test_neuron_scheduler_name_flag_and_env(env):
    assert _resolved(parse()).scheduler_name == "my-scheduler"  # the Neuron Helm chart's extension
    assert _resolved(parse("--neuron-scheduler-name", "neuron-scheduler")).scheduler_name == "neuron-scheduler"
    env.setenv("NEURONMODEL_OPERATOR_NEURON_SCHEDULER_NAME", "from-env")
    assert _resolved(parse()).scheduler_name == "from-env"
    off = _resolved(parse("--neuron-scheduler-name", ""))  # turned off: none, and a warning saying why
    assert off.scheduler_name is None and "--neuron-scheduler-name" in off.warnings[0]
    env.setenv("NEURONMODEL_OPERATOR_NEURON_SCHEDULER_NAME", "")
    assert _resolved(parse()).scheduler_name is None


def test_allow_host_path_flag_and_env(env):
    node_path = {"model": {"source": "/var/lib/models/m"}}
    with pytest.raises(api.SpecError, match="^spec.model.source: .*--allow-host-path"):
        _resolved(parse(), **node_path)
    assert _resolved(parse("--allow-host-path"), **node_path).instance_type == "inf2.48xlarge"
    env.setenv("NEURONMODEL_OPERATOR_ALLOW_HOST_PATH", "true")
    assert cli.operator_defaults(parse()).allow_host_path is True
    assert cli.operator_defaults(parse("--no-allow-host-path")).allow_host_path is False  # the flag wins


def test_a_node_path_operator_cache_needs_allow_host_path(env):
    with pytest.raises(api.SpecError, match="'/var/cache/neuron' is a node path.*--allow-host-path"):
        cli.operator_defaults(parse("--compile-cache-url", "/var/cache/neuron"))
    allowed = cli.operator_defaults(parse("--compile-cache-url", "/var/cache/neuron", "--allow-host-path"))
    assert allowed.compile_cache.url == "/var/cache/neuron"


def test_operator_metrics(env):
    """/metrics: reconciles by result, their duration, and the watched NeuronModels by phase."""
    from prometheus_client import generate_latest

    from neuronmodel_operator.reconcile import Outcome

    reconciler = handlers.Reconciler(reconcile=None, executor=None)
    reconciler.models[("ns", "a")] = {"status": {"phase": "Ready"}}
    reconciler.models[("ns", "b")] = {"status": {"phase": "Ready"}}
    reconciler.models[("ns", "c")] = {}  # not reconciled yet
    for outcome in (Outcome(), Outcome(held=True), Outcome(spec_error="spec.x: bad"), Outcome(gone=True)):
        reconciler.metrics.observe(metrics.result_of(outcome), 0.2)
    text = generate_latest(reconciler.metrics.registry).decode()
    for line in ('neuronmodel_operator_models{phase="Ready"} 2.0', 'neuronmodel_operator_models{phase="Pending"} 1.0',
                 'neuronmodel_operator_models{phase="Failed"} 0.0',
                 'neuronmodel_operator_reconciles_total{result="ok"} 1.0',
                 'neuronmodel_operator_reconciles_total{result="held"} 1.0',
                 'neuronmodel_operator_reconciles_total{result="spec_error"} 1.0',
                 'neuronmodel_operator_reconciles_total{result="gone"} 1.0',
                 "neuronmodel_operator_reconcile_seconds_count 4.0"):
        assert line in text, line
    del reconciler.models[("ns", "a")]
    assert 'neuronmodel_operator_models{phase="Ready"} 1.0' in generate_latest(reconciler.metrics.registry).decode()


def test_replicas_of_one_deployment_get_different_peering_priorities(env):
    """They share their environment; kopf freezes every operator whose priority equals another's."""
    env.setenv("NEURONMODEL_OPERATOR_PEERING", "neuronmodel")
    priorities = {cli.peering_priority(parse()) for _ in range(8)}
    assert len(priorities) == 8 and all(p > 0 for p in priorities)
    assert cli.peering_priority(parse("--priority", "7")) == 7  # given: kept
    env.delenv("NEURONMODEL_OPERATOR_PEERING")
    assert cli.peering_priority(parse()) == 0  # standalone: no peering, no priority


def test_in_a_pod_the_login_is_the_service_hosts_address_not_a_dns_name(env, monkeypatch):
    """kopf's service-account login names https://kubernetes.default.svc (cluster DNS); client-go's in-cluster
    config, and ours, use KUBERNETES_SERVICE_HOST:PORT."""
    in_pod = kopf.ConnectionInfo(server="https://kubernetes.default.svc", token="t", ca_path="/ca.crt")
    monkeypatch.setattr(kopf, "login_with_service_account", lambda **kw: in_pod)
    monkeypatch.setattr(kopf, "login_with_kubeconfig", lambda **kw: pytest.fail("a pod uses its ServiceAccount"))
    env.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    env.setenv("KUBERNETES_SERVICE_PORT", "443")
    info = handlers.login(logger=logging.getLogger("test"))
    assert (info.server, info.token, info.ca_path) == ("https://10.96.0.1:443", "t", "/ca.crt")
    env.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    assert handlers.login(logger=logging.getLogger("test")).server == "https://[fd00::1]:443"
    outside = kopf.ConnectionInfo(server="https://127.0.0.1:6443", token="admin")
    monkeypatch.setattr(kopf, "login_with_service_account", lambda **kw: None)
    monkeypatch.setattr(kopf, "login_with_kubeconfig", lambda **kw: outside)
    assert handlers.login(logger=logging.getLogger("test")) is outside


def test_log_format_is_checked(env, capsys):
    with pytest.raises(SystemExit):
        parse("--log-format", "xml")


# --- kopf settings -------------------------------------------------------------------------------------------

@pytest.fixture
def settings():
    s = kopf.OperatorSettings()
    handlers.configure(s, client_timeout_s=300.0)
    return s


def test_kopf_persists_nothing_on_the_neuronmodels():
    # no create/update/resume handlers: kopf never patches progress or a last-handled spec onto a NeuronModel
    # (one write and one watch event per change); the raw event handler keys full runs on the generation
    assert list(handlers.registry._changing.get_all_handlers()) == []


def test_kopfs_own_events_are_off(settings):
    assert settings.posting.enabled is False


@pytest.mark.parametrize("client_timeout", [300.0, 95.5, 45.0, 10.0])
def test_watch_timeouts(client_timeout):
    s = kopf.OperatorSettings()
    handlers.configure(s, client_timeout_s=client_timeout)
    assert isinstance(s.watching.server_timeout, int)  # the API takes whole seconds (?timeoutSeconds=)
    assert s.watching.server_timeout > 0
    assert s.watching.client_timeout == client_timeout
    # the server ends a watch cleanly before the client gives up on it, where there is room for that
    if client_timeout > 60:
        assert s.watching.server_timeout < client_timeout


def _resource(group: str, version: str, plural: str, kind: str) -> references.Resource:
    return references.Resource(group, version, plural, kind=kind, namespaced=True)


CHILD_RESOURCES = [
    _resource("", "v1", "configmaps", "ConfigMap"), _resource("", "v1", "services", "Service"),
    _resource("", "v1", "pods", "Pod"), _resource("apps", "v1", "deployments", "Deployment"),
    _resource("batch", "v1", "jobs", "Job"), _resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget"),
    _resource("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler"),
    _resource("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet"),
    _resource("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate"),
]
NEURONMODEL = _resource(api.GROUP, api.VERSION, api.PLURAL, api.KIND)
MANAGED = f"{api.LABEL_MANAGED_BY}={api.OPERATOR_NAME}"
#: kopf 1.45 filters watches server-side; kopf 1.44 (the last for Python 3.10) has no such setting.
server_side_selectors = pytest.mark.skipif(not hasattr(kopf.OperatorSettings().watching, "label_selectors"),
                                           reason="this kopf has no server-side label selectors")


@server_side_selectors
@pytest.mark.parametrize("resource", CHILD_RESOURCES, ids=lambda r: r.plural)
def test_every_child_watch_is_filtered_server_side(settings, resource):
    assert settings.watching.label_selectors.collect(resource) == [MANAGED]


@server_side_selectors
def test_the_neuronmodel_watch_is_not_filtered(settings):
    # users' NeuronModels carry no labels of ours: a selector here would hide every one of them
    assert settings.watching.label_selectors.collect(NEURONMODEL) == []


@server_side_selectors
@pytest.mark.parametrize("resource", [
    _resource("", "v1", "secrets", "Secret"), _resource("", "v1", "events", "Event"),
    _resource("apps", "v1", "statefulsets", "StatefulSet"), _resource("example.com", "v1", "pods", "Pod"),
], ids=lambda r: f"{r.group}/{r.plural}")
def test_no_selector_leaks_onto_other_resources(settings, resource):
    assert settings.watching.label_selectors.collect(resource) == []


def test_every_child_kind_has_an_event_handler():
    watchers = list(handlers.registry._watching.get_all_handlers())
    for resource in CHILD_RESOURCES:
        assert sum(h.selector.check(resource) for h in watchers) == 1, resource
    # one raw handler for the NeuronModels: it keeps the latest copy and runs a full reconcile of a new generation
    assert [h.id for h in watchers if h.selector.check(NEURONMODEL)] == ["model"]


# --- no finalizer, ever --------------------------------------------------------------------------------------

def _body(deleting: bool) -> bodies.Body:
    metadata = {"name": "llama", "namespace": "team", "uid": "u-1", "generation": 1,
                "labels": {api.LABEL_NAME: "llama", api.LABEL_MANAGED_BY: api.OPERATOR_NAME}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return bodies.Body({"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": metadata,
                        "spec": {"model": {"source": "/m"}, "replicas": 1}})


def _common(resource: references.Resource, deleting: bool) -> dict:
    return dict(logger=logging.getLogger("test"), indices={}, memo=ephemera.Memo(), resource=resource,
                patch=patches.Patch(), body=_body(deleting))


@pytest.mark.parametrize("resource", [NEURONMODEL, *CHILD_RESOURCES], ids=lambda r: r.plural)
@pytest.mark.parametrize("deleting", [False, True])
def test_kopf_decides_no_finalizer(resource, deleting):
    """What kopf's processing loop asks (reactor/processing.py: deletion_must_be_blocked) says no, for every
    reason a NeuronModel or a child is seen."""
    for reason in causes.Reason:
        cause = causes.ChangingCause(**_common(resource, deleting), initial=reason == causes.Reason.RESUME,
                                     reason=reason)
        assert not handlers.registry._changing.requires_finalizer(cause=cause), reason
    spawning = causes.SpawningCause(**_common(resource, deleting), reset=False)
    assert not handlers.registry._spawning.requires_finalizer(cause=spawning)


def test_no_timers_daemons_or_delete_handlers():
    assert list(handlers.registry._spawning.get_all_handlers()) == []  # timers and daemons live here
    assert list(handlers.registry._changing.get_all_handlers()) == []  # create/update/resume/delete live here
    assert list(handlers.registry._webhooks.get_all_handlers()) == []
    assert list(handlers.registry._indexing.get_all_handlers()) == []


def test_the_finalizer_name_is_ours_in_case_one_is_ever_added(settings):
    assert settings.persistence.finalizer.startswith("neuronmodel.dev/")


#: Two trn1.32xlarge per group: a multi-node model
GROUP = {"model": {"source": "hf://org/m"}, "instanceType": "trn1.32xlarge",
         "parallelism": {"tensorParallelDegree": 64, "nodes": 2}}


def test_group_topology_key_flag_env_and_spec(env):
    def key(*flags, **parallelism):
        spec = {**GROUP, "parallelism": {**GROUP["parallelism"], **parallelism}}
        return resolve(parse_spec(spec), cli.operator_defaults(parse(*flags))).group_topology_key

    assert key() == "eks.amazonaws.com/nodegroup"  # EKS managed node groups, AWS's multi-node example
    assert key("--group-topology-key", "karpenter.sh/nodepool") == "karpenter.sh/nodepool"
    assert key("--group-topology-key", "") is None
    env.setenv("NEURONMODEL_OPERATOR_GROUP_TOPOLOGY_KEY", "topology.kubernetes.io/zone")
    assert key() == "topology.kubernetes.io/zone"
    assert key(groupTopologyKey="placement-group") == "placement-group"  # the spec wins
    assert key(groupTopologyKey="") is None
    one_node = {**GROUP, "parallelism": {"tensorParallelDegree": 32}}
    assert resolve(parse_spec(one_node), cli.operator_defaults(parse())).group_topology_key is None
    with pytest.raises(api.SpecError, match="--group-topology-key .*'not a key!' is not a node label key"):
        cli.operator_defaults(parse("--group-topology-key", "not a key!"))
