"""`neuron_config_overrides` (vLLM's override_neuron_config): the check both Neuron runners make before merging them
into their library's NeuronConfig keywords. Each runner's own checks (NxDI: keys its release does not keep; TNx: keys
that take a config object) are in `nxdi_config.py` and `tnx_config.py`.
"""

from __future__ import annotations

from typing import Any, Mapping

from neuronmodel_runtime.runners.base import RunnerError


def refuse_managed_overrides(overrides: Mapping[str, Any], managed: Mapping[str, str]) -> None:
    """Refuse neuron_config_overrides keys the runner derives from RuntimeConfig fields (`managed`: key -> the
    field that sets it): the runner depends on their values, so they are set through the field.

    Raises:
        RunnerError: naming each such key and its field.
    """
    clash = sorted(set(overrides) & set(managed))
    if clash:
        raise RunnerError("neuron_config_overrides: " + "; ".join(f"{key} is set by {managed[key]}" for key in clash)
                          + ": set the field instead of overriding the key")


__all__ = ["refuse_managed_overrides"]
