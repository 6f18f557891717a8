"""Framework name -> runner class, imported lazily so that Neuron libraries load only where they are used."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from neuronmodel_runtime.runners.base import ModelRunner, RunnerError

if TYPE_CHECKING:
    from neuronmodel_runtime.config import RuntimeConfig

#: framework -> "module:Class"
RUNNERS = {
    "torch": "neuronmodel_runtime.runners.torch_reference:TorchReferenceRunner",
    "nxdi": "neuronmodel_runtime.runners.neuron_nxdi:NxdiRunner",
    "tnx": "neuronmodel_runtime.runners.neuron_tnx:TnxRunner",
}


def create_runner(framework: str, config: "RuntimeConfig", model_path: str, **rank: Any) -> ModelRunner:
    """Build (not load) the runner of a selected framework; `rank`: its place in a multi-process group
    (distributed/launch.py: the torch runner's `tensor_parallel`, the NxDI runner's `node_rank`)."""
    target = RUNNERS.get(framework)
    if target is None:
        raise RunnerError(
            f"framework {framework!r} is installed but this release has no runner for it yet; "
            f"use one of {sorted(RUNNERS)}"
        )
    module_name, class_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(config, model_path, **rank)
