"""modules/generation/sampling.py: validate_sampling_params, prepare_sampling_params, infer_sampling_params (from
0.6) and the on-device Sampler, after src/neuronx_distributed_inference/modules/generation/sampling.py at 5de79de
(0.3), e07f056 (0.6, new validation rules and infer_sampling_params) and cd3abf3 (0.8, the multinomial's cumsum
rescale). The math is the real sampler's (our own code): global top-k candidates, per-row top-k mask, temperature,
NxDI's top-p rule, then inverse-CDF multinomial with a uniform draw from ONE module-level generator."""

from __future__ import annotations

import logging
from typing import Any, Dict, Union

import torch

from neuronx_distributed_inference._release import at_least
from neuronx_distributed_inference.models.config import NeuronConfig, OnDeviceSamplingConfig

logger = logging.getLogger("Neuron")

#: The device's random source: one stream for every request (no per-request seeds), as rand_like on Neuron.
GENERATOR = torch.Generator().manual_seed(0)
IGNORED_LOGITS_VALUE = -3000  # what the real masks dropped candidates with (softmax -> ~0)


def validate_sampling_params(params: torch.Tensor,
                             on_device_sampling_config: Union[Dict[str, Any], OnDeviceSamplingConfig]) -> None:
    """Rows are (top_k, top_p, temperature). Up to 0.5: top_k -1 or an integer in (0, global_topk], top_p in
    (0, 1], temperature > 0. From 0.6: top_k in {-1, 0..global_topk} (-1 and 0 = uniform random, a warning),
    temperature >= 0, and temperature 0 with top_k -1/0 raises."""
    if params.shape[1] != 3:
        raise ValueError(f"Expected tensor of shape (batch_size, 3), but got {params.shape}")
    params = params.to(torch.float32)
    top_k, top_p, temperature = params[:, 0], params[:, 1], params[:, 2]
    if isinstance(on_device_sampling_config, OnDeviceSamplingConfig):
        global_top_k = on_device_sampling_config.global_topk
    else:
        global_top_k = on_device_sampling_config["global_topk"]
    new = at_least((0, 6))
    valid_top_k = (top_k == -1) | (((top_k >= 0) if new else (top_k > 0)) & (top_k <= global_top_k))
    if not torch.all(valid_top_k):
        raise ValueError(f"Invalid top-k values found. top-k must be -1 or greater than 0 but less than or equal to "
                         f"{global_top_k=}. Found {top_k=}.")
    if new and (torch.any(top_k == -1) or torch.any(top_k == 0)):
        logger.warning("In NxDI, top_k = -1 or top_k = 0 means randomly picking a token from the vocabulary with a "
                       "uniform distribution.")
    if not torch.equal(top_k, top_k.floor()):
        raise ValueError("Invalid top-k values found. top-k values should be able to be represented as integer "
                         f"values, but found decimal parts. Found {top_k=}.")
    if not torch.all((top_p > 0.0) & (top_p <= 1.0)):
        raise ValueError(f"Invalid top-p values found. top-p must be in the range (0.0, 1.0]. Found {top_p=}.")
    if not torch.all(temperature >= 0.0 if new else temperature > 0.0):
        raise ValueError("Invalid temperature values found. Temperature must be "
                         + ("greater than or equal to 0.0" if new else "strictly greater than 0.0")
                         + f". Found {temperature=}.")
    if new and torch.any((temperature == 0.0) & ((top_k == -1) | (top_k == 0))):
        raise ValueError("Invalid sampling parameters found. Temperature = 0 enables greedy sampling. Please set "
                         "top_k to 1")


if at_least((0, 6)):

    def infer_sampling_params(params: torch.Tensor) -> torch.Tensor:
        """e07f056: temperature 0 rows get top_k = top_p = 1, written INTO the caller's tensor (forward calls this on
        the tensor it was given); temperature stays 0."""
        for i in range(params.shape[0]):
            if params[i, 2] == 0:
                logger.warning("Temperature = 0 enables greedy sampling. Resetting top_k and top_p values to 1.")
                params[i, 0] = 1
                params[i, 1] = 1
        return params


def prepare_tensor(val):
    if not torch.is_tensor(val):
        val = torch.tensor(val if isinstance(val, list) else [val])
    return val


def prepare_sampling_params(batch_size, top_k=[1], top_p=[1.0], temperature=[1.0]):
    top_k, top_p, temperature = prepare_tensor(top_k), prepare_tensor(top_p), prepare_tensor(temperature)
    assert top_k.shape[0] == top_p.shape[0] == temperature.shape[0], (
        f"sampling params shapes don't match. Got top_k shape: {top_k.shape}, top_p shape: {top_p.shape}, "
        f"temperature shape: {temperature.shape}")
    if top_k.shape[0] == 1:
        top_k, top_p = top_k.broadcast_to(batch_size), top_p.broadcast_to(batch_size)
        temperature = temperature.broadcast_to(batch_size)
    return torch.stack([top_k, top_p, temperature], dim=1)


class Sampler(torch.nn.Module):
    """forward(token_logits [B, V], sampling_params [B, 3]) -> token ids [B]. Greedy argmax unless the config has
    do_sample or dynamic; then the per-row parameters apply (and only then: a greedy config ignores them)."""

    def __init__(self, neuron_config: NeuronConfig, do_sample=None):
        super().__init__()
        config = neuron_config.on_device_sampling_config
        assert config is not None, "on device configs is not initialized"
        self.do_sample = config.do_sample if do_sample is None else do_sample
        self.dynamic, self.deterministic, self.global_topk = config.dynamic, config.deterministic, config.global_topk

    def forward(self, token_logits, sampling_params, return_values=False, rank_id=None):
        if not (self.do_sample or self.dynamic):
            return torch.argmax(token_logits, dim=-1)
        top_k, top_p, temperature = (sampling_params[:, i].reshape(-1, 1) for i in range(3))
        if self.global_topk > 0:
            values, indices = torch.topk(token_logits, k=min(self.global_topk, token_logits.shape[-1]), dim=-1)
        else:
            values, indices = torch.sort(token_logits, dim=-1, descending=True)
        # top_k: candidates at rank >= top_k are masked; top_k -1 or 0 masks every candidate, so the draw is
        # uniform over the global_topk candidates (what 0.6's warning calls "uniform random").
        rank = torch.arange(values.shape[-1]).broadcast_to(values.shape)
        values = values.masked_fill(rank >= top_k, IGNORED_LOGITS_VALUE)
        if self.dynamic or torch.any(temperature != 1.0):
            values = values / temperature
        if self.dynamic or torch.any(top_p < 1.0):
            cumsum = torch.cumsum(torch.softmax(values, dim=-1), dim=-1)
            # NxDI's top-p rule: drop every candidate whose cumulative probability EXCEEDS top_p, keep the first;
            # the candidate that crosses top_p is dropped (HF keeps it). The floor is the smallest cumsum of the
            # whole batch (torch.min over all rows), as the real.
            threshold = torch.max(torch.min(cumsum), top_p)
            drop = cumsum > threshold
            drop[:, 0] = False
            values = values.masked_fill(drop, IGNORED_LOGITS_VALUE)
        probs = torch.softmax(values, dim=-1)
        if return_values:
            return indices, probs
        cumsum = torch.cumsum(probs, dim=-1)
        if at_least((0, 8)):  # cd3abf3: rescale for float error, last entry forced to 1
            cumsum = cumsum / cumsum[..., -1:]
            cumsum[..., -1:] = 1
        draw = torch.full((cumsum.shape[0], 1), 0.5) if self.deterministic else torch.rand(
            (cumsum.shape[0], 1), generator=GENERATOR, dtype=cumsum.dtype)
        counts = torch.sum(draw > cumsum, dim=-1, keepdim=True)
        # A draw above every cumsum (float error before 0.8's rescale) would index past the candidates; the
        # fake clamps (what the device's gather does with it is not in the source).
        counts = counts.clamp(max=indices.shape[-1] - 1)
        return torch.gather(indices, -1, counts).flatten()


__all__ = ["GENERATOR", "Sampler", "prepare_sampling_params", "validate_sampling_params"] + (
    ["infer_sampling_params"] if at_least((0, 6)) else [])
