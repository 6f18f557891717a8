"""Whether a draft model can serve a target: the same vocabulary, token for token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional


def vocabulary_mismatch(target_dir: Path, draft_dir: Path, target_vocab: int, draft_vocab: int) -> Optional[str]:
    """Why a draft cannot serve this target (a different vocabulary), or None when they share it.

    The vocabulary sizes must match; when both folders carry a tokenizer.json, so must their token tables.
    """
    if target_vocab != draft_vocab:
        return f"its vocabulary has {draft_vocab} tokens, the target's {target_vocab}; use a draft of the same family"

    def vocab(folder: Path) -> Optional[dict]:
        path = folder / "tokenizer.json"
        return json.loads(path.read_text()).get("model", {}).get("vocab") if path.is_file() else None

    target, draft = vocab(target_dir), vocab(draft_dir)
    if target is not None and draft is not None and target != draft:
        return "its tokenizer maps tokens to different ids than the target's; draft and target must share a tokenizer"
    return None
