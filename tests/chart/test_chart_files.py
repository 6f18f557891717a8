"""The chart's copies and metadata agree with the repository: the CRD, the rules file, the version; every value is
documented and the schema closes every object."""

from __future__ import annotations

import json
import re

import yaml

import chart_sync

CHART = chart_sync.CHART
ROOT = chart_sync.ROOT


def test_copies_equal_their_canonical_files():
    for source, copy in chart_sync.COPIES.items():
        assert copy.read_text() == source.read_text(), f"{copy.relative_to(ROOT)} differs from " \
            f"{source.relative_to(ROOT)}: run python scripts/chart_sync.py"


def test_chart_crds_are_the_canonical_crd_and_kopfs_peering_crds():
    names = sorted(path.name for path in (CHART / "crds").iterdir())
    assert names == ["kopf-peerings.kopf.dev.yaml", "neuronmodels.neuronmodel.dev.yaml"]
    peering = [doc["metadata"]["name"] for doc in yaml.safe_load_all((CHART / "crds" / names[0]).read_text())]
    assert peering == ["clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"]


def test_app_version_is_the_package_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE).group(1)
    assert chart["appVersion"] == version
    assert chart["version"] == version
    assert chart["kubeVersion"]


def leaf_paths(value, prefix=""):
    """Dotted paths of the values a user sets: maps are walked into unless empty, lists are leaves."""
    if isinstance(value, dict) and value and prefix not in DOCUMENTED_AS_A_WHOLE:
        for key, child in value.items():
            yield from leaf_paths(child, f"{prefix}.{key}" if prefix else key)
    else:
        yield prefix


#: Kubernetes objects documented by one @param (their fields are Kubernetes')
DOCUMENTED_AS_A_WHOLE = {"resources", "podSecurityContext", "securityContext", "monitoring.grafanaDashboard.labels"}


def test_every_value_is_documented_with_a_param_line():
    text = (CHART / "values.yaml").read_text()
    params = set(re.findall(r"^## @param (\S+) ", text, re.MULTILINE))
    values = set(leaf_paths(yaml.safe_load(text)))
    assert values - params == set(), "values without a `## @param <path> <description>` line"
    assert params - values == set(), "@param lines naming no value"


def open_objects(schema, path="(root)"):
    """Paths of object schemas that do not set additionalProperties (maps must say what their values are)."""
    if schema.get("type") == "object" and "additionalProperties" not in schema and "properties" in schema:
        yield path
    for key, child in schema.get("properties", {}).items():
        yield from open_objects(child, f"{path}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from open_objects(schema[key], f"{path}.{key}")


def test_schema_closes_every_object_and_covers_every_value():
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert list(open_objects(schema)) == []
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(schema["properties"]) == set(values)
    assert all(schema["properties"][key]["type"] for key in values)


def test_dashboard_queries_only_metrics_the_runtime_exports():
    exported = set(re.findall(r'"((?:vllm|neuronmodel):[a-z0-9_]+)"',
                              (ROOT / "runtime" / "neuronmodel_runtime" / "server" / "metrics.py").read_text()))
    for path in (CHART / "dashboards").glob("*.json"):
        dashboard = json.loads(path.read_text())
        exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
        used = {re.sub(r"_(total|bucket)$", "", name) for expr in exprs
                for name in re.findall(r"(?:vllm|neuronmodel):[a-z0-9_]+", expr)}
        assert used and used <= exported, f"{path.name} queries metrics the runtime does not export: {used - exported}"
