"""Speculative decoding on the reference runner, end to end through the engine.

Greedy: outputs are token-for-token those of plain decoding. Sampled: the output distribution is the target's.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from fakes_runner import ByteTokenizer
from runner_helpers import make_runner
from neuronmodel_runtime.engine.engine import Engine
from neuronmodel_runtime.engine.speculation import build_speculation
from neuronmodel_runtime.engine.tokenizer import chat_prompt_ids
from neuronmodel_runtime.runners.base import DecodeBatch, PrefillBatch, RunnerError
from neuronmodel_runtime.sampling.params import RowSampling, SamplingParams

TINY = Path(__file__).resolve().parents[1] / "assets" / "tiny"


def spec_fields(mode, k, draft=None):
    return {"speculation": {"mode": mode, "num_speculative_tokens": k, "draft_model": str(draft) if draft else None}}


def spec_engine(runner, eos=()):
    """The real Engine over `runner`, speculating as the runner's config asks (as cli.build_engine wires it)."""
    return Engine(runner, ByteTokenizer(), set(eos), max_num_batched_tokens=4096,
                  speculation=build_speculation(runner.config.speculation, runner))


def run_engine(runner, requests, eos=()):
    """requests: (id, prompt ids, SamplingParams) -> id -> output token ids; also returns the engine."""
    engine = spec_engine(runner, eos)
    for rid, prompt, params in requests:
        engine.add(engine.make_request(rid, prompt, params))
    outputs = {rid: [] for rid, _, _ in requests}

    def emit(outs):
        for out in outs:
            outputs[out.request_id] += out.token_ids

    while engine.has_work:
        engine.step(emit)
    return outputs, engine


def prompts(n, vocab=96, seed=0):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        motif = [rng.randrange(1, vocab) for _ in range(rng.randint(2, 5))]
        out.append((motif * 6)[: rng.randint(3, 24)])  # repetitive, so prompt lookup finds matches
    return out


@pytest.fixture(scope="module")
def greedy_reference(tiny_checkpoint):
    """Plain greedy outputs of 12 prompts on the random llama target (max_tokens 20)."""
    target = tiny_checkpoint("llama")
    reqs = [(str(i), p, SamplingParams(temperature=0, max_tokens=20)) for i, p in enumerate(prompts(12))]
    outputs, _ = run_engine(make_runner(target, max_num_seqs=4), reqs)
    return target, reqs, outputs


@pytest.mark.parametrize("slots", [1, 4, 12])
@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("mode", ["draft-self", "draft-other", "promptLookup"])
def test_greedy_speculation_matches_plain_decoding(greedy_reference, tiny_checkpoint, mode, k, slots):
    target, reqs, expected = greedy_reference
    if mode == "promptLookup":
        fields = spec_fields("promptLookup", k)
    else:
        draft = target if mode == "draft-self" else tiny_checkpoint("qwen2")  # same vocab, different model
        fields = spec_fields("draft", k, draft)
    runner = make_runner(target, max_num_seqs=slots, **fields)
    outputs, engine = run_engine(runner, reqs)
    assert outputs == expected
    stats = engine.stats
    assert stats.spec_drafts_total > 0 and stats.spec_draft_tokens_total >= stats.spec_accepted_tokens_total
    if mode == "draft-self":  # a draft identical to the target is always right
        assert stats.spec_accepted_tokens_total == stats.spec_draft_tokens_total


def test_prompt_near_max_model_len_and_mixed_rows(tiny_checkpoint):
    """k shrinks to fit: rows near the end of their slot speculate less (or not at all) in the same batch."""
    target = tiny_checkpoint("llama")
    reqs = [("near", prompts(1, seed=5)[0][:20] + [7] * 10, SamplingParams(temperature=0)),
            ("far", [3, 4, 5], SamplingParams(temperature=0, max_tokens=30)),
            ("logprobs", [9, 8], SamplingParams(temperature=0, max_tokens=12, logprobs=2))]  # never speculates
    host = {"sampling": {"on_device": False}}  # logprobs need the logits on the host
    plain, _ = run_engine(make_runner(target, max_num_seqs=3, max_model_len=40, **host), reqs)
    runner = make_runner(target, max_num_seqs=3, max_model_len=40, **host, **spec_fields("draft", 5, target))
    spec, engine = run_engine(runner, reqs)
    assert spec == plain and len(plain["near"]) == 40 - 30
    assert engine.stats.spec_drafts_total > 0


def test_abort_mid_generation_then_slot_reuse_stays_exact(tiny_checkpoint):
    target = tiny_checkpoint("llama")
    runner = make_runner(target, max_num_seqs=1, **spec_fields("draft", 3, tiny_checkpoint("qwen2")))
    engine = spec_engine(runner)
    engine.add(engine.make_request("a", [1, 2, 3], SamplingParams(temperature=0, max_tokens=40)))
    engine.step(lambda outs: None)
    engine.step(lambda outs: None)
    engine.abort(["a"])
    engine.step(lambda outs: None)
    plain, _ = run_engine(make_runner(target, max_num_seqs=1), [("b", [4, 5, 6], SamplingParams(temperature=0))])
    got = []
    engine.add(engine.make_request("b", [4, 5, 6], SamplingParams(temperature=0)))
    while engine.has_work:
        engine.step(lambda outs: got.extend(t for o in outs for t in o.token_ids))
    assert got == plain["b"]


def sample_sequences(runner, rows, length):
    """Prefill every slot with the same prompt, decode until each row has `length` tokens."""
    n = len(rows)
    slots = list(range(n))
    prompt = [5, 17, 5, 17, 5]
    first = runner.prefill(PrefillBatch(slots, [prompt] * n, rows)).token_ids
    seqs = [list(t) for t in first]
    k = runner.capacity().speculation_length
    while any(len(s) < length for s in seqs):
        live = [i for i in slots if len(seqs[i]) < length]
        batch = DecodeBatch(
            slots=live,
            last_tokens=[seqs[i][-1] for i in live],
            positions=[len(prompt) + len(seqs[i]) - 1 for i in live],
            sampling=[rows[i] for i in live],
            num_spec_tokens=[min(k, length - len(seqs[i]) - 1) for i in live] if k else [],
        )
        for i, new in zip(live, runner.decode(batch).token_ids):
            seqs[i].extend(new)
    return [tuple(s[:length]) for s in seqs]


def two_sample_chi2(a, b):
    """Chi-square statistic and degrees of freedom of two equal-size samples (categories with >= 10 in all)."""
    cats = sorted(set(a) | set(b))
    ca = {c: 0 for c in cats}
    cb = dict(ca)
    for x in a:
        ca[x] += 1
    for x in b:
        cb[x] += 1
    big = [c for c in cats if ca[c] + cb[c] >= 10]
    rest_a = sum(ca[c] for c in cats if c not in big)
    rest_b = sum(cb[c] for c in cats if c not in big)
    pairs = [(ca[c], cb[c]) for c in big] + ([(rest_a, rest_b)] if rest_a + rest_b else [])
    chi2 = sum((x - y) ** 2 / (x + y) for x, y in pairs if x + y)
    return chi2, len(pairs) - 1


# Upper 0.1% points of chi-square: a correct sampler fails one of these checks about once in a thousand runs.
CHI2_999 = {d: v for d, v in zip(range(1, 61), [10.8, 13.8, 16.3, 18.5, 20.5, 22.5, 24.3, 26.1, 27.9, 29.6, 31.3,
            32.9, 34.5, 36.1, 37.7, 39.3, 40.8, 42.3, 43.8, 45.3, 46.8, 48.3, 49.7, 51.2, 52.6, 54.1, 55.5, 56.9,
            58.3, 59.7, 61.1, 62.5, 63.9, 65.2, 66.6, 68.0, 69.3, 70.7, 72.1, 73.4, 74.7, 76.1, 77.4, 78.7, 80.1,
            81.4, 82.7, 84.0, 85.4, 86.7, 88.0, 89.3, 90.6, 91.9, 93.2, 94.5, 95.8, 97.0, 98.3, 99.6])}


@pytest.mark.parametrize("mode", ["draft", "promptLookup"])
def test_sampled_speculation_preserves_the_distribution(tiny_checkpoint, mode):
    """Per sampling setting, the 2nd and 3rd tokens' marginals and the (2nd, 3rd) pairs match plain sampling.

    The batch mixes plain, top_k and top_p rows, so per-row processing is exercised together.
    """
    target = tiny_checkpoint("llama")
    settings = [RowSampling(-1, 1.0, 1.0, None), RowSampling(8, 1.0, 0.8, None), RowSampling(-1, 0.7, 1.3, None)]
    per = 340
    rows = [RowSampling(s.top_k, s.top_p, s.temperature, seed) for seed in range(per) for s in settings]
    extra = {"draft": spec_fields("draft", 3, tiny_checkpoint("qwen2")), "promptLookup": {}}[mode]
    plain = sample_sequences(make_runner(target, max_num_seqs=len(rows), max_model_len=16, max_context_length=8), rows, 4)
    if mode == "draft":
        spec_runner = make_runner(target, max_num_seqs=len(rows), max_model_len=16, max_context_length=8, **extra)
        spec = sample_sequences(spec_runner, [RowSampling(r.top_k, r.top_p, r.temperature, r.seed + 10**6)
                                              for r in rows], 4)
    else:  # deterministic proposals: feed a fixed guess through the same verifier
        spec = sample_prompt_lookup(target, rows, 4)
    for s_index in range(len(settings)):
        a = [seq for i, seq in enumerate(plain) if i % len(settings) == s_index]
        b = [seq for i, seq in enumerate(spec) if i % len(settings) == s_index]
        for view in (lambda s: s[1], lambda s: s[2], lambda s: s[1:3]):
            chi2, dof = two_sample_chi2([view(s) for s in a], [view(s) for s in b])
            assert dof == 0 or chi2 < CHI2_999[min(dof, 60)], (s_index, chi2, dof)


def sample_prompt_lookup(target, rows, length):
    """Like sample_sequences, with k=3 host proposals that repeat the prompt's pattern."""
    runner = make_runner(target, max_num_seqs=len(rows), max_model_len=16, max_context_length=8, **spec_fields("promptLookup", 3))
    n = len(rows)
    slots = list(range(n))
    prompt = [5, 17, 5, 17, 5]
    seqs = [list(t) for t in runner.prefill(PrefillBatch(slots, [prompt] * n, rows)).token_ids]
    while any(len(s) < length for s in seqs):
        live = [i for i in slots if len(seqs[i]) < length]
        ks = [min(3, length - len(seqs[i]) - 1) for i in live]
        batch = DecodeBatch(live, [seqs[i][-1] for i in live], [len(prompt) + len(seqs[i]) - 1 for i in live],
                            [rows[i] for i in live], num_spec_tokens=ks, draft_tokens=[[17, 5, 17][:k] for k in ks])
        for i, new in zip(live, runner.decode(batch).token_ids):
            seqs[i].extend(new)
    return [tuple(s[:length]) for s in seqs]


def test_eagle_and_foreign_drafts_are_refused_with_a_clear_error(tiny_checkpoint, tmp_path):
    target = tiny_checkpoint("llama")
    with pytest.raises(RunnerError, match="eagle.*not supported by the torch reference runner"):
        make_runner(target, **spec_fields("eagle", 2, target))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    for f in Path(target).iterdir():
        (foreign / f.name).write_bytes(f.read_bytes())
    config = json.loads((foreign / "config.json").read_text())
    config["vocab_size"] = 97
    (foreign / "config.json").write_text(json.dumps(config))
    with pytest.raises(RunnerError, match="draft_model cannot serve this model: its vocabulary has 97"):
        make_runner(target, **spec_fields("draft", 2, foreign))


@pytest.mark.skipif(not (TINY / "draft" / "config.json").is_file(), reason="tiny trained models not committed yet")
def test_trained_tiny_pair_greedy_acceptance():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TINY / "target")
    texts = ["What does os.path.join do?", "Return the number of items", "Open the file and read"]
    reqs = []
    for i, text in enumerate(texts):
        ids = chat_prompt_ids(tok, [{"role": "user", "content": text}])
        reqs.append((str(i), ids, SamplingParams(temperature=0, max_tokens=32)))
    plain, _ = run_engine(make_runner(TINY / "target", max_num_seqs=3, max_model_len=256, max_context_length=128),
                          reqs, eos=[2])
    runner = make_runner(TINY / "target", max_num_seqs=3, max_model_len=256, max_context_length=128,
                         **spec_fields("draft", 4, TINY / "draft"))
    spec, engine = run_engine(runner, reqs, eos=[2])
    assert spec == plain
    s = engine.stats
    assert s.spec_accepted_tokens_total / s.spec_draft_tokens_total >= 0.15
    assert torch.tensor(s.spec_accepted_per_position).diff().le(0).all()  # later positions accept less often


def test_rows_that_want_logprobs_get_them_in_a_speculative_step(tiny_checkpoint):
    target = tiny_checkpoint("llama")
    runner = make_runner(target, max_num_seqs=2, sampling={"on_device": False}, **spec_fields("draft", 3, target))
    greedy = [RowSampling(1, 1.0, 1.0, None)] * 2
    first = runner.prefill(PrefillBatch([0, 1], [[1, 2, 3], [4, 5]], greedy)).token_ids
    out = runner.decode(DecodeBatch([0, 1], [first[0][0], first[1][0]], [3, 2], greedy,
                                    num_spec_tokens=[3, 0], num_logprobs=[None, 2]))
    assert len(out.token_ids[0]) == 4 and len(out.token_ids[1]) == 1  # the draft is the target: all accepted
    assert out.logprobs[0] is None and len(out.logprobs[1]) == 1 and len(out.logprobs[1][0].top) == 2
    assert out.num_draft_tokens == [3, 0]
