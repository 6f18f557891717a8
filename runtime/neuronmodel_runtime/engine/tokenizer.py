"""Loading a model folder's tokenizer and the token ids that end generation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def load_tokenizer(model_path: str | Path) -> Any:
    """The Hugging Face tokenizer of a model folder (local files only: no hub access in a pod)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)


def eos_token_ids(model_path: str | Path, tokenizer: Any) -> set[int]:
    """EOS ids: the tokenizer's, plus every id in generation_config.json's eos_token_id (int or list)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_config = Path(model_path) / "generation_config.json"
    if gen_config.is_file():
        value = json.loads(gen_config.read_text()).get("eos_token_id")
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(int(v) for v in value)
    return ids


def chat_prompt_ids(tokenizer: Any, messages: list[dict]) -> list[int]:
    """Token ids of a conversation rendered with the model's chat template, ready for the assistant's turn.

    Rendered to text first, then encoded without extra special tokens: the template already wrote the ones it
    wants (BOS), and `tokenize=True` returns different types across transformers versions.
    """
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))
