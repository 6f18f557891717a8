"""A request's state inside the engine, and the stop conditions that end it."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Optional

from neuronmodel_runtime.engine.detokenizer import IncrementalDetokenizer, StopStringMatcher
from neuronmodel_runtime.engine.outputs import (
    FINISH_LENGTH,
    FINISH_STOP,
    RequestMetrics,
    RequestOutput,
)
from neuronmodel_runtime.runners.base import TokenLogprob
from neuronmodel_runtime.sampling.params import RowSampling, SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # accepted, no slot yet
    RUNNING = "running"  # holds a slot
    FINISHED = "finished"  # done; slot released


@dataclass
class Request:
    """One sequence being generated (a choice of an n>1 request is its own Request)."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    stop_matcher: StopStringMatcher
    eos_token_ids: frozenset[int]  # tokens that end generation unless params.ignore_eos
    max_model_len: int  # prompt + output never exceeds this
    deadline: float  # time.monotonic() after which the request is aborted
    status: RequestStatus = RequestStatus.WAITING
    slot: Optional[int] = None  # KV-cache line while RUNNING
    output_ids: list[int] = field(default_factory=list)
    finish_reason: Optional[str] = None
    stop_reason: Optional[str | int] = None
    error: Optional[str] = None  # why the runner failed this request (FINISH_ERROR)
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(arrival=time.monotonic()))
    # Not yet delivered to the stream:
    pending_ids: list[int] = field(default_factory=list)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    _texted: int = field(default=0, repr=False)  # output_ids[:_texted] are detokenized

    @cached_property
    def _base_row(self) -> RowSampling:
        return self.params.row()

    @cached_property
    def _min_tokens_mask(self) -> tuple[int, ...]:
        """Tokens that would end the request: masked on the device until min_tokens outputs exist (as vLLM)."""
        stops = set(self.params.stop_token_ids) | (set() if self.params.ignore_eos else set(self.eos_token_ids))
        return tuple(sorted(stops))

    @property
    def row(self) -> RowSampling:
        """This step's device row: the request's sampling, its min_tokens mask while it applies, and the token
        history when a penalty needs it."""
        row = self._base_row
        masked = self._min_tokens_mask if len(self.output_ids) < self.params.min_tokens else ()
        if not masked and not row.has_penalties:
            return row
        history = {"prompt_ids": self.prompt_ids, "output_ids": self.output_ids} if row.has_penalties else {}
        return replace(row, masked_token_ids=masked, **history)

    @property
    def num_tokens(self) -> int:
        """Tokens of the sequence: prompt + output."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def max_new_tokens(self) -> int:
        """How many more output tokens this request may produce."""
        limit = self.max_model_len - self.num_tokens
        if self.params.max_tokens is not None:
            limit = min(limit, self.params.max_tokens - len(self.output_ids))
        return max(limit, 0)

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def append_tokens(self, token_ids: list[int], logprobs: Optional[list[TokenLogprob]] = None) -> None:
        """Add a step's tokens in order, stopping exactly at the first one that ends the request: its token ids,
        then their text."""
        self.append_token_ids(token_ids, logprobs)
        self.detokenize()

    def append_token_ids(self, token_ids: list[int], logprobs: Optional[list[TokenLogprob]] = None) -> None:
        """Add a step's tokens, stopping at the first that ends the request by its id (EOS, a stop token,
        max_tokens, max_model_len); `detokenize` then finds the stop strings among them.

        Tokens after a stop are dropped: a speculative step may return several tokens, and none past the stop
        may reach the user.
        """
        for i, token in enumerate(token_ids):
            if self.max_new_tokens <= 0:
                self.finish_reason = FINISH_LENGTH
                return
            self.output_ids.append(token)
            self.pending_ids.append(token)
            if logprobs is not None:
                self.pending_logprobs.append(logprobs[i])
            if len(self.output_ids) > self.params.min_tokens and self._is_stop_token(token):
                self.finish_reason, self.stop_reason = FINISH_STOP, token  # counted as output, never shown as text
                return
            if self.max_new_tokens <= 0:
                self.finish_reason = FINISH_LENGTH
                return

    def detokenize(self) -> bool:
        """Turn the tokens appended since the last call into text; True when a stop string among them ended the
        request (which then ends at that token: the tokens after it are dropped, whatever ended it later, an abort
        included, as it would have ended there had its text been made at once)."""
        end = len(self.output_ids)
        if isinstance(self.stop_reason, int):
            end -= 1  # the stop token: never shown as text
        while self._texted < end:
            token, self._texted = self.output_ids[self._texted], self._texted + 1
            matched = self.stop_matcher.feed(self.detokenizer.add(token), check=self._texted > self.params.min_tokens)
            if matched is not None:
                self._drop_after(self._texted)
                self.finish_reason, self.stop_reason = FINISH_STOP, matched
                return True
        return False

    def _drop_after(self, kept: int) -> None:
        dropped = len(self.output_ids) - kept
        if dropped:
            del self.output_ids[kept:]
            del self.pending_ids[len(self.pending_ids) - dropped:]
            if self.pending_logprobs:
                del self.pending_logprobs[len(self.pending_logprobs) - dropped:]

    def _is_stop_token(self, token: int) -> bool:
        return token in self.params.stop_token_ids or (not self.params.ignore_eos and token in self.eos_token_ids)

    def take_output(self) -> RequestOutput:
        """The increment since the last call; the final one carries the finish reason and metrics."""
        self.detokenize()  # an aborted request's last tokens, with async scheduling
        done = self.finish_reason is not None
        if done and self.stop_reason is None or isinstance(self.stop_reason, int):
            self.stop_matcher.feed(self.detokenizer.flush(), check=False)
        out = RequestOutput(
            request_id=self.request_id,
            text=self.stop_matcher.take(final=done),
            token_ids=self.pending_ids,
            num_prompt_tokens=len(self.prompt_ids),
            num_output_tokens=len(self.output_ids),
            finished=done,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            logprobs=self.pending_logprobs if self.params.logprobs is not None else None,
            error=self.error,
            metrics=self.metrics if done else None,
        )
        self.pending_ids, self.pending_logprobs = [], []
        return out
