"""The sampler's semantics against an independent reference: transformers' own logits warpers on real logits.

The reference is the committed tiny target (vocabulary 4096, larger than the runner's global top-k of 256) run by
transformers, its next-token logits processed by `TopKLogitsWarper(256)` (the global top-k), then
`TemperatureLogitsWarper`, `TopKLogitsWarper`, `TopPLogitsWarper`: temperature first, then top-k, then top-p, the
order vLLM and transformers use, with the nucleus keeping the token that crosses top_p. `processed_logprobs` and
`target_probs` must keep exactly the same tokens with the same probabilities; settings where the order matters
(temperature 0.5 and 2.0 with top_p 0.8) make applying top-p before temperature fail. Then `sample` is checked to draw
from that distribution (chi-square over many draws, one generator per row, the settings mixed in one batch).
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from runtime_tests.helpers.statistics import ALPHA, goodness_of_fit  # noqa: E402
from neuronmodel_runtime.sampling.params import RowSampling  # noqa: E402
from neuronmodel_runtime.sampling.sampler import processed_logprobs, sample, target_probs  # noqa: E402
from neuronmodel_runtime.sampling.tensors import sampling_tensor  # noqa: E402

TINY = Path(__file__).resolve().parents[2] / "assets" / "tiny" / "target"
GLOBAL_TOP_K = 256

pytestmark = pytest.mark.skipif(not (TINY / "config.json").is_file(), reason="tiny model not committed")

TEXTS = ["def read_config(path):\n    \"\"\"Return the", "The number of items in the", "Open the file and",
         "Return a list of"]

#: (top_k, top_p, temperature): RowSampling's fields; top_k -1 = the global top-k only.
SETTINGS = [
    (-1, 1.0, 1.0),  # the global top-k alone
    (-1, 0.8, 0.5),  # order matters: the nucleus of the tempered distribution is smaller than the raw one's
    (-1, 0.8, 2.0),  # ... and larger
    (-1, 0.95, 1.0),
    (-1, 0.3, 1.3),
    (40, 1.0, 0.7),
    (12, 0.9, 1.5),  # top-k, then top-p inside it
    (200, 0.5, 0.9),
    (1, 1.0, 1.0),  # greedy
]


def hf_warpers(top_k: int, top_p: float, temperature: float) -> list:
    warpers = [transformers.TopKLogitsWarper(GLOBAL_TOP_K), transformers.TemperatureLogitsWarper(temperature)]
    if top_k > 0:
        warpers.append(transformers.TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(transformers.TopPLogitsWarper(top_p))
    return warpers


def hf_probs(logits: "torch.Tensor", setting: tuple) -> "torch.Tensor":
    """`[N, V]` probabilities transformers samples from (greedy: one-hot at the argmax)."""
    if setting[0] == 1:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).double()
    scores = logits.float()
    for warper in hf_warpers(*setting):
        scores = warper(None, scores)
    return torch.softmax(scores, dim=-1).double()


@pytest.fixture(scope="module")
def real_logits() -> "torch.Tensor":
    """`[16, 4096]` float32 next-token logits of the tiny target (transformers): the last 4 positions of each text."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(TINY)
    model = transformers.LlamaForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    rows = []
    with torch.no_grad():
        for text in TEXTS:
            ids = torch.tensor([tokenizer.encode(text)])
            rows.append(model(ids).logits[0, -4:])  # [4, V]
    return torch.cat(rows).float()


def params_for(settings: list[tuple]) -> "torch.Tensor":
    return sampling_tensor([RowSampling(k, p, t, None) for k, p, t in settings], GLOBAL_TOP_K)


def test_processed_distribution_equals_transformers_warpers(real_logits):
    """Every setting on every row, all in one batch: same kept tokens, probabilities within 1e-6."""
    n = real_logits.shape[0]
    settings = [s for s in SETTINGS for _ in range(n)]
    logits = real_logits.repeat(len(SETTINGS), 1)  # [S*R, V]: setting-major
    probs = target_probs(logits, params_for(settings), GLOBAL_TOP_K).double()  # [S*R, V]
    ids, logprobs = processed_logprobs(logits, params_for(settings), GLOBAL_TOP_K)
    assert ids.shape == (len(settings), GLOBAL_TOP_K)
    for s_index, setting in enumerate(SETTINGS):
        rows = slice(s_index * n, (s_index + 1) * n)
        expected = hf_probs(real_logits, setting)  # [R, V]
        got = probs[rows]
        for r in range(n):
            kept, want = set(got[r].nonzero().flatten().tolist()), set(expected[r].nonzero().flatten().tolist())
            assert kept == want, (setting, r, len(kept), len(want), sorted(kept ^ want)[:10])
        assert torch.allclose(got, expected, atol=1e-6, rtol=0), (setting, float((got - expected).abs().max()))
        if setting[0] != 1:  # the candidate view agrees with the scattered one: -inf exactly where dropped
            cand = logprobs[rows].double().exp()
            assert torch.allclose(cand, expected.gather(1, ids[rows]), atol=1e-6, rtol=0), setting
    # The settings are not vacuous: the nucleus really depends on the temperature, and every filter drops tokens.
    sizes = {s: int((hf_probs(real_logits, s) > 0).sum()) for s in SETTINGS}
    assert sizes[(-1, 0.8, 0.5)] < sizes[(-1, 0.8, 2.0)]
    assert all(size < n * GLOBAL_TOP_K for s, size in sizes.items() if s != (-1, 1.0, 1.0))
    assert sizes[(-1, 1.0, 1.0)] == n * GLOBAL_TOP_K  # the global top-k of a 4096-token vocabulary


def test_top_p_is_applied_after_temperature(real_logits):
    """The nucleus at temperature 0.5 / 2.0 differs from the one at temperature 1, and the sampler follows the
    tempered one (the order vLLM and transformers use)."""
    for temperature in (0.5, 2.0):
        setting = (-1, 0.8, temperature)
        tempered = hf_probs(real_logits, setting) > 0
        untempered = hf_probs(real_logits, (-1, 0.8, 1.0)) > 0
        assert (tempered != untempered).any(dim=-1).all()  # every row: the order decides which tokens are kept
        got = target_probs(real_logits, params_for([setting] * real_logits.shape[0]), GLOBAL_TOP_K) > 0
        assert torch.equal(got, tempered)


def test_sample_draws_from_the_reference_distribution(real_logits):
    """Chi-square goodness of fit of 3000 draws per row against transformers' distribution; every setting in one
    batch, one generator per row; no draw ever falls outside the kept tokens."""
    rows = [(r, s) for r, s in [(0, SETTINGS[1]), (5, SETTINGS[2]), (9, SETTINGS[4]), (14, SETTINGS[6]),
                                (3, SETTINGS[5]), (7, SETTINGS[8]), (11, SETTINGS[0])]]
    logits = real_logits[[r for r, _ in rows]]
    params = params_for([s for _, s in rows])
    generators = [torch.Generator().manual_seed(1000 + i) for i in range(len(rows))]
    draws = 3000
    tokens = torch.stack([sample(logits, params, generators, GLOBAL_TOP_K) for _ in range(draws)], dim=1)  # [R, N]
    for i, (r, setting) in enumerate(rows):
        expected = hf_probs(real_logits[r : r + 1], setting)[0]
        fit = goodness_of_fit(tokens[i].tolist(), dict(enumerate(expected.tolist())))
        assert not fit["impossible"], (setting, fit["impossible"])
        assert fit["p"] > ALPHA, (setting, fit)
        if setting[0] == 1:
            assert set(tokens[i].tolist()) == {int(real_logits[r].argmax())}
