"""Verification keeps the target's exact distribution; greedy rows accept exactly the target argmax."""

import pytest
import torch

from neuronmodel_runtime.spec_decode.ngram import propose_ngram
from neuronmodel_runtime.spec_decode.verify import unpad_fused, verify
from neuronmodel_runtime.sampling.sampler import target_probs

GREEDY = [1.0, 1.0, 1.0]


def gens(n, seed=0):
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


def test_greedy_accepts_while_drafts_equal_the_target_argmax():
    logits = torch.full((1, 4, 10), -5.0)
    for j, best in enumerate([3, 4, 5, 6]):
        logits[0, j, best] = 5.0
    drafts = torch.tensor([[3, 4, 9]])
    tokens, n = verify(logits, drafts, [3], torch.tensor([GREEDY]), gens(1), 64)
    assert n.tolist() == [3] and tokens[0, :3].tolist() == [3, 4, 5]  # x3 rejected, recovered = argmax 5
    tokens, n = verify(logits, torch.tensor([[3, 4, 5]]), [3], torch.tensor([GREEDY]), gens(1), 64)
    assert n.tolist() == [4] and tokens[0].tolist() == [3, 4, 5, 6]  # all accepted + bonus


def test_rows_with_fewer_drafts_and_zero_drafts():
    logits = torch.zeros(2, 3, 5)
    logits[:, :, 2] = 3.0
    tokens, n = verify(logits, torch.tensor([[2, 2], [0, 0]]), [1, 0], torch.tensor([GREEDY, GREEDY]), gens(2), 8)
    assert n.tolist() == [2, 1] and tokens.tolist() == [[2, 2, 0], [2, 0, 0]]


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("params", [[-1, 1.0, 1.0], [3, 1.0, 0.7], [-1, 0.8, 1.3]])
def test_emitted_tokens_follow_the_target_distribution(deterministic, params):
    """Chi-square on the first two emitted tokens over many trials; p != q on purpose."""
    torch.manual_seed(0)
    vocab, k, trials = 6, 2, 6000
    target = torch.randn(1, k + 1, vocab) * 1.5
    draft_logits = torch.randn(1, k, vocab) * 1.5
    p0 = target_probs(target[:, 0], torch.tensor([params]), 64)[0]
    q = target_probs(draft_logits.view(k, vocab), torch.tensor([params] * k), 64).view(1, k, vocab)
    gen = torch.Generator().manual_seed(123)
    if deterministic:
        drafts, dprobs = torch.tensor([[2, 4]]).repeat(trials, 1), None
    else:
        drafts = torch.stack([torch.multinomial(q[0, j], trials, replacement=True, generator=gen) for j in range(k)], 1)
        dprobs = q.expand(trials, k, vocab)
    tokens, _ = verify(target.expand(trials, k + 1, vocab), drafts, [k] * trials, torch.tensor([params] * trials),
                       gens(trials, seed=99), 64, dprobs)
    counts = torch.bincount(tokens[:, 0], minlength=vocab).float()
    expected = p0 * trials
    keep = expected > 5
    chi2 = float((((counts - expected) ** 2)[keep] / expected[keep]).sum())
    assert counts[~keep].sum() <= 5 * max(int((~keep).sum()), 1)
    assert chi2 < 20.5, chi2  # chi-square(5 dof) at p = 0.999 is 20.5


def test_unpad_uses_positions_not_padding_because_zero_is_a_token():
    tokens = torch.tensor([[0, 0, 0], [7, 0, 0], [5, 6, 0]])
    assert unpad_fused(tokens, [10, 3, 8], torch.tensor([[13], [4], [10]])) == [[0, 0, 0], [7], [5, 6]]
    with pytest.raises(ValueError, match="expected 1..3"):
        unpad_fused(tokens, [10, 3, 8], torch.tensor([[10], [4], [10]]))


def test_prompt_lookup_continues_the_latest_match_of_the_longest_ngram():
    seq = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert propose_ngram(seq, 3, 2, 4) == [7, 8, 5]  # latest earlier "1 2 3" is followed by 7 8 5
    assert propose_ngram([1, 2, 3, 4], 3, 2, 4) == []
    assert propose_ngram([5, 6, 5, 6], 4, 1, 2) == [5, 6]  # stops at the end of the sequence
    assert propose_ngram(seq, 0, 2, 4) == []
