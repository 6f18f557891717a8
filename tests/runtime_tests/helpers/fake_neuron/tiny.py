"""What the fakes' tests compute with, not a fake: the committed tiny Llama (tests/assets/tiny/target, its draft
tests/assets/tiny/draft) and transformers' greedy continuation on it, the tokens the fakes and their runners must
give."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ASSETS = Path(__file__).resolve().parents[3] / "assets" / "tiny"
TARGET, DRAFT = ASSETS / "target", ASSETS / "draft"


def hf_greedy(hf: Any, ids: list[int], steps: int) -> list[int]:
    """transformers' greedy continuation: the argmax of its logits at each step (no EOS handling: the tiny model's
    EOS is an ordinary token here, as the runner emits it)."""
    import torch

    seq = list(ids)
    with torch.inference_mode():
        for _ in range(steps):
            seq.append(int(hf(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids):]


__all__ = ["DRAFT", "TARGET", "hf_greedy"]
