"""Parity of the torch reference runner with transformers on real checkpoints: the committed tiny target model
and the embedded default model (SmolLM2-135M-Instruct). Each test skips when its model is absent.

Tolerances (fp32, max abs logit difference): 1e-4 on the tiny model, 1e-3 on SmolLM2 (30 layers; observed ~1e-5).
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from neuronmodel_runtime.config import default_model_path  # noqa: E402
from runtime_tests.helpers.runner_helpers import generate, make_runner  # noqa: E402

TINY_TARGET = Path(__file__).resolve().parents[2] / "assets" / "tiny" / "target"
SMOLLM2 = default_model_path()
TEXTS = [
    "The capital of France is Paris, and the capital of Germany is Berlin. The capital of Italy is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return",
    "Once upon a time, in a small village at the edge of a great forest, there lived a",
]


def check_parity(folder: Path, atol: float, steps: int) -> None:
    """Prompt and decode-step logits within `atol` of transformers', greedy output equal to generate's."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = [tokenizer(t)["input_ids"] for t in TEXTS]
    runner = make_runner(folder, max_model_len=128, max_context_length=64)
    with torch.inference_mode():
        for slot, ids in enumerate(prompts):
            ref = hf(torch.tensor([ids])).logits[0]  # [T, V]
            ours = runner.model.forward(torch.tensor([ids]), [slot], [0])[0]
            assert (ours - ref).abs().max() < atol
            steps_at = range(len(ids) - 4, len(ids))  # re-feed the last 4 tokens one decode step at a time
            decoded = [runner.model.forward(torch.tensor([[ids[p]]]), [slot], [p])[0, 0] for p in steps_at]
            assert (torch.stack(decoded) - ref[-4:]).abs().max() < atol
    ours = generate(runner, [2, 0, 1], prompts, steps=steps)
    for ids, tokens in zip(prompts, ours):
        ref = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=steps)[0, len(ids) :].tolist()
        assert tokens[: len(ref)] == ref, tokenizer.decode(ids)


@pytest.mark.skipif(not (TINY_TARGET / "config.json").exists(), reason="tests/assets/tiny/target not committed yet")
def test_tiny_target_matches_transformers():
    check_parity(TINY_TARGET, atol=1e-4, steps=16)


@pytest.mark.smollm2
@pytest.mark.skipif(not (SMOLLM2 / ".complete").exists(), reason="run scripts/fetch_default_model.py first")
def test_smollm2_matches_transformers():
    check_parity(SMOLLM2, atol=1e-3, steps=16)
