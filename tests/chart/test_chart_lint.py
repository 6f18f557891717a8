"""`helm lint --strict` on every values file, and the values schema rejecting bad values, on Helm 4 and Helm 3."""

from __future__ import annotations

import json
import subprocess

import pytest

import chart_sync


def lint(helm: str, tmp_path, values: dict | None = None, values_file=None) -> subprocess.CompletedProcess:
    args = [str(chart_sync.helm(helm)), "lint", "--strict", str(chart_sync.CHART)]
    if values is not None:
        values_file = tmp_path / "values.yaml"
        values_file.write_text(json.dumps(values))  # JSON is YAML
    if values_file is not None:
        args += ["-f", str(values_file)]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case", sorted(chart_sync.cases()))
def test_lint_strict_passes(helm, tmp_path, case):
    out = lint(helm, tmp_path, values_file=chart_sync.cases()[case])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout, out.stdout


#: bad values -> what each Helm major's error must name (Helm 4: JSON pointers; Helm 3: dotted paths)
INVALID = {
    "unknown top-level key": ({"replicas": 2}, ("replicas",)),
    "unknown nested key": ({"image": {"repo": "x"}}, ("repo",)),
    "replicaCount as a word": ({"replicaCount": "two"}, ("replicaCount", "integer")),
    "logFormat not one of its values": ({"logFormat": "xml"}, ("logFormat", "json")),
    "namespace name with capitals": ({"watchNamespaces": ["Team_A"]}, ("watchNamespaces", "match pattern")),
    "liveness port out of range": ({"liveness": {"port": 70000}}, ("port",)),
    "compile-cache policy unknown": ({"compileCache": {"policy": "Sometimes"}}, ("policy",)),
    "allowHostPath as a word": ({"allowHostPath": "yes"}, ("allowHostPath", "boolean")),
    "neuronSchedulerName not a name": ({"neuronSchedulerName": "My Scheduler"}, ("neuronSchedulerName",)),
    "proxy without a scheme": ({"proxy": {"https": "proxy.internal:3128"}}, ("https",)),
    "extraEnv setting a variable a value sets": ({"extraEnv": [{"name": "HTTPS_PROXY", "value": "x"}]},
                                                 ("extraEnv",)),
    "extraEnv without a name": ({"extraEnv": [{"value": "x"}]}, ("extraEnv", "name")),
}


@pytest.mark.parametrize("name", sorted(INVALID))
def test_schema_rejects_bad_values_naming_the_key(helm, tmp_path, name):
    values, named = INVALID[name]
    out = lint(helm, tmp_path, values)
    message = out.stdout + out.stderr
    assert out.returncode != 0, f"{name} was accepted"
    assert "don't meet the specifications of the schema" in message
    for word in named:
        assert word.lower() in message.lower(), message


def test_no_proxy_without_a_proxy_fails_to_render_with_the_fix(helm, tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text("proxy:\n  noProxy: .internal\n")
    out = chart_sync.render(values, helm)
    assert out.returncode != 0
    assert "proxy.noProxy is set but neither proxy.https nor proxy.http" in out.stderr


def test_replicas_without_peering_fail_to_render_with_the_fix(helm, tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text("replicaCount: 2\n")
    out = chart_sync.render(values, helm)  # `helm lint` only logs a template's fail(); rendering stops at it
    assert out.returncode != 0
    assert "replicaCount is 2 but peering.enabled is false" in out.stderr
    assert "set peering.enabled=true or replicaCount=1" in out.stderr
