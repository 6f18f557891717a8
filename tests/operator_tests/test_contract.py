"""The operator<->runtime contract without an API server: the RuntimeConfig the operator would write for each spec
of contract_table.py is refused exactly where the table says (and by the field it says), the CRD's CEL rules and
source patterns are the ones the runtime's contract writes, and every spec field the RuntimeConfig copies has the
runtime field's default, bounds and choices. tests/integration/test_contract_admission.py runs the same table against the
API server."""

from __future__ import annotations

import re
from typing import Any, Literal, get_args, get_origin

import pytest
from pydantic import BaseModel
from pydantic.alias_generators import to_snake
from pydantic.fields import FieldInfo

from neuronmodel_operator import api, builders, crdgen
from neuronmodel_runtime.config import RuntimeConfig, env, rules, sources
from neuronmodel_runtime.config.load import SETTINGS
from operator_tests import golden
from operator_tests.contract_table import CASES, contract_verdict


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_operator_and_the_runtime_give_the_tables_verdict(case):
    assert contract_verdict(case.spec) == case.refused


def test_the_table_covers_every_shared_rule_both_ways():
    refused = {case.refused for case in CASES}
    for rule in rules.RULES:
        named = {api.RUNTIME_FIELDS[path] for path in vars(rule).values() if path in api.RUNTIME_FIELDS}
        assert refused & named, f"no case breaks {rule}"
    assert {"model.source", "speculation.draftModel.source", "compileCache.url"} <= refused
    assert sum(case.refused is None for case in CASES) >= 15


def _validations(schema: Any) -> list[dict]:
    """Every x-kubernetes-validations entry anywhere in `schema`."""
    found = []
    if isinstance(schema, dict):
        found += schema.get("x-kubernetes-validations", [])
        for value in schema.values():
            found += _validations(value)
    elif isinstance(schema, list):
        for value in schema:
            found += _validations(value)
    return found


def test_the_crds_cel_rules_are_written_from_the_runtimes_rules_and_grammar():
    validations = _validations(crdgen.crd())
    pairs = {(v["rule"], v["message"]) for v in validations}
    for rule in rules.RULES:
        assert rule.cel(api.RUNTIME_FIELDS.__getitem__) in pairs
    patterns = {m.group(1) for v in validations if (m := re.fullmatch(r"self\.matches\(r'(.*)'\)", v["rule"]))}
    assert patterns == {sources.SOURCE_PATTERN, sources.CACHE_URL_PATTERN}


def _spec_field(path: str) -> FieldInfo:
    model: type[BaseModel] = api.NeuronModelSpec
    *parents, leaf = (to_snake(key) for key in path.split("."))
    for key in parents:
        model = model.model_fields[key].annotation
    return model.model_fields[leaf]


def _bounds(info: FieldInfo) -> dict[str, Any]:
    return {name: getattr(m, name) for m in info.metadata for name in ("ge", "gt", "le", "lt") if hasattr(m, name)}


#: RuntimeConfig fields whose value the operator derives from the spec's rather than copies.
DERIVED = {"model", "speculation.draft_model", "compile_cache.url"}


@pytest.mark.parametrize("path", sorted(set(api.RUNTIME_FIELDS) - DERIVED))
def test_a_copied_field_has_the_runtimes_default_bounds_and_choices(path):
    spec, runtime = _spec_field(api.RUNTIME_FIELDS[path]), SETTINGS[path].field
    assert _bounds(spec) == _bounds(runtime)
    assert spec.get_default(call_default_factory=True) == runtime.get_default(call_default_factory=True)
    if get_origin(runtime.annotation) is Literal:
        assert get_args(spec.annotation) == get_args(runtime.annotation)


def test_every_field_the_operator_writes_is_the_operators_own_or_named_for_its_errors():
    written = builders.runtime_config(golden.target("trn1-s3-cache"))  # with neuron_config_overrides
    sections = {key for key, info in RuntimeConfig.model_fields.items()
                if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)}
    leaves = {f"{key}.{sub}" for key in sections for sub in written[key]} | (written.keys() - sections)
    assert leaves - {"compile", "server.host", "server.drain_timeout_s"} == set(api.RUNTIME_FIELDS)


def test_the_pods_environment_names_are_the_runtimes():
    assert SETTINGS["server.api_key"].env == env.API_KEY
    assert api.ENV_INSTANCE_FAMILY == env.INSTANCE_FAMILY
    assert all(name.startswith(env.ENV_PREFIX) for name in (env.API_KEY, env.INSTANCE_FAMILY, env.CACHE))
