"""A table of NeuronModel specs around the rules the CRD and the runtime share, with the verdict of each side.

Each case says which spec field a refusal must name (None: accepted). `contract_verdict` is the operator and runtime
side: the spec parsed as the operator parses it, then the RuntimeConfig the operator would write, built and
validated by the runtime's own model and source grammar (builders/configmap.runtime_config_for). When the operator's
typed spec refuses a value first (a bound or a choice), the runtime's own field must refuse the same value too.
test_contract.py checks this side; tests/integration/test_contract_admission.py checks the API server's verdict (the CRD's
OpenAPI bounds and CEL rules) on the same table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from pydantic import ValidationError

from neuronmodel_operator import api
from neuronmodel_operator.builders.configmap import runtime_config_for
from neuronmodel_runtime.config import RuntimeConfig
from operator_tests.merge_patch import merge_patch

#: The reference runner, no instance type: none of the CRD's placement rules apply.
BASE = {"model": {"source": "hf://org/model"}, "framework": "torch", "replicas": 1}
_DRAFT = {"source": "hf://org/draft"}


@dataclass(frozen=True)
class Case:
    id: str
    change: dict[str, Any]  # merged into BASE (None removes a key)
    refused: Optional[str] = None  # the spec field (dotted, camelCase, under spec) both sides name; None: accepted

    @property
    def spec(self) -> dict[str, Any]:
        return merge_patch(BASE, self.change)


def _source(url: str) -> dict:
    return {"model": {"source": url}}


def _speculation(**fields: Any) -> dict:
    return {"speculation": fields}


CASES = [
    # --- the source grammar (config/sources.py) ---
    Case("hf", _source("hf://HuggingFaceTB/SmolLM2-135M-Instruct")),
    Case("hf-trailing-slash", _source("hf://org/model/")),
    Case("s3-bucket", _source("s3://my-bucket")),
    Case("s3-prefix", _source("s3://my.bucket-1/llama/3.1-8b/")),
    Case("pvc-claim", _source("pvc://models")),
    Case("pvc-dotted-claim-and-path", _source("pvc://models.v1/llama/8b")),
    Case("path", _source("/opt/models//tiny/")),
    Case("path-with-dotdot", _source("/opt/models/../tiny")),
    Case("ftp", _source("ftp://host/model"), "model.source"),
    Case("hf-without-org", _source("hf://noslash"), "model.source"),
    Case("hf-name-starts-with-dash", _source("hf://org/-model"), "model.source"),
    Case("hf-extra-part", _source("hf://org/name/extra"), "model.source"),
    Case("s3-bad-bucket", _source("s3://Bad_Bucket/x"), "model.source"),
    Case("s3-short-bucket", _source("s3://ab/x"), "model.source"),
    Case("s3-dotdot", _source("s3://bucket/a/../b"), "model.source"),
    Case("s3-empty-part", _source("s3://bucket/a//b"), "model.source"),
    Case("pvc-dot-part", _source("pvc://claim/./x"), "model.source"),
    Case("pvc-uppercase-claim", _source("pvc://Claim/x"), "model.source"),
    Case("relative-path", _source("models/tiny"), "model.source"),
    Case("path-with-space", _source("/opt/my models"), "model.source"),
    Case("empty", _source(""), "model.source"),
    Case("draft-source-http", _speculation(mode="draft", draftModel={"source": "http://example.com/d"}),
         "speculation.draftModel.source"),
    Case("draft-source-dotdot", _speculation(mode="draft", draftModel={"source": "pvc://c/../x"}),
         "speculation.draftModel.source"),
    Case("cache-s3", {"compileCache": {"url": "s3://cache-bucket/prod"}}),
    Case("cache-pvc", {"compileCache": {"url": "pvc://cache/llama"}}),
    Case("cache-path", {"compileCache": {"url": "/var/cache/neuron"}}),
    Case("cache-hf", {"compileCache": {"url": "hf://org/cache"}}, "compileCache.url"),
    Case("cache-dotdot", {"compileCache": {"url": "s3://cache-bucket/../x"}}, "compileCache.url"),
    # --- speculation (config/rules.py DRAFT_MODEL, PROMPT_LOOKUP; bounds) ---
    Case("draft", _speculation(mode="draft", draftModel=_DRAFT)),
    Case("eagle", _speculation(mode="eagle", draftModel={"source": "pvc://models/eagle"})),
    Case("prompt-lookup-min-equals-max", _speculation(mode="promptLookup", promptLookupMin=3, promptLookupMax=3)),
    Case("sixteen-tokens", _speculation(mode="promptLookup", numSpeculativeTokens=16)),
    Case("draft-without-draft-model", _speculation(mode="draft"), "speculation.draftModel"),
    Case("eagle-without-draft-model", _speculation(mode="eagle"), "speculation.draftModel"),
    Case("none-with-draft-model", _speculation(draftModel=_DRAFT), "speculation.draftModel"),
    Case("prompt-lookup-with-draft-model", _speculation(mode="promptLookup", draftModel=_DRAFT),
         "speculation.draftModel"),
    Case("prompt-lookup-min-above-max", _speculation(mode="promptLookup", promptLookupMin=5, promptLookupMax=3),
         "speculation.promptLookupMin"),
    Case("min-above-max-without-lookup", _speculation(promptLookupMin=5), "speculation.promptLookupMin"),
    Case("seventeen-tokens", _speculation(mode="promptLookup", numSpeculativeTokens=17),
         "speculation.numSpeculativeTokens"),
    Case("zero-tokens", _speculation(numSpeculativeTokens=0), "speculation.numSpeculativeTokens"),
    Case("lookup-max-65", _speculation(promptLookupMax=65), "speculation.promptLookupMax"),
    Case("mode-medusa", _speculation(mode="medusa"), "speculation.mode"),
    # --- parallelism (NODES), batching (CONTEXT_LENGTH) and the other copied fields' bounds and choices ---
    Case("two-nodes-tp8", {"parallelism": {"tensorParallelDegree": 8, "nodes": 2}}),
    Case("nodes-not-dividing-tp", {"parallelism": {"tensorParallelDegree": 32, "nodes": 3}}, "parallelism.nodes"),
    Case("more-nodes-than-tp", {"parallelism": {"tensorParallelDegree": 2, "nodes": 4}}, "parallelism.nodes"),
    Case("zero-nodes", {"parallelism": {"nodes": 0}}, "parallelism.nodes"),
    Case("tp-1025", {"parallelism": {"tensorParallelDegree": 1025}}, "parallelism.tensorParallelDegree"),
    Case("context-equals-sequence", {"batching": {"maxContextLength": 2048, "maxSeqLen": 2048}}),
    Case("context-longer-than-sequence", {"batching": {"maxContextLength": 4096, "maxSeqLen": 2048}},
         "batching.maxContextLength"),
    Case("sequence-of-one", {"batching": {"maxContextLength": 1, "maxSeqLen": 1}}, "batching.maxSeqLen"),
    Case("sequence-too-long", {"batching": {"maxSeqLen": 1048577}}, "batching.maxSeqLen"),
    Case("batch-1025", {"batching": {"maxBatchSize": 1025}}, "batching.maxBatchSize"),
    Case("top-k-65537-on-the-host", {"sampling": {"onDevice": False, "globalTopK": 65537}}, "sampling.globalTopK"),
    Case("dtype-int8", {"model": {"dtype": "int8"}}, "model.dtype"),
    Case("framework-vllm", {"framework": "vllm"}, "framework"),
    Case("cache-policy-sometimes", {"compileCache": {"policy": "Sometimes"}}, "compileCache.policy"),
    Case("port-0", {"server": {"port": 0}}, "server.port"),
]


def _spec_value(spec: dict, field: str) -> Any:
    value: Any = spec
    for key in field.split("."):
        value = value[key]
    return value


def _runtime_refuses(runtime_path: str, value: Any) -> bool:
    """The runtime's own field at `runtime_path` refuses `value` (everything else at its default)."""
    data: dict[str, Any] = {}
    *parents, leaf = runtime_path.split(".")
    section = data
    for key in parents:
        section = section.setdefault(key, {})
    section[leaf] = value
    try:
        RuntimeConfig.model_validate(data)
    except ValidationError as exc:
        return any(".".join(map(str, err["loc"])) == runtime_path for err in exc.errors())
    return False


def _named(exc: api.SpecError) -> str:
    match = re.match(r"spec\.([\w.]+):", str(exc))
    assert match, f"a refusal that names no field: {exc}"
    return match.group(1)


def contract_verdict(spec: dict[str, Any]) -> Optional[str]:
    """None when the operator and the runtime accept `spec`; else the spec field their refusal names.

    Raises:
        AssertionError: the operator's typed spec refuses a value the runtime's own field would take.
    """
    try:
        parsed = api.parse_spec(spec)
    except api.SpecError as exc:
        field = _named(exc)
        runtime_path = {spec_path: path for path, spec_path in api.RUNTIME_FIELDS.items()}.get(field)
        if runtime_path is not None:
            value = _spec_value(spec, field)
            assert _runtime_refuses(runtime_path, value), f"RuntimeConfig {runtime_path} takes {value!r}: {exc}"
        return field
    try:
        runtime_config_for(parsed, "contract")
    except api.SpecError as exc:
        return _named(exc)
    return None
