"""SamplingParams: one request's generation settings, validated once at the edge.

Validation errors name the OpenAI request field, so the server can answer 400 with a message a user can act on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

#: Most choices (`n`) one request may ask for: each occupies a batch slot.
MAX_N = 16


class SamplingParamsError(ValueError):
    """An invalid sampling field; `param` is the request field's name."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class RowSampling:
    """What the device needs of one row: NxDI's sampling-tensor columns plus the row's seed."""

    top_k: int  # -1 = all candidates within the global top-k; 1 = greedy
    top_p: float  # (0, 1]
    temperature: float  # > 0 (greedy is top_k=1, temperature=1.0: NxDI rejects 0)
    seed: Optional[int]  # seeds the slot's generator at prefill; None = fresh random seed


GREEDY = RowSampling(top_k=1, top_p=1.0, temperature=1.0, seed=None)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings (OpenAI fields plus vLLM's extensions)."""

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass kept, (0, 1]
    top_k: int = -1  # candidates kept; -1 = no per-request limit (the global top-k still applies)
    seed: Optional[int] = None  # makes sampled output reproducible
    max_tokens: Optional[int] = None  # None = until max_model_len
    min_tokens: int = 0  # EOS and stop strings are ignored before this many tokens
    stop: tuple[str, ...] = ()  # stop strings, excluded from the output
    stop_token_ids: tuple[int, ...] = ()  # extra token ids that end generation (besides EOS)
    ignore_eos: bool = False  # keep generating through EOS
    logprobs: Optional[int] = None  # top logprobs per token; needs on-device sampling off

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def validate(self, *, global_top_k: int, max_model_len: int, on_device_sampling: bool) -> "SamplingParams":
        """Check every field against the server's limits; returns self for chaining.

        Raises:
            SamplingParamsError: names the field and the allowed range.
        """
        if not self.temperature >= 0.0:
            raise SamplingParamsError("temperature", f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise SamplingParamsError("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise SamplingParamsError("top_k", f"top_k must be -1 (disabled) or >= 1, got {self.top_k}")
        if self.top_k > global_top_k:
            raise SamplingParamsError(
                "top_k", f"top_k must be <= {global_top_k} (sampling.global_top_k of this server), got {self.top_k}"
            )
        if self.max_tokens is not None and not 1 <= self.max_tokens <= max_model_len:
            raise SamplingParamsError(
                "max_tokens", f"max_tokens must be in [1, {max_model_len}] (max_model_len), got {self.max_tokens}"
            )
        if self.min_tokens < 0 or (self.max_tokens is not None and self.min_tokens > self.max_tokens):
            raise SamplingParamsError("min_tokens", f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        if self.logprobs is not None:
            if on_device_sampling:
                raise SamplingParamsError(
                    "logprobs",
                    "logprobs are not available: this server samples on the device and returns token ids only "
                    "(start it with sampling.on_device=false to get logprobs)",
                )
            if not 0 <= self.logprobs <= 20:
                raise SamplingParamsError("logprobs", f"logprobs must be in [0, 20], got {self.logprobs}")
        return self

    def row(self, seed: Optional[int] = None) -> RowSampling:
        """This request's device row; greedy maps to (1, 1.0, 1.0) because NxDI rejects temperature 0 and top_k 0."""
        if self.greedy:
            return GREEDY
        return RowSampling(self.top_k, self.top_p, self.temperature, self.seed if seed is None else seed)


def choice_seed(seed: Optional[int], index: int) -> Optional[int]:
    """Seed of choice `index` of an n>1 request: distinct per choice, reproducible per request."""
    return None if seed is None else seed + index


__all__ = ["MAX_N", "GREEDY", "RowSampling", "SamplingParams", "SamplingParamsError", "choice_seed"]
