"""Mutations of the sampling and speculative-verification math (the runtime's spec_decode/ and sampling/)."""

from .definition import Mutation
from .selections import DISTRIBUTION, INVARIANCE, PROCESSORS, SAMPLER

MUTATIONS = [
    Mutation(
        "verify: bonus token drawn from position k_i-1 instead of k_i", "spec_decode/verify.py",
        "emitted.append(int(draw(ids[r, k_i][None], p_all[r, k_i][None], [gen])[0]))  # bonus",
        "emitted.append(int(draw(ids[r, k_i - 1][None], p_all[r, k_i - 1][None], [gen])[0]))  # bonus",
        DISTRIBUTION,
    ),
    Mutation(
        "verify: every draft position checked against position 0's target", "spec_decode/verify.py",
        "p, cand = p_all[r, j], ids[r, j]  # [K] each",
        "p, cand = p_all[r, 0], ids[r, 0]  # [K] each",
        DISTRIBUTION,
    ),
    Mutation(
        "draft: q without the row's top-k/top-p/temperature (softmax of raw logits)", "spec_decode/draft.py",
        "draft_probs[q_index, j] = target_probs(logits[q_index], params[q_rows], self.global_top_k)",
        "draft_probs[q_index, j] = torch.softmax(logits[q_index].float(), dim=-1)",
        DISTRIBUTION,
    ),
    Mutation(
        "verify: residual p instead of normalised (p - q)+", "spec_decode/verify.py",
        "residual = (p - q).clamp_min(0.0)  # draw() normalises",
        "residual = p  # draw() normalises",
        DISTRIBUTION,
    ),
    Mutation(
        "verify: acceptance min(1, q/p) instead of min(1, p/q)", "spec_decode/verify.py",
        "if uniforms[j] * q_x < p_x:",
        "if uniforms[j] * p_x < q_x:",
        DISTRIBUTION,
    ),
    Mutation(
        "sampler: top-p applied before temperature", "sampling/sampler.py",
        "probs = torch.softmax(scaled, dim=-1)  # [B, K]",
        'probs = torch.softmax(values.masked_fill(rank >= top_k, float("-inf")), dim=-1)  # [B, K]',
        SAMPLER,
    ),
    Mutation(
        "sampler: top-p drops the candidate crossing the threshold (NxDI's rule)", "sampling/sampler.py",
        "beyond_nucleus = (mass_before >= top_p) & (top_p < 1.0)  # [B, K]",
        "beyond_nucleus = (mass_before + probs > top_p) & (rank > 0) & (top_p < 1.0)  # [B, K]",
        SAMPLER,
    ),
    Mutation(
        "sampler: rows draw from another row's generator", "sampling/sampler.py",
        "tokens[index] = draw(candidate_ids, candidate_logprobs.exp(), [generators[i] for i in sampled])",
        "tokens[index] = draw(candidate_ids, candidate_logprobs.exp(), [generators[i] for i in reversed(sampled)])",
        INVARIANCE,
    ),
    Mutation(
        "processors: presence penalty applied per occurrence", "sampling/processors.py",
        '- column("presence_penalty") * (counts > 0)',
        '- column("presence_penalty") * counts',
        PROCESSORS,
    ),
    Mutation(
        "processors: repetition penalty ignores the prompt", "sampling/processors.py",
        "seen = in_prompt | (counts > 0)",
        "seen = counts > 0",
        PROCESSORS,
    ),
    Mutation(
        "processors: negative logits divided by the repetition penalty", "sampling/processors.py",
        "torch.where(sub > 0, sub / repetition, sub * repetition)",
        "sub / repetition",
        PROCESSORS,
    ),
    Mutation(
        "processors: logit_bias replaces the logit instead of adding to it", "sampling/processors.py",
        "out.index_put_((row_idx, token_idx), bias, accumulate=True)",
        "out.index_put_((row_idx, token_idx), bias, accumulate=False)",
        PROCESSORS,
    ),
]
