"""The committed tiny test models (made by scripts/make_tiny_models.py) load and fit together."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TINY = Path(__file__).resolve().parents[2] / "assets" / "tiny"
REPO = TINY.parents[2]
SPECIAL_TOKENS = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}


@pytest.fixture(scope="module")
def metadata() -> dict:
    return json.loads((TINY / "metadata.json").read_text())


@pytest.fixture(scope="module", params=["target", "draft"])
def loaded(request):
    folder = TINY / request.param
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    return request.param, tokenizer, model


def test_metadata_fields(metadata):
    assert metadata["corpus"]["sha256"]
    for name in ("target", "draft"):
        entry = metadata[name]
        assert entry["params"] > 0
        assert entry["train"]["steps"] > 0 and entry["train"]["tokens"] > 0
        assert entry["val_ppl"] > 1
    assert metadata["speculation"]["k"] == 4
    assert {"torch", "transformers"} <= metadata["versions"].keys()


def test_corpus_matches_metadata(metadata):
    corpus = REPO / metadata["corpus"]["path"]
    assert hashlib.sha256(corpus.read_bytes()).hexdigest() == metadata["corpus"]["sha256"]


def test_draft_acceptance_is_useful(metadata):
    assert metadata["speculation"]["acceptance"] >= 0.15


def test_target_is_bigger_than_draft(metadata):
    assert metadata["target"]["train"]["layers"] > metadata["draft"]["train"]["layers"]
    assert metadata["target"]["params"] > metadata["draft"]["params"]


def test_loads_as_fp32_llama(loaded):
    _, tokenizer, model = loaded
    assert model.config.model_type == "llama"
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert len(tokenizer) == model.config.vocab_size


def test_tokenizer_specials_and_chat_template(loaded):
    _, tokenizer, model = loaded
    assert tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == list(SPECIAL_TOKENS.values())
    assert tokenizer.eos_token == "<|im_end|>"
    assert list(model.generation_config.eos_token_id) == [2, 0]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What does os.path.join do?"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nWhat does os.path.join do?<|im_end|>\n<|im_start|>assistant\n"


def test_target_and_draft_share_the_vocabulary():
    target, draft = TINY / "target", TINY / "draft"
    assert (target / "tokenizer.json").read_bytes() == (draft / "tokenizer.json").read_bytes()
    vocab_sizes = {json.loads((folder / "config.json").read_text())["vocab_size"] for folder in (target, draft)}
    assert vocab_sizes == {4096}


def test_greedy_generation_runs(loaded):
    _, tokenizer, model = loaded
    input_ids = torch.tensor([tokenizer("Return the", add_special_tokens=False)["input_ids"]])
    output = model.generate(input_ids, max_new_tokens=8, do_sample=False)
    assert output.shape[1] > input_ids.shape[1]
