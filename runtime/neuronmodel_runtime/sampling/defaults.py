"""The sampling defaults a model ships in generation_config.json, applied to requests that omit them (as vLLM's
default `--generation-config auto` does)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

log = logging.getLogger(__name__)

#: generation_config.json key -> request field.
_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "repetition_penalty": "repetition_penalty"}


def generation_defaults(model_dir: str | Path) -> dict[str, float]:
    """Request field -> default from `model_dir/generation_config.json` (empty when the file sets none).

    Like vLLM, the keys apply whatever `do_sample` says: a client that wants greedy sends temperature 0.
    """
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return {}
    raw = json.loads(path.read_text())
    out: dict[str, float] = {}
    for key, field in _KEYS.items():
        value = raw.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[field] = value
    if "min_p" in raw:
        log.warning("%s sets min_p, which this server does not implement; it is ignored", path)
    if out:
        log.info("request defaults from %s: %s", path, out)
    return out
