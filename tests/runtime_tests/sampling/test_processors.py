"""Logits processors (min_tokens mask, logit_bias, penalties) against a plain per-row reference, and through the engine.

The reference is a python loop over rows and tokens written from the definitions (vLLM's and OpenAI's):
- min_tokens: the masked tokens (EOS and stop ids) get -inf;
- logit_bias: added to the listed tokens' logits;
- repetition_penalty (vLLM / CTRL): for every token in the prompt OR the output, a positive logit is divided by the
  penalty and a negative one multiplied by it;
- frequency_penalty (OpenAI): minus the penalty times the token's count in the output (the prompt does not count);
- presence_penalty (OpenAI): minus the penalty once for every token present in the output;
in that order. Real logits: the committed tiny target's (transformers), and end to end the random tiny llama's.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from runtime_tests.helpers.fakes_runner import ByteTokenizer  # noqa: E402
from runtime_tests.helpers.runner_helpers import make_runner  # noqa: E402
from neuronmodel_runtime.engine.engine import Engine  # noqa: E402
from neuronmodel_runtime.engine.speculation import build_speculation  # noqa: E402
from neuronmodel_runtime.sampling.params import GREEDY, RowSampling, SamplingParams  # noqa: E402
from neuronmodel_runtime.sampling.processors import apply_logits_processors  # noqa: E402

TINY = Path(__file__).resolve().parents[2] / "assets" / "tiny" / "target"


def reference_row(logits: list[float], row: RowSampling) -> list[float]:
    """One row, token by token, from the definitions above."""
    out = list(logits)
    for token in row.masked_token_ids:
        out[token] = -math.inf
    for token, bias in row.logit_bias:
        out[token] += bias
    seen = set(row.prompt_ids) | set(row.output_ids)
    counts = Counter(row.output_ids)
    for token in range(len(out)):
        if token in seen:
            out[token] = out[token] / row.repetition_penalty if out[token] > 0 else out[token] * row.repetition_penalty
        out[token] -= row.frequency_penalty * counts[token]
        if counts[token] > 0:
            out[token] -= row.presence_penalty
    return out


@pytest.fixture(scope="module")
def real_logits() -> "torch.Tensor":
    """`[8, 4096]` float32 logits of the tiny target at the last 8 positions of a prompt (positive and negative)."""
    if not (TINY / "config.json").is_file():
        pytest.skip("tiny model not committed")
    model = transformers.LlamaForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    ids = transformers.AutoTokenizer.from_pretrained(TINY).encode("def join(*parts):\n    \"\"\"Join the path parts")
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -8:].float()
    assert (logits > 0).any() and (logits < 0).any()
    return logits


def sampled(**fields) -> RowSampling:
    return replace(RowSampling(-1, 1.0, 1.0, 0), **fields)


def mixed_rows(logits: "torch.Tensor") -> list[RowSampling]:
    """Rows of every kind in one batch; prompts and outputs chosen among the row's positive and negative logits."""
    pos = [int(t) for t in logits[1].topk(6).indices]  # positive logits of row 1
    neg = [int(t) for t in (-logits[1]).topk(6).indices]  # negative ones
    prompt = [pos[0], neg[0], 17, 17, pos[1], 300]
    output = [pos[1], pos[1], pos[1], neg[1], pos[2], neg[1], 300, pos[0]]  # repeated tokens, some also in the prompt
    every = dict(prompt_ids=prompt, output_ids=output)
    return [
        GREEDY,  # untouched
        sampled(repetition_penalty=1.4, frequency_penalty=0.7, presence_penalty=0.4,
                logit_bias=((pos[0], 3.0), (neg[2], -5.0), (pos[2], 1.5), (4000, 100.0)),
                masked_token_ids=(2, 0), **every),  # every processor; bias on tokens seen and unseen
        sampled(),  # untouched, sampled
        sampled(repetition_penalty=0.6, frequency_penalty=-0.5, presence_penalty=-1.0, **every),  # negative
        sampled(frequency_penalty=1.1, prompt_ids=prompt, output_ids=output),  # frequency only: the prompt is ignored
        sampled(presence_penalty=2.0, prompt_ids=prompt, output_ids=output),  # once per present token
        sampled(repetition_penalty=1.9, prompt_ids=prompt, output_ids=[]),  # the prompt alone counts
        replace(GREEDY, logit_bias=((pos[3], -100.0), (neg[3], 100.0)), masked_token_ids=(pos[4],)),
    ]


def test_processors_equal_the_per_row_reference(real_logits):
    rows = mixed_rows(real_logits)
    out = apply_logits_processors(real_logits, rows)
    assert out.shape == real_logits.shape and out.dtype == torch.float32
    for r, row in enumerate(rows):
        want = torch.tensor(reference_row(real_logits[r].tolist(), row), dtype=torch.float64)
        got = out[r].double()
        assert torch.equal(torch.isinf(got), torch.isinf(want)) and torch.equal(got[want.isinf()], want[want.isinf()])
        finite = want.isfinite()
        worst = float((got - want)[finite].abs().max())
        assert torch.allclose(got[finite], want[finite], atol=1e-5, rtol=1e-6), (r, worst)
        if not row.processes_logits:
            assert torch.equal(out[r], real_logits[r])  # untouched rows are bit-identical
    assert not torch.equal(out[3], real_logits[3]) and not torch.equal(out[4], real_logits[4])


def test_processors_are_identical_row_by_row_and_batched(real_logits):
    rows = mixed_rows(real_logits)
    batched = apply_logits_processors(real_logits, rows)
    for r, row in enumerate(rows):
        alone = apply_logits_processors(real_logits[r : r + 1], [row])
        assert torch.equal(alone.float()[0], batched[r])


def test_no_processed_row_returns_the_logits_themselves(real_logits):
    rows = [GREEDY, sampled(), sampled(prompt_ids=[1, 2], output_ids=[3])]  # a history alone processes nothing
    logits = real_logits[:3].clone()
    assert apply_logits_processors(logits, rows) is logits


def test_penalties_on_a_hand_made_row():
    """A readable case: the definitions, one number at a time."""
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0, 0.5, 3.0]])
    row = sampled(repetition_penalty=2.0, frequency_penalty=0.25, presence_penalty=0.5, logit_bias=((4, 1.0),),
                  masked_token_ids=(5,), prompt_ids=[0, 1], output_ids=[2, 2, 3])
    out = apply_logits_processors(logits, [row])[0].tolist()
    assert out[0] == pytest.approx(1.0)  # prompt, positive: 2 / 2
    assert out[1] == pytest.approx(-4.0)  # prompt, negative: -2 * 2
    assert out[2] == pytest.approx(1.0 / 2 - 0.25 * 2 - 0.5)  # output twice: divided, frequency twice, presence once
    assert out[3] == pytest.approx(-1.0 * 2 - 0.25 - 0.5)
    assert out[4] == pytest.approx(1.5)  # biased, never seen
    assert out[5] == -math.inf  # masked (min_tokens)


# ---------------------------------------------------------------------------------------------------------------
# Through the engine and the torch reference runner (random tiny llama, vocabulary 96).

EOS = 3


def run(runner, params: SamplingParams, prompt=(5, 9, 14, 20), speculation=None) -> tuple[list[int], str]:
    engine = Engine(runner, ByteTokenizer(), {EOS}, max_num_batched_tokens=4096, speculation=speculation)
    engine.add(engine.make_request("r", list(prompt), params))
    tokens, finish = [], None

    def emit(outs):
        nonlocal finish
        for out in outs:
            tokens.extend(out.token_ids)
            finish = out.finish_reason or finish

    while engine.has_work:
        engine.step(emit)
    return tokens, finish


@pytest.mark.parametrize("mode", ["none", "draft"])
def test_min_tokens_masks_eos_then_a_biased_eos_ends_the_request(tiny_checkpoint, mode):
    """Greedy, logit_bias +100 on EOS, min_tokens 5: five tokens that are not EOS (the greedy tokens with EOS banned),
    then EOS. A speculating engine gives the same (rows with logits processors decode plainly)."""
    target = tiny_checkpoint("llama")
    fields = {} if mode == "none" else {"speculation": {"mode": "draft", "num_speculative_tokens": 3,
                                                        "draft_model": str(tiny_checkpoint("qwen2"))}}
    runner = make_runner(target, **fields)
    spec = build_speculation(runner.config.speculation, runner)
    tokens, finish = run(runner, SamplingParams(temperature=0, max_tokens=20, min_tokens=5,
                                                logit_bias=((EOS, 100.0),)), speculation=spec)
    assert tokens[5:] == [EOS] and finish == "stop"
    banned, _ = run(make_runner(target), SamplingParams(temperature=0, max_tokens=5, logit_bias=((EOS, -100.0),)))
    assert tokens[:5] == banned and EOS not in banned


def test_greedy_with_penalties_follows_the_reference_step_by_step(tiny_checkpoint):
    """End to end: the engine's greedy tokens with every processor equal a python greedy loop over transformers'
    logits and the per-row reference (prompt and output history handed over by the engine every step)."""
    target = tiny_checkpoint("llama")
    params = SamplingParams(temperature=0, max_tokens=14, repetition_penalty=1.5, frequency_penalty=0.6,
                            presence_penalty=0.3, logit_bias=((7, 2.0), (11, -1.5)))
    prompt = [5, 9, 14, 20, 9, 14]
    tokens, _ = run(make_runner(target), params, prompt=prompt)
    model = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    expected: list[int] = []
    with torch.no_grad():
        for _ in range(14):
            logits = model(torch.tensor([prompt + expected])).logits[0, -1].tolist()
            row = params.row()
            row = replace(row, prompt_ids=prompt, output_ids=list(expected))
            processed = reference_row(logits, row)
            token = max(range(len(processed)), key=lambda t: processed[t])
            if token == EOS:  # the engine stops here
                expected.append(token)
                break
            expected.append(token)
    assert tokens == expected
    plain, _ = run(make_runner(target), SamplingParams(temperature=0, max_tokens=14), prompt=prompt)
    assert plain != tokens  # the penalties changed the greedy path
