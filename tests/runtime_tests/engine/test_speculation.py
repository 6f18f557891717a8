"""Speculative decoding on the reference runner, end to end through the engine.

Greedy: outputs are token-for-token those of plain decoding. Sampled: the output distribution is the target's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from runtime_tests.helpers.runner_helpers import make_runner
from runtime_tests.helpers.statistics import ALPHA, chi2_sf
from runtime_tests.helpers.engine_runs import prompts, run_engine, spec_engine, spec_fields
from neuronmodel_runtime.server.tokenizer import chat_prompt_ids
from neuronmodel_runtime.runners.base import RunnerError
from neuronmodel_runtime.sampling.params import SamplingParams

TINY = Path(__file__).resolve().parents[2] / "assets" / "tiny"


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


#: A prompt of 32 distinct tokens: one-token prompt lookup proposes whenever the newest token is one of them.
DISTRIBUTION_PROMPT = [(7 * i) % 96 for i in range(1, 33)]


def first_tokens(runner, settings, per, length, seed_base):
    """Through the Engine: `per` seeded requests per setting (interleaved, so every batch mixes them) of
    DISTRIBUTION_PROMPT; per setting, the tuples of their first `length` tokens."""
    reqs = [(f"{s}/{i}", DISTRIBUTION_PROMPT, SamplingParams(**fields, seed=seed_base + i * len(settings) + s,
                                                            max_tokens=length))
            for i in range(per) for s, fields in enumerate(settings)]
    outputs, engine = run_engine(runner, reqs)
    by_setting = [[tuple(outputs[f"{s}/{i}"]) for i in range(per)] for s in range(len(settings))]
    assert all(len(t) == length for seqs in by_setting for t in seqs)
    return by_setting, engine


@pytest.mark.parametrize("mode", ["draft", "promptLookup"])
def test_sampled_speculation_preserves_the_distribution(tiny_checkpoint, mode):
    """Per sampling setting, the 2nd and 3rd tokens' marginals and the (2nd, 3rd) pairs of speculative sampling
    match plain (non-speculative) sampling of the same runner, through the real Engine: a second model pair (the
    96-token random llama target, the qwen2 draft, which is rejected often) beside the exact-distribution test of
    test_spec_distribution.py. The batch mixes plain, top_k and top_p rows, so per-row processing is exercised together.
    """
    target = tiny_checkpoint("llama")
    settings = [dict(temperature=1.0), dict(top_k=8, temperature=0.8), dict(top_p=0.7, temperature=1.3)]
    per, size = 340, dict(max_num_seqs=256, max_model_len=40, max_context_length=32)
    plain, _ = first_tokens(make_runner(target, **size), settings, per, 4, seed_base=0)
    if mode == "draft":
        fields = spec_fields("draft", 3, tiny_checkpoint("qwen2"))
    else:  # one-token n-grams, so that the repetitive prompt always offers a proposal
        fields = {"speculation": {"mode": "promptLookup", "num_speculative_tokens": 3, "prompt_lookup_min": 1}}
    spec, engine = first_tokens(make_runner(target, **size, **fields), settings, per, 4, seed_base=10**6)
    assert engine.stats.spec_drafts_total >= per * len(settings) // 4  # many rows did speculate
    for s_index in range(len(settings)):
        a, b = plain[s_index], spec[s_index]
        for view in (lambda s: s[1], lambda s: s[2], lambda s: s[1:3]):
            chi2, dof = two_sample_chi2([view(s) for s in a], [view(s) for s in b])
            assert dof == 0 or chi2_sf(chi2, dof) > ALPHA, (s_index, chi2, dof, chi2_sf(chi2, dof))


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
    """In one engine step, a row with logprobs decodes one token with its logprobs while its neighbour speculates."""
    target = tiny_checkpoint("llama")
    host = {"sampling": {"on_device": False}}
    reqs = [("spec", [1, 2, 3], SamplingParams(temperature=0, max_tokens=9)),
            ("logprobs", [4, 5], SamplingParams(temperature=0, max_tokens=9, logprobs=2))]
    plain, _ = run_engine(make_runner(target, max_num_seqs=2, **host), reqs)
    engine = spec_engine(make_runner(target, max_num_seqs=2, **host, **spec_fields("draft", 3, target)))
    for rid, prompt, params in reqs:
        engine.add(engine.make_request(rid, prompt, params))
    steps = []  # per step: request id -> (tokens, logprobs) emitted
    while engine.has_work:
        emitted = {}
        engine.step(lambda outs: emitted.update({o.request_id: (o.token_ids, o.logprobs) for o in outs}))
        steps.append(emitted)
    assert {rid: [t for step in steps for t in step.get(rid, ([], None))[0]] for rid, _, _ in reqs} == plain
    decode = steps[1]  # the first decode step: the draft is the target, so all 3 drafts are accepted
    assert len(decode["spec"][0]) == 4 and decode["spec"][1] is None
    tokens, logprobs = decode["logprobs"]
    assert len(tokens) == 1 and len(logprobs) == 1 and len(logprobs[0].top) == 2
    everything = [lp for step in steps for lp in (step.get("logprobs", ([], None))[1] or [])]
    assert len(everything) == 9 and all(len(lp.top) == 2 for lp in everything)
    assert engine.stats.spec_accepted_tokens_total == engine.stats.spec_draft_tokens_total > 0


PROBE_PROMPT = [7, 30, 41, 7, 30, 41, 7, 30]  # repetitive: prompt lookup proposes


def batch_mates(n, stop=7):
    """Requests of every kind around a probe: greedy and sampled rows that speculate, rows that never speculate
    (logprobs, penalties, logit_bias, min_tokens), and different lengths so that slots free at different steps."""
    kinds = [
        SamplingParams(temperature=0, max_tokens=10),
        SamplingParams(temperature=1.0, seed=11, max_tokens=14),
        SamplingParams(top_k=5, temperature=0.6, seed=12, max_tokens=6),
        SamplingParams(temperature=0.9, seed=13, max_tokens=12, logprobs=3),
        SamplingParams(temperature=1.1, seed=14, max_tokens=9, frequency_penalty=0.5, repetition_penalty=1.3),
        SamplingParams(temperature=0, max_tokens=8, logit_bias=((30, 2.0),)),
        SamplingParams(top_p=0.8, temperature=1.2, seed=15, max_tokens=11, min_tokens=4, stop_token_ids=(stop,)),
    ]
    return [(f"mate{i}", prompts(n, seed=3)[i] or [1], kinds[i % len(kinds)]) for i in range(n)]


@pytest.mark.parametrize("mode", ["draft", "promptLookup"])
@pytest.mark.parametrize("probe", [
    SamplingParams(temperature=1.2, top_p=0.9, seed=1234, max_tokens=16),
    SamplingParams(temperature=0.8, top_k=6, seed=99, max_tokens=16, logprobs=1),  # never speculates
])
def test_a_seeded_request_samples_the_same_tokens_alone_or_in_any_batch(tiny_checkpoint, mode, probe):
    """A seeded sampled request's tokens do not depend on its batch: alone, among rows that speculate (or not) and
    rows with logprobs, in another slot, or admitted while others run, it gets the same tokens."""
    target = tiny_checkpoint("llama")
    if mode == "draft":
        fields = spec_fields("draft", 3, tiny_checkpoint("qwen2"))
    else:
        fields = {"speculation": {"mode": "promptLookup", "num_speculative_tokens": 3, "prompt_lookup_min": 1}}

    def runner():
        return make_runner(target, max_num_seqs=6, sampling={"on_device": False}, **fields)

    alone, engine = run_engine(runner(), [("probe", PROBE_PROMPT, probe)])
    assert len(alone["probe"]) == 16
    if probe.logprobs is None:
        assert engine.stats.spec_drafts_total > 0  # the probe itself speculated
    mates = batch_mates(7)
    together, engine = run_engine(runner(), mates[:3] + [("probe", PROBE_PROMPT, probe)] + mates[3:])
    assert together["probe"] == alone["probe"]
    assert engine.stats.spec_drafts_total > 0
    # Admitted into a running batch (slot 5, after two steps), while its neighbours finish around it.
    engine = spec_engine(runner())
    for rid, prompt, params in mates[:5]:
        engine.add(engine.make_request(rid, prompt, params))
    got = []

    def emit(outs):
        got.extend(t for o in outs if o.request_id == "probe" for t in o.token_ids)

    engine.step(emit)
    engine.step(emit)
    engine.add(engine.make_request("probe", PROBE_PROMPT, probe))
    for rid, prompt, params in mates[5:]:
        engine.add(engine.make_request(rid, prompt, params))
    while engine.has_work:
        engine.step(emit)
    assert got == alone["probe"]
