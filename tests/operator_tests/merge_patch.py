"""RFC 7386 JSON merge patch, as the tests build specs and as the fake API server stores applied objects."""

from __future__ import annotations

import copy


def merge_patch(target: dict, patch: dict) -> dict:
    """A copy of `target` with `patch` merged in: objects merged key by key, a null removes the key, anything else
    replaces the value."""
    out = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_patch(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
