"""The on-device sampler: exact greedy, the top-k / top-p / temperature processing, per-row generators."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from neuronmodel_runtime.sampling.sampler import processed_logprobs, sample, target_probs  # noqa: E402


#: Chi-square critical values at p = 0.001, by degrees of freedom.
CHI2_CRITICAL_P001 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}


def gens(*seeds: int) -> list:
    return [torch.Generator().manual_seed(s) for s in seeds]


def params(*rows: tuple) -> "torch.Tensor":
    return torch.tensor(rows, dtype=torch.float32)


def entropy(logprobs: "torch.Tensor") -> float:
    p = logprobs.exp()
    return float(-(p * logprobs.nan_to_num(neginf=0.0)).sum())


def test_greedy_is_exact_argmax_with_ties_to_the_lowest_id():
    logits = torch.tensor([[0.0, 1.0, 3.0, -1.0, 3.0, 2.0], [5.0, 5.0, 5.0, 5.0, 5.0, 5.0]])
    out = sample(logits, params((1, 0.1, 0.01), (1, 1.0, 1.0)), gens(0, 1), global_top_k=3)
    assert out.tolist() == [2, 0]
    assert torch.equal(out, torch.argmax(logits, dim=-1))


def test_greedy_rows_do_not_depend_on_temperature_or_generator():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    a = sample(logits, params(*[(1, 0.5, 9.0)] * 4), gens(1, 2, 3, 4), global_top_k=8)
    assert torch.equal(a, torch.argmax(logits, dim=-1))


def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.tensor([[0.1, 0.9, 0.3, 0.7, 0.5, 0.2]])
    ids, logprobs = processed_logprobs(logits, params((3, 1.0, 1.0)), global_top_k=5)
    assert ids.shape == (1, 5)
    kept = ids[logprobs.isfinite()].tolist()
    assert sorted(kept) == [1, 3, 4]
    drawn = {int(sample(logits, params((3, 1.0, 1.0)), gens(s), 5)) for s in range(200)}
    assert drawn == {1, 3, 4}


def test_global_top_k_bounds_every_row_and_minus_one_means_all_candidates():
    logits = torch.arange(10.0).unsqueeze(0)
    probs = target_probs(logits, params((-1, 1.0, 100.0)), global_top_k=4)
    assert (probs[0, :6] == 0).all() and (probs[0, 6:] > 0.2).all()


@pytest.mark.parametrize("top_p, kept", [(0.7, {0, 1}), (0.5, {0}), (0.81, {0, 1, 2}), (1e-6, {0}), (1.0, {0, 1, 2, 3})])
def test_top_p_keeps_the_smallest_prefix_reaching_the_mass(top_p, kept):
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    ids, logprobs = processed_logprobs(logits, params((-1, top_p, 1.0)), global_top_k=4)
    assert set(ids[logprobs.isfinite()].tolist()) == kept
    assert logprobs.exp().sum().item() == pytest.approx(1.0, abs=1e-6)


def test_temperature_orders_entropy():
    logits = torch.randn(1, 64, generator=torch.Generator().manual_seed(3))
    h = [entropy(processed_logprobs(logits, params((-1, 1.0, t)), 64)[1]) for t in (0.25, 0.5, 1.0, 2.0)]
    assert h == sorted(h) and h[0] < h[-1] - 0.5


def test_target_probs_is_the_scattered_processed_distribution():
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(5))
    p = params((5, 0.9, 0.8), (1, 1.0, 1.0), (-1, 1.0, 1.3))
    probs = target_probs(logits, p, global_top_k=16)
    assert probs.shape == (3, 40)
    assert torch.allclose(probs.sum(-1), torch.ones(3), atol=1e-6)
    ids, logprobs = processed_logprobs(logits, p, 16)
    assert torch.allclose(probs[0].gather(0, ids[0]), logprobs[0].exp())
    assert probs[1].tolist() == torch.nn.functional.one_hot(logits[1].argmax(), 40).float().tolist()


def test_seeded_rows_reproduce_and_different_seeds_differ():
    logits = torch.zeros(1, 1000)
    draws = lambda seed: [int(sample(logits, params((-1, 1.0, 1.0)), [g], 1000)) for g in gens(seed) * 20]  # noqa: E731
    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_a_row_samples_the_same_alone_or_batched():
    """A row uses only its own logits and generator, so its output never depends on the other rows."""
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(11))
    p = params((-1, 0.95, 1.0), (1, 1.0, 1.0), (20, 1.0, 0.7), (-1, 1.0, 1.5))
    batched_gens, alone_gens = gens(10, 11, 12, 13), gens(10, 11, 12, 13)
    for _ in range(10):
        batched = sample(logits, p, batched_gens, 64).tolist()
        alone = [int(sample(logits[i : i + 1], p[i : i + 1], [alone_gens[i]], 64)) for i in range(4)]
        assert batched == alone


def test_sampled_frequencies_match_the_target_distribution():
    """Chi-square goodness of fit (fixed seeds, so deterministic): 4000 draws, 7 degrees of freedom."""
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -1.5]])
    for row in [(-1, 1.0, 1.0), (-1, 0.9, 0.7), (5, 1.0, 1.2)]:
        p = params(row)
        n = 4000
        tokens = sample(logits.expand(n, -1), p.expand(n, -1), gens(*range(n)), global_top_k=8)
        counts = torch.bincount(tokens, minlength=8).double()
        expected = target_probs(logits, p, 8)[0].double() * n
        support = expected > 0
        assert (counts[~support] == 0).all()
        chi2 = float(((counts[support] - expected[support]) ** 2 / expected[support]).sum())
        dof = int(support.sum()) - 1
        assert chi2 < CHI2_CRITICAL_P001[dof], (row, chi2)


def test_extreme_logits_never_yield_nan_or_masked_tokens():
    logits = torch.tensor([[1e4, -1e4, 0.0, float("-inf")]])
    for seed in range(50):
        assert int(sample(logits, params((-1, 1.0, 1e-3)), gens(seed), 4)) == 0
    two = torch.tensor([[0.0, 0.0, float("-inf"), float("-inf")]]).expand(200, -1)
    tokens = sample(two, params((-1, 1.0, 1.0)).expand(200, -1), gens(*range(200)), 4)
    assert set(tokens.tolist()) == {0, 1}


def test_bfloat16_logits_are_processed_in_float32():
    logits = torch.randn(2, 30, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    out = sample(logits, params((1, 1.0, 1.0), (-1, 1.0, 1.0)), gens(0, 1), 16)
    assert out.dtype == torch.int64 and int(out[0]) == int(logits[0].argmax())
    probs = target_probs(logits, params((-1, 1.0, 1.0), (-1, 1.0, 1.0)), 16)
    assert math.isclose(float(probs.sum()), 2.0, rel_tol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sampling_stays_on_the_logits_device():
    logits = torch.randn(3, 500, device="cuda")
    g = [torch.Generator(device="cuda").manual_seed(i) for i in range(3)]
    out = sample(logits, params((1, 1.0, 1.0), (-1, 0.9, 0.8), (10, 1.0, 1.0)), g, 64)
    assert out.device.type == "cuda" and int(out[0]) == int(logits[0].argmax())
    assert target_probs(logits, params(*[(-1, 1.0, 1.0)] * 3), 64).device.type == "cuda"
