"""Sampling on a Neuron device, as the NxDI and TNx runners share it: the largest global top-k the device takes, what
on-device sampling can honour per request (versus host sampling from the logits), and the tokens a fused speculative
step returns.

Nothing here imports a Neuron library; the runners import theirs lazily, in `load()`.
"""

from __future__ import annotations

from typing import Literal, Sequence

from neuronmodel_runtime.config import RuntimeConfig, named
from neuronmodel_runtime.runners.base import RunnerError
from neuronmodel_runtime.sampling.params import SamplingCapabilities

#: The largest global top-k a Neuron runner compiles into its on-device sampler. vllm-neuron caps it at 256
#: (`_MAX_NEURON_SAMPLING_TOP_K`, "NEURON has an upper limit on the top_k"), as vLLM's TNx speculation runner does;
#: neuronx-distributed's `nxd_topk` (operators/topk.py, Release 2.29 fbac349) states no limit of its own, so the
#: limit is the one vLLM found on the device.
MAX_DEVICE_TOP_K = 256


def check_device_top_k(config: RuntimeConfig) -> None:
    """Refuse a global top-k above the device's limit when sampling on the device (the host sampler has none).

    Raises:
        RunnerError: naming sampling.global_top_k and both fixes.
    """
    top_k = config.sampling.global_top_k
    if config.sampling.on_device and top_k > MAX_DEVICE_TOP_K:
        raise RunnerError(
            f"sampling.global_top_k {top_k} is above {MAX_DEVICE_TOP_K}, the most a Neuron runner's on-device sampler "
            f"takes: set {named('sampling.global_top_k')} to {MAX_DEVICE_TOP_K} or less, or sample on the host "
            f"({named('sampling.on_device')} false)")


def sampling_capabilities(framework: str, on_device: bool, global_top_k: int,
                          top_p_rule: Literal["keep", "drop"], sampled: bool = True) -> SamplingCapabilities:
    """On the device a Neuron runner honours top_k / top_p / temperature only (Neuron's sampler: no generators to
    seed, token ids out, its own top-p boundary rule `top_p_rule`), or greedy decoding only (`sampled` False: fused
    speculation that verifies by argmax); sampling on the host from its logits, it honours everything the reference
    runner does."""
    if not on_device:
        return SamplingCapabilities(framework, max_top_k=global_top_k, top_p_rule="keep", seeds=True, logprobs=True,
                                    penalties=True, logit_bias=True, stop_token_masking=True)
    fix = "start it with sampling.on_device=false (the host samples, from the logits the device returns)"
    if not sampled:
        fix = "send temperature 0, or serve sampled requests from a model without speculation"
    return SamplingCapabilities(
        framework, max_top_k=global_top_k, top_p_rule=top_p_rule, sampled=sampled, seeds=False, logprobs=False,
        penalties=False, logit_bias=False, stop_token_masking=False,
        fixes={name: fix for name in ("sampled", "logprobs", "seeds", "penalties", "logit_bias", "min_tokens")},
    )


def first_tokens(rows: Sequence[Sequence[int]], counts: Sequence[int], wanted: Sequence[int]) -> list[list[int]]:
    """Per row of a fused speculative step, its first `counts[i]` tokens (clamped to 1..width), at most wanted[i]:
    the libraries pad the rest, and the padding is never read."""
    return [list(row[: min(max(1, n), len(row), w)]) for row, n, w in zip(rows, counts, wanted)]


__all__ = ["MAX_DEVICE_TOP_K", "check_device_top_k", "first_tokens", "sampling_capabilities"]
