"""Speculative decoding emits exactly the target's sampling distribution: the specification every speculating runner
(the torch reference here; the NxDI / TNx adapters against the same numbers) is checked against.

Through the real Engine and the torch reference runner, thousands of seeded requests (three sampling settings mixed in
every batch) generate their first three tokens with speculation on. Their frequencies are compared with the EXACT
distribution, computed independently: the same checkpoint loaded with transformers' `LlamaForCausalLM`, processed by
transformers' own `TemperatureLogitsWarper`, `TopKLogitsWarper` and `TopPLogitsWarper` (vLLM's order), and enumerated
over every (1st, 2nd) prefix. A chi-square goodness-of-fit test (small cells pooled) checks the three marginals and the
(1st, 2nd) and (2nd, 3rd) pairs of each setting; a token outside the exact support fails at once.

Sizes: each of the 45 checks fails correct code with probability ALPHA = 1e-4 (about 0.5% for the file; the seeds are
fixed, so a given build passes or fails deterministically). With 3000 requests per setting, the correct code's smallest
p-value is about 1e-2, while each verification mistake scripts/mutation.py injects gives p-values below 1e-15 in several
checks (chi-square in the hundreds to thousands, and tokens outside the support).

Design, so that every part of verification is exercised:
- a 32-token random llama target with peaked logits, and a draft that is the target with noisy weights (the same
  vocabulary; about 2/3 of the drafts are accepted, so acceptance, rejection and bonus paths all carry weight);
- k = 2; requests alternate max_tokens 3 and 4, so the first speculative step proposes k_i = 1 (the 3rd token may be
  the bonus) or k_i = 2 (the 3rd token is checked against the second draft position);
- prompt lookup (n-grams from 1 token) on a prompt that is the target's own greedy continuation, so proposals exist
  and are often right (about 30% accepted); its q is one-hot.
"""

from __future__ import annotations

import copy
from typing import Callable, Optional

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from runtime_tests.helpers.fakes_runner import ByteTokenizer  # noqa: E402
from runtime_tests.helpers.runner_helpers import make_runner  # noqa: E402
from runtime_tests.helpers.statistics import ALPHA, chi2_sf, goodness_of_fit  # noqa: E402
from neuronmodel_runtime.engine.engine import Engine  # noqa: E402
from neuronmodel_runtime.engine.speculation import build_speculation  # noqa: E402
from neuronmodel_runtime.sampling.params import SamplingParams  # noqa: E402

VOCAB = 32
GLOBAL_TOP_K = 256  # the runner's default sampling.global_top_k
K = 2  # num_speculative_tokens
PROMPT_LEN = 10
#: Per-check false-failure probability of correct code (chi-square upper tail).
#: Requests per sampling setting and speculation mode.
PER_SETTING = 3000
SLOTS = 512

#: name -> SamplingParams fields (the transformers warpers take the same values). Mixed in every batch.
SETTINGS = {
    "plain": dict(temperature=1.0),
    "top_k": dict(temperature=0.7, top_k=5),
    "top_p": dict(temperature=1.5, top_p=0.8),
}


def test_chi2_sf_matches_tabulated_quantiles():
    for x, dof, p in [(10.828, 1, 1e-3), (3.841, 1, 0.05), (13.816, 2, 1e-3), (29.588, 10, 1e-3), (135.807, 100, 0.01),
                      (1.0, 4, 0.909796), (100.0, 3, 1.54e-21)]:
        assert chi2_sf(x, dof) == pytest.approx(p, rel=2e-3), (x, dof)


# ---------------------------------------------------------------------------------------------------------------
# The models, and the exact reference distribution from transformers.


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple:
    """(target folder, draft folder, prompt): a peaked 32-token llama, and the same weights with 15% noise."""
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.3, bos_token_id=None,
        eos_token_id=None, pad_token_id=0, tie_word_embeddings=False,
    )
    torch.manual_seed(11)
    target = transformers.LlamaForCausalLM(config).eval()
    draft = copy.deepcopy(target)
    noise = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for param in draft.parameters():
            param += 0.15 * param.std() * torch.randn(param.shape, generator=noise)
        seq = [1]  # the prompt: the target's greedy continuation of token 1 (it repeats itself: lookups find matches)
        for _ in range(PROMPT_LEN):
            seq.append(int(target(torch.tensor([seq])).logits[0, -1].argmax()))
    folders = tmp_path_factory.mktemp("spec-target"), tmp_path_factory.mktemp("spec-draft")
    target.save_pretrained(folders[0])
    draft.save_pretrained(folders[1])
    return folders[0], folders[1], seq[1:]


def hf_warpers(fields: dict, vocab: int) -> list:
    """transformers' own warpers for one setting, in vLLM's (and transformers') order; the runner's global top-k
    first when the vocabulary is larger (top-k commutes with temperature, so its place does not matter)."""
    warpers = [transformers.TopKLogitsWarper(GLOBAL_TOP_K)] if vocab > GLOBAL_TOP_K else []
    warpers.append(transformers.TemperatureLogitsWarper(fields.get("temperature", 1.0)))
    if fields.get("top_k", -1) > 0:
        warpers.append(transformers.TopKLogitsWarper(fields["top_k"]))
    if fields.get("top_p", 1.0) < 1.0:
        warpers.append(transformers.TopPLogitsWarper(fields["top_p"]))
    return warpers


def hf_probs(model, contexts: list[list[int]], warpers: list) -> "torch.Tensor":
    """`[N, V]` float64 next-token probabilities of each context after the warpers (equal-length contexts)."""
    with torch.no_grad():
        ids = torch.tensor(contexts)
        scores = model(ids).logits[:, -1].float()
        for warper in warpers:
            scores = warper(ids, scores)
        return torch.softmax(scores, dim=-1).double()


@pytest.fixture(scope="module")
def exact(pair) -> dict:
    """name -> `[V, V, V]` exact joint probabilities of the first three tokens, from transformers."""
    model = transformers.LlamaForCausalLM.from_pretrained(pair[0], dtype=torch.float32).eval()
    prompt = pair[2]
    out = {}
    for name, fields in SETTINGS.items():
        warpers = hf_warpers(fields, VOCAB)
        p1 = hf_probs(model, [prompt], warpers)[0]  # [V]
        p2 = hf_probs(model, [prompt + [a] for a in range(VOCAB)], warpers)  # [V, V]: row t1
        p3 = torch.zeros(VOCAB, VOCAB, VOCAB, dtype=torch.float64)
        prefixes = [(a, b) for a in range(VOCAB) for b in range(VOCAB) if p1[a] * p2[a, b] > 0]
        p3[tuple(zip(*prefixes))] = hf_probs(model, [prompt + [a, b] for a, b in prefixes], warpers)
        out[name] = p1[:, None, None] * p2[:, :, None] * p3
    return out


VIEWS: dict[str, tuple[Callable, Callable]] = {  # name -> (sample -> cell, joint -> {cell: probability})
    "1st": (lambda s: s[0], lambda j: dict(enumerate(j.sum((1, 2)).tolist()))),
    "2nd": (lambda s: s[1], lambda j: dict(enumerate(j.sum((0, 2)).tolist()))),
    "3rd": (lambda s: s[2], lambda j: dict(enumerate(j.sum((0, 1)).tolist()))),
    "(1st,2nd)": (lambda s: s[:2], lambda j: _cells(j.sum(2))),
    "(2nd,3rd)": (lambda s: s[1:], lambda j: _cells(j.sum(0))),
}


def _cells(matrix: "torch.Tensor") -> dict:
    return {(a, b): p for a, row in enumerate(matrix.tolist()) for b, p in enumerate(row)}


# ---------------------------------------------------------------------------------------------------------------
# Sampling through the engine.


def engine_for(runner) -> Engine:
    return Engine(runner, ByteTokenizer(), set(), max_num_batched_tokens=SLOTS * PROMPT_LEN,
                  speculation=build_speculation(runner.config.speculation, runner))


def sample_first_tokens(pair, speculation: Optional[dict], seed_base: int) -> tuple[dict, Engine]:
    """name -> list of first-three-token tuples, PER_SETTING requests per setting, settings interleaved."""
    target, draft, prompt = pair
    fields = {} if speculation is None else {"speculation": speculation}
    runner = make_runner(target, max_num_seqs=SLOTS, max_model_len=PROMPT_LEN + 6, max_context_length=PROMPT_LEN,
                         **fields)
    engine = engine_for(runner)
    names = list(SETTINGS)
    for i in range(PER_SETTING):
        for s, name in enumerate(names):
            params = SamplingParams(**SETTINGS[name], seed=seed_base + i * len(names) + s, max_tokens=3 + i % 2)
            engine.add(engine.make_request(f"{name}/{i}", prompt, params))
    tokens: dict[str, list[int]] = {}

    def emit(outs):
        for out in outs:
            tokens.setdefault(out.request_id, []).extend(out.token_ids)

    while engine.has_work:
        engine.step(emit)
    by_setting: dict[str, list[tuple]] = {name: [] for name in names}
    for rid, toks in tokens.items():
        assert len(toks) >= 3, (rid, toks)
        by_setting[rid.split("/")[0]].append(tuple(toks[:3]))
    return by_setting, engine


def check_against_exact(by_setting: dict, exact: dict, label: str) -> None:
    """Every view of every setting against the exact joint; prints the whole table, then asserts."""
    lines, failures = [], []
    for name, samples in by_setting.items():
        for view, (cell_of, cells) in VIEWS.items():
            fit = goodness_of_fit([cell_of(s) for s in samples], cells(exact[name]))
            line = (f"{label} {name:6s} {view:10s} n={fit['n']} chi2={fit['chi2']:9.1f} dof={fit['dof']:3d} "
                    f"p={fit['p']:.2e}" + (f" IMPOSSIBLE {dict(list(fit['impossible'].items())[:5])}"
                                           if fit["impossible"] else ""))
            lines.append(line)
            if fit["impossible"] or fit["p"] < ALPHA:
                failures.append(line)
    print("\n".join(lines))
    assert not failures, "the emitted tokens do not follow the target distribution:\n" + "\n".join(failures)


SPECULATION = {
    "draft": lambda pair: {"mode": "draft", "num_speculative_tokens": K, "draft_model": str(pair[1])},
    "promptLookup": lambda pair: {"mode": "promptLookup", "num_speculative_tokens": K, "prompt_lookup_min": 1},
}


@pytest.mark.parametrize("mode", ["draft", "promptLookup"])
def test_speculative_sampling_emits_the_exact_target_distribution(pair, exact, mode):
    by_setting, engine = sample_first_tokens(pair, SPECULATION[mode](pair), seed_base={"draft": 0,
                                                                                       "promptLookup": 10**6}[mode])
    s = engine.stats
    rate = s.spec_accepted_tokens_total / max(s.spec_draft_tokens_total, 1)
    print(f"{mode}: {s.spec_drafts_total} speculative steps, {s.spec_draft_tokens_total} drafts, "
          f"acceptance {rate:.2f}, "
          f"accepted per position {s.spec_accepted_per_position}")
    check_against_exact(by_setting, exact, mode)
    # The checks only mean something if most rows speculated and drafts were both accepted (at both positions) and
    # rejected often (checked after the distribution, so that a broken verifier is reported by the distribution).
    assert s.spec_drafts_total >= PER_SETTING * len(SETTINGS) * 3 // 4
    assert 0.2 <= rate <= 0.8, rate
    assert min(s.spec_accepted_per_position) >= PER_SETTING // 20, s.spec_accepted_per_position


def test_plain_sampling_emits_the_exact_target_distribution(pair, exact):
    """The reference itself (no speculation): the runner's sampler against transformers' warpers."""
    by_setting, _ = sample_first_tokens(pair, None, seed_base=2 * 10**6)
    check_against_exact(by_setting, exact, "none")
