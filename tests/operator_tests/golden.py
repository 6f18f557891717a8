"""Golden manifests of the builders: CASES, and `python tests/operator_tests/golden.py` (`make generate`) to
rewrite tests/operator_tests/golden/<case>/<kind>-<name>.yaml for every child of every case (stale files are
deleted). test_builders_golden.py fails when the committed files differ from what the builders make now.

Every case's body carries labels such as Helm's: the tests check they never reach a child.
"""

from __future__ import annotations

import copy
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml

from neuronmodel_operator import api, builders
from neuronmodel_operator.resolve import OperatorDefaults

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
#: The operator's defaults: each case's image chosen per instance family and framework (images.py), at a fixed
#: version so the files do not change with the package's.
DEFAULTS = OperatorDefaults(hpa_metric=api.DEFAULT_HPA_METRIC, image_version="0.1.0", allow_host_path=True)
#: Labels a Helm release or Argo CD puts on the NeuronModel; never copied onto children.
OWNER_LABELS = {"app.kubernetes.io/managed-by": "Helm", "helm.sh/chart": "llm-serving-1.2.0",
                "app.kubernetes.io/instance": "release-a", "team": "ml-platform"}


def _body(name: str, spec: dict[str, Any], namespace: str = "models") -> dict[str, Any]:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, name)),
                         "labels": dict(OWNER_LABELS), "annotations": {"note": "owner annotations stay too"}},
            "spec": spec}


CASES: dict[str, dict[str, Any]] = {
    # The reference runner on a CPU node, the model a node path (the integration test runs this pod's command).
    "tiny-torch": _body("tiny", {
        "model": {"source": "/opt/neuronmodel/models/tiny"}, "framework": "torch",
        "batching": {"maxBatchSize": 4, "maxContextLength": 512, "maxSeqLen": 1024},
        "replicas": 1, "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}}),
    # inf2 with a gated hf:// model (token Secret) and an API key Secret; compiles in the pod (no cache).
    "inf2-hf": _body("llama-1b", {
        "model": {"source": "hf://meta-llama/Llama-3.2-1B-Instruct",
                  "revision": "9213176726f574b556790deb65791e0c5aa438b6", "tokenSecretRef": {"name": "hf-token"},
                  "servedModelName": "llama-3.2-1b"},
        "framework": "nxdi", "instanceType": "inf2.xlarge", "parallelism": {"tensorParallelDegree": 2},
        "server": {"apiKeySecretRef": {"name": "llama-api-key", "key": "api-key"}}, "replicas": 1}),
    # trn1 with an s3:// model and an s3:// compile cache: a compile Job; s3 through IRSA; NeuronConfig overrides
    # (in the RuntimeConfig of the Job and of the pods).
    "trn1-s3-cache": _body("llama-8b", {
        "model": {"source": "s3://acme-models/llama-3.1-8b-instruct", "dtype": "bfloat16"},
        "instanceType": "trn1.32xlarge", "parallelism": {"tensorParallelDegree": 8},
        "batching": {"maxBatchSize": 16, "maxContextLength": 4096, "maxSeqLen": 8192},
        "neuronConfigOverrides": {"fused_qkv": True, "sequence_parallel_enabled": True},
        "compileCache": {"url": "s3://acme-neuron-cache/prod", "policy": "IfNotCached"},
        "serviceAccountName": "neuronmodel-s3", "replicas": 1}),
    # trn2 at logical NeuronCore config 1, autoscaled (an HPA; no replicas on the Deployment), the Neuron scheduler.
    "trn2-lnc-autoscale": _body("llama-70b", {
        "model": {"source": "hf://meta-llama/Llama-3.3-70B-Instruct",
                  "tokenSecretRef": {"name": "hf-token", "key": "hf"}},
        "instanceType": "trn2.48xlarge", "parallelism": {"tensorParallelDegree": 32, "logicalCoreConfig": 1},
        "compileCache": {"url": "s3://acme-neuron-cache/prod", "policy": "Always"},
        "autoscaling": {"minReplicas": 1, "maxReplicas": 4, "targetAverageValue": "8"},
        "schedulerName": "my-scheduler", "nodeSelector": {"karpenter.sh/capacity-type": "on-demand"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}]}),
    # Draft-model speculation, both models from hf:// (one token for both).
    "draft-hf": _body("llama-8b-spec", {
        "model": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct", "tokenSecretRef": {"name": "hf-token"}},
        "instanceType": "inf2.48xlarge", "parallelism": {"tensorParallelDegree": 8},
        "speculation": {"mode": "draft", "draftModel": {"source": "hf://meta-llama/Llama-3.2-1B-Instruct",
                                                         "revision": "main"},
                        "numSpeculativeTokens": 5},
        "replicas": 1}),
    # Prompt lookup (no draft), a pvc:// model, a node-path cache read with policy Never (no Job).
    "prompt-lookup": _body("qwen-7b", {
        "model": {"source": "pvc://model-store/qwen2.5-7b-instruct"}, "instanceType": "inf2.8xlarge",
        "parallelism": {"tensorParallelDegree": 2},
        "speculation": {"mode": "promptLookup", "promptLookupMin": 2, "promptLookupMax": 5},
        "compileCache": {"url": "/var/lib/neuronmodel/compile-cache", "policy": "Never"}, "replicas": 1}),
    # Two trn1.32xlarge nodes per replica (a LeaderWorkerSet), pvc:// model and pvc:// compile cache, 2 groups.
    "multinode-lws": _body("llama-405b", {
        "model": {"source": "pvc://model-store/llama-3.1-405b-instruct"}, "instanceType": "trn1.32xlarge",
        "parallelism": {"tensorParallelDegree": 64, "nodes": 2},
        "compileCache": {"url": "pvc://neuron-cache/llama-405b"}, "replicas": 2,
        "rollout": {"maxUnavailable": 1, "maxSurge": 0},
        "resources": {"requests": {"cpu": "100", "memory": "400Gi"}}}),
    # Whole Neuron devices (aws.amazon.com/neuron) instead of NeuronCores.
    "whole-device": _body("mistral-7b", {
        "model": {"source": "hf://mistralai/Mistral-7B-Instruct-v0.3"}, "instanceType": "inf2.24xlarge",
        "parallelism": {"tensorParallelDegree": 4}, "neuronResource": "neuron", "replicas": 1}),
    # The Neuron DRA driver instead of the device plugin: a ResourceClaimTemplate of 4 connected trn2 devices, LNC 2.
    "trn2-dra": _body("qwen-32b", {
        "model": {"source": "hf://Qwen/Qwen2.5-32B-Instruct", "parameters": "32B"}, "instanceType": "trn2.48xlarge",
        "parallelism": {"tensorParallelDegree": 16}, "deviceAllocation": "dra", "replicas": 2}),
    # Three replicas: a PodDisruptionBudget; a rollout that trades one replica for no surge.
    "replicas-3": _body("smollm", {
        "model": {"source": "hf://HuggingFaceTB/SmolLM2-135M-Instruct"}, "instanceType": "inf2.xlarge",
        "replicas": 3, "rollout": {"maxUnavailable": 1, "maxSurge": 0}, "server": {"port": 9000}}),
    # Engine vllm, the native line on trn2.48xlarge (LNC 2), TP 8: an EAGLE3 draft (both from hf://, one token), an
    # API key, a served name; no ConfigMap; an s3:// compile cache: a compile Job (vLLM as a sidecar, store-artifacts)
    # and serving pods that fetch the entry and never compile.
    "vllm-trn2-eagle": _body("llama-8b-vllm", {
        "model": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct",
                  "revision": "0e9e39f249a16976918f6564b8830bc894c89659", "tokenSecretRef": {"name": "hf-token"},
                  "servedModelName": "llama-3.1-8b", "parameters": "8B"},
        "engine": "vllm", "instanceType": "trn2.48xlarge", "parallelism": {"tensorParallelDegree": 8},
        "batching": {"maxBatchSize": 4, "maxContextLength": 1024, "maxSeqLen": 2048},
        "speculation": {"mode": "eagle", "numSpeculativeTokens": 3,
                        "draftModel": {"source": "hf://RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3"}},
        "server": {"apiKeySecretRef": {"name": "llama-api-key", "key": "api-key"}},
        "compileCache": {"url": "s3://acme-neuron-cache/vllm", "policy": "IfNotCached"},
        "serviceAccountName": "neuronmodel-s3", "replicas": 1}),
    # Engine vllm on one trn2 chip (trn2.3xlarge, TP 4 at LNC 2), a pvc:// model, host sampling (no async
    # scheduling), the native plugin's own neuron_config keys, two replicas (a PDB).
    "vllm-trn2-3xlarge": _body("qwen-4b-vllm", {
        "model": {"source": "pvc://model-store/qwen3-4b", "dtype": "bfloat16"}, "engine": "vllm",
        "instanceType": "trn2.3xlarge", "parallelism": {"tensorParallelDegree": 4},
        "batching": {"maxBatchSize": 8, "maxContextLength": 2048, "maxSeqLen": 4096},
        "sampling": {"onDevice": False}, "neuronConfigOverrides": {"num_seqs_buckets": [1, 4, 8]},
        "replicas": 2}),
    # Engine vllm, the NxDI line on inf2.48xlarge, TP 8: NxDI keywords, a smaller global top-k, context buckets; a
    # pvc:// compile cache under policy Never: no Job, the pods fetch the entry into NEURON_COMPILED_ARTIFACTS.
    "vllm-inf2-nxdi": _body("llama-8b-inf2", {
        "model": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct", "tokenSecretRef": {"name": "hf-token"}},
        "engine": "vllm", "instanceType": "inf2.48xlarge", "parallelism": {"tensorParallelDegree": 8},
        "batching": {"maxBatchSize": 4, "maxContextLength": 700, "maxSeqLen": 2048},
        "sampling": {"globalTopK": 64}, "neuronConfigOverrides": {"fused_qkv": True},
        "compileCache": {"url": "pvc://neuron-cache/vllm", "policy": "Never"}, "replicas": 1}),
    # Engine vllm, the NxDI line on trn1.32xlarge, autoscaled (an HPA on vllm:num_requests_waiting, which vLLM
    # exports itself), an s3:// model and an EAGLE draft (method eagle).
    "vllm-trn1-autoscale": _body("llama-70b-vllm", {
        "model": {"source": "s3://acme-models/llama-3.3-70b-instruct", "parameters": "70B"}, "engine": "vllm",
        "instanceType": "trn1.32xlarge", "parallelism": {"tensorParallelDegree": 32},
        "speculation": {"mode": "eagle", "draftModel": {"source": "s3://acme-models/llama-3.3-70b-eagle"}},
        "autoscaling": {"minReplicas": 1, "maxReplicas": 3}, "serviceAccountName": "neuronmodel-s3"}),
}


def target(case: str, **spec_changes: Any) -> builders.Target:
    """The Target of CASES[case], with top-level spec fields replaced by `spec_changes` (None deletes one)."""
    body = copy.deepcopy(CASES[case])
    for key, value in spec_changes.items():
        if value is None:
            body["spec"].pop(key, None)
        else:
            body["spec"][key] = value
    return builders.target_from_body(body, DEFAULTS)


def children(case: str) -> list[dict[str, Any]]:
    t = target(case)
    return builders.serving_children(t) + builders.compile_children(t)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (config.json) as literal blocks; long lines never folded."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(manifest: dict[str, Any]) -> str:
    return yaml.dump(manifest, Dumper=_Dumper, sort_keys=False, width=10_000, allow_unicode=True)


def file_name(manifest: dict[str, Any]) -> str:
    return f"{manifest['kind'].lower()}-{manifest['metadata']['name']}.yaml"


def expected() -> dict[str, str]:
    """Relative path under GOLDEN_DIR -> file text, for every child of every case."""
    files = {}
    for case in CASES:
        for manifest in children(case):
            files[f"{case}/{file_name(manifest)}"] = render(manifest)
    return files


def committed() -> dict[str, str]:
    if not GOLDEN_DIR.exists():
        return {}
    return {p.relative_to(GOLDEN_DIR).as_posix(): p.read_text() for p in sorted(GOLDEN_DIR.rglob("*.yaml"))}


def write() -> list[str]:
    """Rewrite the golden files; returns what changed (written or deleted)."""
    want, have = expected(), committed()
    changed = []
    for rel in sorted(set(have) - set(want)):
        (GOLDEN_DIR / rel).unlink()
        changed.append(f"deleted {rel}")
    for rel, text in sorted(want.items()):
        if have.get(rel) != text:
            path = GOLDEN_DIR / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(f"wrote {rel}")
    for folder in sorted(GOLDEN_DIR.iterdir()) if GOLDEN_DIR.exists() else []:
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    return changed


if __name__ == "__main__":
    changes = write()
    print("\n".join(changes) if changes else "golden manifests up to date", file=sys.stderr)
