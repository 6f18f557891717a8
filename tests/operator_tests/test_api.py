"""api.py: what a user gets from a spec (defaults, camelCase, errors that name the field) and the fixed names."""

from __future__ import annotations

import pytest

from neuronmodel_operator import api
from neuronmodel_operator.api import SpecError, parse_spec

MINIMAL = {"model": {"source": "hf://HuggingFaceTB/SmolLM2-135M-Instruct"}}


def with_(**extra) -> dict:
    return {**MINIMAL, **extra}


# --- defaults ------------------------------------------------------------------------------------------------

def test_minimal_spec_defaults():
    spec = parse_spec(MINIMAL)
    assert spec.model.source == "hf://HuggingFaceTB/SmolLM2-135M-Instruct"
    assert spec.model.revision is None and spec.model.dtype == "auto" and spec.model.parameters is None
    assert spec.framework == "auto"
    assert (spec.parallelism.tensor_parallel_degree, spec.parallelism.nodes) == (1, 1)
    assert spec.parallelism.logical_core_config is None
    assert (spec.batching.max_batch_size, spec.batching.max_context_length, spec.batching.max_seq_len) == \
        (8, 1024, 2048)
    assert spec.sampling.on_device is True
    assert spec.speculation.mode == "none" and spec.speculation.draft_model is None
    assert spec.compile_cache.policy == "IfNotCached" and spec.compile_cache.url is None
    assert spec.neuron_resource == "neuroncore"
    assert (spec.rollout.max_unavailable, spec.rollout.max_surge) == (None, None)  # by nodes: placement.rollout
    assert spec.server.port == 8000 and spec.server.api_key_secret_ref is None
    assert spec.replicas is None and spec.autoscaling is None
    assert spec.instance_type is None and spec.image is None
    assert spec.node_selector == {} and spec.tolerations == []
    assert spec.replica_count() == 1


def test_defaults_as_the_crd_shows_them():
    """The camelCase dump (what crdgen and served-spec see) carries the same defaults."""
    dumped = parse_spec(MINIMAL).model_dump(mode="json", by_alias=True)
    assert dumped["batching"] == {"maxBatchSize": 8, "maxContextLength": 1024, "maxSeqLen": 2048}
    assert dumped["parallelism"]["tensorParallelDegree"] == 1
    assert dumped["sampling"]["onDevice"] is True
    assert dumped["compileCache"]["policy"] == "IfNotCached"
    assert dumped["neuronResource"] == "neuroncore"
    assert dumped["rollout"] == {"maxUnavailable": None, "maxSurge": None}


def test_camel_case_keys():
    spec = parse_spec(with_(
        model={"source": "s3://bucket/llama", "servedModelName": "llama", "tokenSecretRef": {"name": "hf"},
               "dtype": "bfloat16", "parameters": "8B"},
        instanceType="inf2.48xlarge", neuronResource="neuron", schedulerName="my-scheduler",
        serviceAccountName="irsa", nodeSelector={"a": "b"},
        parallelism={"tensorParallelDegree": 8, "nodes": 1},
        batching={"maxBatchSize": 4, "maxContextLength": 512, "maxSeqLen": 1024},
        sampling={"onDevice": False, "globalTopK": 50},
        speculation={"mode": "promptLookup", "promptLookupMin": 1, "promptLookupMax": 3,
                     "numSpeculativeTokens": 5},
        compileCache={"url": "s3://cache/x", "policy": "Always"},
        autoscaling={"minReplicas": 2, "maxReplicas": 5, "targetAverageValue": "3"},
        rollout={"maxUnavailable": 1, "maxSurge": "25%"},
        server={"port": 9000, "apiKeySecretRef": {"name": "key", "key": "k"}},
        tolerations=[{"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}],
    ))
    assert spec.model.served_model_name == "llama" and spec.model.token_secret_ref.name == "hf"
    assert spec.model.token_secret_ref.key == "token"  # the default key
    assert spec.instance_type == "inf2.48xlarge" and spec.neuron_resource == "neuron"
    assert spec.scheduler_name == "my-scheduler" and spec.service_account_name == "irsa"
    assert spec.parallelism.tensor_parallel_degree == 8
    assert (spec.batching.max_batch_size, spec.batching.max_context_length, spec.batching.max_seq_len) == \
        (4, 512, 1024)
    assert spec.sampling.on_device is False and spec.sampling.global_top_k == 50
    assert spec.speculation.prompt_lookup_max == 3 and spec.speculation.num_speculative_tokens == 5
    assert spec.compile_cache.url == "s3://cache/x" and spec.compile_cache.policy == "Always"
    assert spec.autoscaling.min_replicas == 2 and spec.autoscaling.max_replicas == 5
    assert spec.rollout.max_surge == "25%" and spec.rollout.max_unavailable == 1
    assert spec.server.port == 9000 and spec.server.api_key_secret_ref.key == "k"
    assert spec.tolerations[0].toleration_seconds == 5


def test_parse_does_not_mutate_the_input():
    body = with_(replicas=2, batching={"maxBatchSize": 4})
    before = repr(body)
    parse_spec(body)
    assert repr(body) == before


# --- errors --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, where", [
    (with_(replica=1), "spec.replica"),
    (with_(tensorParallelDegree=2), "spec.tensorParallelDegree"),
    ({"model": {"source": "/m", "revison": "main"}}, "spec.model.revison"),
    (with_(batching={"maxBatch": 4}), "spec.batching.maxBatch"),
    (with_(parallelism={"tp": 2}), "spec.parallelism.tp"),
    (with_(compileCache={"URL": "s3://x/y"}), "spec.compileCache.URL"),
    (with_(tolerations=[{"kee": "x"}]), "spec.tolerations.0.kee"),
])
def test_unknown_field_is_named(spec, where):
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    assert f"{where}: unknown field" in str(err.value)


def test_every_problem_is_named_at_once():
    with pytest.raises(SpecError) as err:
        parse_spec({"model": {"source": "/m", "extra": 1}, "replicas": "three", "bogus": True})
    text = str(err.value)
    for where in ("spec.model.extra: unknown field", "spec.replicas:", "spec.bogus: unknown field"):
        assert where in text


@pytest.mark.parametrize("spec, where, words", [
    (with_(replicas="three"), "spec.replicas", "integer"),
    (with_(parallelism={"tensorParallelDegree": "abc"}), "spec.parallelism.tensorParallelDegree", "integer"),
    (with_(sampling={"onDevice": "maybe"}), "spec.sampling.onDevice", "bool"),
    (with_(nodeSelector=["a"]), "spec.nodeSelector", "dict"),
    (with_(framework="vllm"), "spec.framework", "'torch'"),
    (with_(model={"source": "/m", "dtype": "int4"}), "spec.model.dtype", "bfloat16"),
    (with_(compileCache={"policy": "Sometimes"}), "spec.compileCache.policy", "IfNotCached"),
    (with_(neuronResource="neurondevice"), "spec.neuronResource", "neuroncore"),
    (with_(batching={"maxBatchSize": 0}), "spec.batching.maxBatchSize", "greater than or equal to 1"),
    (with_(server={"port": 70000}), "spec.server.port", "65535"),
    (with_(model={"source": "/m", "parameters": "lots"}), "spec.model.parameters", "pattern"),
    ({"replicas": 1}, "spec.model", "required"),
])
def test_wrong_type_is_named(spec, where, words):
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    text = str(err.value)
    assert text.startswith(f"{where}:") or f"; {where}:" in text, text
    assert words in text, text


def test_spec_error_is_a_value_error():
    assert issubclass(SpecError, ValueError)


# --- parameter_count and replica_count ----------------------------------------------------------------------

@pytest.mark.parametrize("text, count", [
    ("8B", 8e9), ("135M", 135e6), ("70B", 70e9), ("1.5B", 1.5e9), ("405B", 405e9), ("1T", 1e12), ("500K", 5e5),
])
def test_parameter_count(text, count):
    assert parse_spec({"model": {"source": "/m", "parameters": text}}).model.parameter_count() == \
        pytest.approx(count)


def test_parameter_count_unset():
    assert parse_spec(MINIMAL).model.parameter_count() is None


@pytest.mark.parametrize("extra, count", [
    ({"replicas": 3}, 3),
    ({"replicas": 0}, 0),  # scaled to zero is a count, not "unset"
    ({"autoscaling": {"minReplicas": 2, "maxReplicas": 6}}, 2),
    ({"autoscaling": {"maxReplicas": 6}}, 1),  # minReplicas defaults to 1
    ({}, 1),
])
def test_replica_count(extra, count):
    assert parse_spec(with_(**extra)).replica_count() == count


# --- names fixed by DESIGN.md --------------------------------------------------------------------------------

def test_names_are_as_design_md_fixes_them():
    assert api.GROUP == "neuronmodel.dev"
    assert api.VERSION == "v1alpha1"
    assert api.API_VERSION == "neuronmodel.dev/v1alpha1"
    assert api.KIND == "NeuronModel"
    assert api.PLURAL == "neuronmodels"
    assert api.SINGULAR == "neuronmodel"
    assert tuple(api.SHORT_NAMES) == ("nm",)
    assert api.CRD_NAME == "neuronmodels.neuronmodel.dev"


def test_labels_and_annotations_are_under_our_prefix_or_the_standard_ones():
    assert api.LABEL_NAME == "neuronmodel.dev/name"
    assert api.LABEL_MANAGED_BY == "app.kubernetes.io/managed-by"
    assert api.LABEL_COMPONENT == "app.kubernetes.io/component"
    assert api.LABEL_APP_NAME == "app.kubernetes.io/name"
    assert api.LABEL_INSTANCE == "app.kubernetes.io/instance"
    for annotation in (api.ANNOTATION_COMPILE_KEY, api.ANNOTATION_SERVED, api.ANNOTATION_SERVED_SPEC):
        assert annotation.startswith("neuronmodel.dev/")
    assert api.FIELD_MANAGER == "neuronmodel-operator"
    assert api.ENV_RUNTIME_IMAGE == "NEURONMODEL_RUNTIME_IMAGE"
    assert api.ENV_HPA_METRIC == "NEURONMODEL_HPA_METRIC"
    assert api.DEFAULT_HPA_METRIC == "vllm:num_requests_waiting"


def test_status_round_trips_camel_case():
    status = api.NeuronModelStatus.model_validate({
        "phase": "Ready", "readyReplicas": 1, "observedGeneration": 2,
        "conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        "resolved": {"neuronCoresPerPod": 2, "compileKey": "k"}})
    assert status.ready_replicas == 1 and status.resolved.neuron_cores_per_pod == 2
    assert status.conditions[0].last_transition_time == "2026-01-01T00:00:00Z"
    with pytest.raises(Exception):
        api.NeuronModelStatus.model_validate({"phase": "Running"})
