"""Every shipped sample (crds/samples/) fits the node docs/eks.md sets up: each pod the operator renders for it, serving
and compiling, requests no more cpu, memory, ephemeral storage, NeuronCores, Neuron devices or EFA devices than that
node's Allocatable (node_shape.py: the page's root volume and EKS's kubelet reservations). The 70B samples asked for
213Gi of ephemeral storage while the page's 200 GiB root volume leaves about 149 GiB once the images are pulled: the
pods stayed Pending with "Insufficient ephemeral-storage" on a cluster built as the page says.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from neuronmodel_operator import builders, devices
from operator_tests import golden, node_shape

SAMPLES = sorted((Path(__file__).resolve().parents[2] / "crds" / "samples").glob("*.yaml"))
UNITS = {"m": 1e-3, "": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}


def _quantity(value: Any, resource: str) -> float:
    """A request in the unit node_shape.allocatable uses: millicores, MiB, GiB or a count."""
    text = str(value)
    suffix = next(s for s in sorted(UNITS, key=len, reverse=True) if text.endswith(s) and text[:len(text) - len(s)])
    amount = float(text[:len(text) - len(suffix)]) * UNITS[suffix]
    return {"cpu": amount * 1000, "memory": amount / 2**20, "ephemeral-storage": amount / 2**30}.get(resource, amount)


def pod_requests(spec: dict[str, Any]) -> dict[str, float]:
    """What the scheduler counts for a pod: the containers and the sidecars (init containers restartPolicy Always)
    together, or any one init container with the sidecars started before it, whichever is more."""
    def requests(container: dict[str, Any]) -> dict[str, float]:
        return {name: _quantity(value, name)
                for name, value in (container.get("resources") or {}).get("requests", {}).items()}

    def add(*parts: dict[str, float]) -> dict[str, float]:
        total: dict[str, float] = {}
        for part in parts:
            for name, value in part.items():
                total[name] = total.get(name, 0) + value
        return total

    total, sidecars = {}, {}
    for init in spec.get("initContainers", []):
        if init.get("restartPolicy") == "Always":
            sidecars = add(sidecars, requests(init))
        else:
            total = {name: max(total.get(name, 0), value) for name, value in add(sidecars, requests(init)).items()}
    running = add(sidecars, *(requests(c) for c in spec["containers"]))
    return {name: max(total.get(name, 0), running.get(name, 0)) for name in {*total, *running}}


def pod_specs(children: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for child in children:
        spec = child.get("spec") or {}
        if child["kind"] in ("Deployment", "Job"):
            yield child["kind"], spec["template"]["spec"]
        elif child["kind"] == "LeaderWorkerSet":
            yield "leader", spec["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
            yield "worker", spec["leaderWorkerTemplate"]["workerTemplate"]["spec"]


def sample_targets() -> Iterator[Any]:
    for path in SAMPLES:
        for body in yaml.safe_load_all(path.read_text()):
            if body and body.get("kind") == "NeuronModel":
                meta = {"namespace": "models", "uid": "00000000-0000-0000-0000-000000000000", **body["metadata"]}
                yield pytest.param({**body, "metadata": meta}, id=f"{path.stem}/{meta['name']}")


@pytest.mark.parametrize("body", list(sample_targets()))
def test_every_pod_of_every_sample_fits_the_documented_node(body):
    target = builders.target_from_body(body, golden.DEFAULTS)
    instance = devices.INSTANCE_TYPES.get(target.resolved.instance_type or "")
    if instance is None:  # the torch reference runner: any CPU node; its requests are tiny (sizing.TORCH_REQUESTS)
        assert target.resolved.cores_per_pod == 0
        return
    lnc = target.resolved.logical_core_config or instance.family.default_lnc
    node = node_shape.allocatable(instance, lnc)
    pods = list(pod_specs(builders.serving_children(target) + builders.compile_children(target)))
    assert pods
    for kind, spec in pods:
        requests = pod_requests(spec)
        too_much = {name: (round(value, 1), round(node.get(name, 0), 1)) for name, value in requests.items()
                    if value > node.get(name, 0)}
        name = body["metadata"]["name"]
        assert not too_much, f"{kind} of {name} on {instance.name}: (request, allocatable) {too_much}"


def test_the_arithmetic_of_the_page_is_the_node_shapes():
    """The page says what its root volume leaves to pods: the number node_shape computes."""
    words = " ".join(node_shape.DOC.read_text().split())
    assert f"about {node_shape.ephemeral_gib():.0f} GiB" in words
    assert set(re.findall(r"volumeSize: ([0-9]+)Gi", words)) == {str(node_shape.root_volume_gib())}  # every mention


def test_a_request_beyond_the_node_would_be_caught():
    spec = {"containers": [{"resources": {"requests": {"ephemeral-storage": "213Gi", "cpu": "500m"}}}],
            "initContainers": [{"resources": {"requests": {"ephemeral-storage": "260Gi"}}},
                               {"restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}}]}
    assert pod_requests(spec) == {"ephemeral-storage": 260, "cpu": 1500}
