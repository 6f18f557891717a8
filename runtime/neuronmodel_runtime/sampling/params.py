"""SamplingParams: one request's generation settings, normalised and validated once, at admission.

`SamplingParams.validate` checks every field against what the loaded runner declares (`SamplingCapabilities`)
and returns the normalised request: values below `SAMPLING_EPS` mean greedy (as in vLLM), `top_k: 0` means
"no per-request limit", and every float is checked to survive the trip into the device's float32 tensors.
After admission nothing a client sent can make a runner step fail. Errors name the OpenAI request field, so
the server can answer 400 with a message a user can act on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal, Mapping, Optional, Sequence

#: Most choices (`n`) one request may ask for: each occupies a batch slot.
MAX_N = 16
#: vLLM's `_SAMPLING_EPS`: a temperature (or top_p) below it is greedy; float32 keeps it far from subnormal.
SAMPLING_EPS = 1e-5
#: The largest finite float32: the sampling tensor's dtype on every runner.
FLOAT32_MAX = 3.4028234663852886e38
#: OpenAI's ranges.
PENALTY_RANGE = (-2.0, 2.0)  # presence_penalty, frequency_penalty
LOGIT_BIAS_RANGE = (-100.0, 100.0)
#: vLLM's upper bound of repetition_penalty; its lower bound here keeps logit / penalty finite in float32.
REPETITION_RANGE = (SAMPLING_EPS, 2.0)


class SamplingParamsError(ValueError):
    """An invalid sampling field; `param` is the request field's name."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingCapabilities:
    """What a runner's sampler honours per request; the server checks every request against it at admission."""

    runner: str  # framework name used in messages: "torch", "nxdi", "tnx"
    max_top_k: int  # largest per-request top_k (the global / compiled top-k)
    top_p_rule: Literal["keep", "drop"]  # keep or drop the candidate whose cumulative mass crosses top_p
    seeds: bool = True  # per-request seeds make sampled output reproducible
    sampled: bool = True  # honours non-greedy requests (False: decodes greedily, e.g. NxDI's fused speculation)
    logprobs: bool = False  # returns logprobs of the chosen and the top tokens
    penalties: bool = False  # presence_penalty, frequency_penalty, repetition_penalty
    logit_bias: bool = False
    stop_token_masking: bool = False  # masks EOS and stop_token_ids on the device until min_tokens (min_tokens)
    #: feature -> how to get it, appended to the refusal ("set sampling.on_device=false").
    fixes: Mapping[str, str] = field(default_factory=dict)

    def refuse(self, feature: str, param: str, what: str) -> SamplingParamsError:
        fix = self.fixes.get(feature, "remove the field or serve with a runner that supports it")
        return SamplingParamsError(param, f"{param}: the {self.runner} runner {what}; {fix}")


@dataclass(frozen=True)
class RowSampling:
    """What the device needs of one row in one step: NxDI's sampling-tensor columns, the row's seed, and the
    logits processors of the runners that declare them (all neutral by default)."""

    top_k: int  # -1 = all candidates within the global top-k; 1 = greedy
    top_p: float  # (0, 1]
    temperature: float  # > 0 (greedy is top_k=1, temperature=1.0: NxDI rejects 0)
    seed: Optional[int]  # seeds the slot's generator at prefill; None = fresh random seed
    presence_penalty: float = 0.0  # subtracted once from every token already in the output
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # divides positive / multiplies negative logits of prompt and output tokens
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    masked_token_ids: tuple[int, ...] = ()  # logits set to -inf this step (EOS and stop ids before min_tokens)
    # Token history for penalties (references to the engine's lists; empty unless a penalty is set):
    prompt_ids: Sequence[int] = field(default=(), compare=False, repr=False)
    output_ids: Sequence[int] = field(default=(), compare=False, repr=False)

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def processes_logits(self) -> bool:
        """True when some logits processor changes this row's logits (so it never speculates)."""
        return self.has_penalties or bool(self.logit_bias) or bool(self.masked_token_ids)


GREEDY = RowSampling(top_k=1, top_p=1.0, temperature=1.0, seed=None)


def _finite32(param: str, value: float) -> None:
    if not math.isfinite(value) or abs(value) > FLOAT32_MAX:
        raise SamplingParamsError(param, f"{param} must be a finite float32 value, got {value}")


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings (OpenAI fields plus vLLM's extensions)."""

    temperature: float = 1.0  # 0 (or below SAMPLING_EPS) = greedy
    top_p: float = 1.0  # nucleus mass kept, (0, 1]
    top_k: int = -1  # candidates kept; -1 (or 0) = no per-request limit (the global top-k still applies)
    seed: Optional[int] = None  # makes sampled output reproducible
    max_tokens: Optional[int] = None  # None = until max_model_len
    min_tokens: int = 0  # EOS and stop tokens are masked, stop strings ignored, before this many tokens
    stop: tuple[str, ...] = ()  # stop strings, excluded from the output unless include_stop_str_in_output
    stop_token_ids: tuple[int, ...] = ()  # extra token ids that end generation (besides EOS)
    include_stop_str_in_output: bool = False  # keep the matched stop string in the text
    ignore_eos: bool = False  # keep generating through EOS
    logprobs: Optional[int] = None  # top logprobs per token
    presence_penalty: float = 0.0  # [-2, 2]
    frequency_penalty: float = 0.0  # [-2, 2]
    repetition_penalty: float = 1.0  # (0, 2]; 1 = none
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100])

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def validate(self, caps: SamplingCapabilities, *, max_model_len: int, vocab_size: int = 0) -> "SamplingParams":
        """Check every field against the runner's capabilities and the server's limits; return the normalised
        params (greedy below SAMPLING_EPS, top_k 0 -> -1, logit_bias sorted).

        Raises:
            SamplingParamsError: names the field, the allowed range or the runner and the fix.
        """
        for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            _finite32(name, getattr(self, name))
        if self.temperature < 0.0:
            raise SamplingParamsError("temperature", f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise SamplingParamsError("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise SamplingParamsError("top_k", f"top_k must be -1 or 0 (disabled) or >= 1, got {self.top_k}")
        if self.top_k > caps.max_top_k:
            raise SamplingParamsError(
                "top_k", f"top_k must be <= {caps.max_top_k} (the {caps.runner} runner's global top-k, "
                f"sampling.global_top_k), got {self.top_k}"
            )
        if self.max_tokens is not None and not 1 <= self.max_tokens <= max_model_len:
            raise SamplingParamsError(
                "max_tokens", f"max_tokens must be in [1, {max_model_len}] (max_model_len), got {self.max_tokens}"
            )
        if self.min_tokens < 0 or (self.max_tokens is not None and self.min_tokens > self.max_tokens):
            raise SamplingParamsError("min_tokens", f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        self._check_ranges(vocab_size)
        self._check_capabilities(caps)
        # Below SAMPLING_EPS the nucleus (top_p) or the tempered distribution holds only the top token: greedy.
        greedy = self.temperature < SAMPLING_EPS or self.top_p < SAMPLING_EPS or self.top_k == 1
        return replace(
            self,
            temperature=0.0 if greedy else self.temperature,
            top_p=1.0 if greedy else self.top_p,
            top_k=1 if greedy else (-1 if self.top_k == 0 else self.top_k),
            logit_bias=tuple(sorted(self.logit_bias)),
        )

    def _check_ranges(self, vocab_size: int) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not PENALTY_RANGE[0] <= value <= PENALTY_RANGE[1]:
                raise SamplingParamsError(name, f"{name} must be in [-2, 2], got {value}")
        low, high = REPETITION_RANGE
        if not low <= self.repetition_penalty <= high:
            raise SamplingParamsError(
                "repetition_penalty", f"repetition_penalty must be in [{low}, {high}] (1 = none), "
                f"got {self.repetition_penalty}"
            )
        in_vocab = (lambda t: 0 <= t < vocab_size) if vocab_size else (lambda t: t >= 0)
        for token, bias in self.logit_bias:
            if not in_vocab(token):
                raise SamplingParamsError("logit_bias", f"logit_bias: token id {token} is not in the vocabulary "
                                          f"[0, {vocab_size})")
            _finite32("logit_bias", bias)
            if not LOGIT_BIAS_RANGE[0] <= bias <= LOGIT_BIAS_RANGE[1]:
                raise SamplingParamsError("logit_bias", f"logit_bias values must be in [-100, 100], got {bias}")
        for token in self.stop_token_ids:
            if not in_vocab(token):
                raise SamplingParamsError("stop_token_ids", f"stop_token_ids: {token} is not in the vocabulary "
                                          f"[0, {vocab_size})")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise SamplingParamsError("logprobs", f"logprobs must be in [0, 20], got {self.logprobs}")

    def _check_capabilities(self, caps: SamplingCapabilities) -> None:
        if not caps.sampled and not self.greedy and self.temperature >= SAMPLING_EPS and self.top_p >= SAMPLING_EPS:
            raise caps.refuse("sampled", "temperature", "decodes greedily only")
        if self.logprobs is not None and not caps.logprobs:
            raise caps.refuse("logprobs", "logprobs", "samples on the device and returns token ids only")
        if self.seed is not None and not caps.seeds and not self.greedy:
            raise caps.refuse("seeds", "seed", "has no per-request random generators")
        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
            neutral = 1.0 if name == "repetition_penalty" else 0.0
            if getattr(self, name) != neutral and not caps.penalties:
                raise caps.refuse("penalties", name, "does not apply penalties")
        if self.logit_bias and not caps.logit_bias:
            raise caps.refuse("logit_bias", "logit_bias", "does not apply logit_bias")
        if self.min_tokens > 0 and not caps.stop_token_masking:
            raise caps.refuse("min_tokens", "min_tokens", "cannot mask EOS on the device before min_tokens")

    def row(self, seed: Optional[int] = None) -> RowSampling:
        """This request's device row; greedy maps to (1, 1.0, 1.0) because NxDI rejects temperature 0 and top_k 0."""
        if self.greedy:
            base = GREEDY
        else:
            base = RowSampling(self.top_k, self.top_p, self.temperature, self.seed if seed is None else seed)
        if not (self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0 or self.logit_bias):
            return base
        return replace(base, presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                       repetition_penalty=self.repetition_penalty, logit_bias=self.logit_bias)


def choice_seed(seed: Optional[int], index: int) -> Optional[int]:
    """Seed of choice `index` of an n>1 request: distinct per choice, reproducible per request."""
    return None if seed is None else seed + index


__all__ = [
    "FLOAT32_MAX", "GREEDY", "MAX_N", "SAMPLING_EPS", "RowSampling", "SamplingCapabilities", "SamplingParams",
    "SamplingParamsError", "choice_seed",
]
