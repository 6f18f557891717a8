"""The one digest that names compiled artifacts, shared by the runtime's store and the operator.

`digest(inputs)` is the sha256 of the canonical JSON of `inputs` (sorted keys, compact separators, ASCII only,
tuples as lists; NaN/Infinity and non-JSON values refused). The runtime names each store entry by it
(artifacts/key.py); for an engine whose compile the runtime does not drive itself (engine vllm), the operator
derives the key inputs, names the status' compileKey by their digest and hands the inputs to the pods
(env.ARTIFACT_KEY_INPUTS), so status, store and pods name one entry with one function.

`ARTIFACTS_MISSING` starts the message of a serving pod whose required entry is not in the store (the runtime's
`artifacts fetch --required`); the operator finds it in the container's termination message.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Mapping

ARTIFACTS_MISSING = "ArtifactsMissing"


def _check_json(value: Any, where: str) -> None:
    if isinstance(value, Mapping):
        for name, item in value.items():
            if not isinstance(name, str):
                raise ValueError(f"artifact key input {where}: key {name!r} must be a string")
            _check_json(item, f"{where}.{name}" if where else name)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"artifact key input {where}: {value} is not a finite number (JSON has no NaN/Infinity)")
    elif not (value is None or isinstance(value, (str, int))):
        raise ValueError(f"artifact key input {where}: a {type(value).__name__} is not JSON data (use str, int, "
                         "float, bool, None, lists and string-keyed mappings)")


def canonical_json(inputs: Mapping[str, Any]) -> str:
    """Sorted keys, compact separators, ASCII only, tuples as lists; NaN/Infinity and non-JSON values refused."""
    if not isinstance(inputs, Mapping):
        raise ValueError(f"artifact key inputs must be a mapping, not {type(inputs).__name__}")
    _check_json(inputs, "")
    return json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def digest(inputs: Mapping[str, Any]) -> str:
    """sha256 hex of `canonical_json(inputs)` (pure: dict order never changes it, any value change does)."""
    return hashlib.sha256(canonical_json(inputs).encode("ascii")).hexdigest()


__all__ = ["ARTIFACTS_MISSING", "canonical_json", "digest"]
