"""NOTES.txt, what `helm install` prints: the first NeuronModel it tells a user to apply is one the operator serves,
in the namespace the operator watches, and the commands name that model."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

import chart_sync
from conftest import need_helm

from neuronmodel_operator.api import parse_spec
from neuronmodel_operator.resolve import OperatorDefaults, resolve


def notes(*values: str) -> str:
    out = subprocess.run([str(need_helm("helm")), "install", "demo", str(chart_sync.CHART), "-n", "ops",
                          "--dry-run=client", *values], capture_output=True, text=True, check=True).stdout
    return out[out.index("NOTES:"):]


@pytest.mark.parametrize("values, namespace", [((), "default"), (("--set", "watchNamespaces={team-a}"), "team-a")])
def test_the_first_neuronmodel_of_the_notes_is_served(values, namespace):
    text = notes(*values)
    apply, manifest = re.search(r"kubectl apply -n (\S+) -f - <<'EOF'\n(.*?)\n\s*EOF", text, re.S).groups()
    body = yaml.safe_load(manifest)
    assert apply == namespace and body["kind"] == "NeuronModel" and body["apiVersion"] == "neuronmodel.dev/v1alpha1"
    resolved = resolve(parse_spec(body["spec"]), OperatorDefaults())
    assert resolved.framework == "torch" and resolved.cores_per_pod == 0  # any CPU node
    name = body["metadata"]["name"]
    for command in (f"kubectl describe nm {name} -n {namespace}", f"neuronmodel.dev/name={name}",
                    f"port-forward -n {namespace} service/{name} 8000:8000", f'"model": "{name}"'):
        assert command in text, command
