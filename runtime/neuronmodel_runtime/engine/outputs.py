"""What a request's stream yields (its output increments, finish reasons, metrics) and the engine's stats."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from neuronmodel_runtime.runners.base import TokenLogprob

#: Why a request ended (OpenAI's values plus vLLM's "abort" and our "error").
FINISH_STOP = "stop"  # EOS, a stop token or a stop string
FINISH_LENGTH = "length"  # max_tokens or max_model_len
FINISH_ABORT = "abort"  # client disconnect, timeout or shutdown
FINISH_ERROR = "error"  # the runner failed on this request's step


@dataclass
class RequestMetrics:
    """Timestamps of one request (time.monotonic seconds) for latency metrics and the request log."""

    arrival: float  # accepted by the engine
    scheduled: Optional[float] = None  # given a slot
    first_token: Optional[float] = None  # first output token produced
    finished: Optional[float] = None  # finished for any reason

    @property
    def ttft(self) -> Optional[float]:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def queue_time(self) -> Optional[float]:
        return None if self.scheduled is None else self.scheduled - self.arrival

    @property
    def e2e(self) -> Optional[float]:
        return None if self.finished is None else self.finished - self.arrival


@dataclass
class RequestOutput:
    """An increment of one request's output, delivered to its stream in order."""

    request_id: str
    text: str  # text produced since the previous output (stop strings excluded)
    token_ids: list[int]  # tokens produced since the previous output (may be ahead of `text` by a partial char)
    num_prompt_tokens: int
    num_output_tokens: int  # output tokens so far, including this increment
    finished: bool = False
    finish_reason: Optional[str] = None  # one of FINISH_*; set when finished
    stop_reason: Optional[str | int] = None  # the stop string or token id that matched, when finish_reason is "stop"
    logprobs: Optional[list[TokenLogprob]] = None  # aligned with token_ids, when the request asked for them
    error: Optional[str] = None  # set with FINISH_ERROR
    metrics: Optional[RequestMetrics] = None  # set on the final output

    def as_tuple(self) -> tuple:
        """The fields in order, for the engine core's channel: a tuple of builtins pickles about 7x faster than the
        dataclass (measured: 64 outputs, 35 us against 250 us to dump and load); `RequestOutput(*t)` reads it back."""
        return (self.request_id, self.text, self.token_ids, self.num_prompt_tokens, self.num_output_tokens,
                self.finished, self.finish_reason, self.stop_reason, self.logprobs, self.error, self.metrics)

    def then(self, later: "RequestOutput") -> "RequestOutput":
        """This increment followed by the `later` one of the same request, as one increment.

        The stream hands a consumer that fell behind everything queued as one output (vLLM's output collector
        merges the same way), so a busy server writes one chunk per request and step it can serve, not one per
        token."""
        logprobs = None if self.logprobs is None and later.logprobs is None else [*(self.logprobs or ()),
                                                                                 *(later.logprobs or ())]
        return replace(later, text=self.text + later.text, token_ids=self.token_ids + later.token_ids,
                       logprobs=logprobs)


@dataclass
class EngineStats:
    """A snapshot of the engine for gauges and counters (read at metrics scrape time)."""

    num_running: int  # requests holding a slot
    num_waiting: int  # accepted requests waiting for a slot
    num_slots: int  # max_num_seqs
    prompt_tokens_total: int = 0  # prompt tokens prefilled, ever
    generation_tokens_total: int = 0  # output tokens produced, ever
    num_preemptions_total: int = 0  # always 0: slots are never preempted (kept for vLLM dashboards)
    spec_drafts_total: int = 0  # decode rows that carried draft tokens
    spec_draft_tokens_total: int = 0  # draft tokens proposed
    spec_accepted_tokens_total: int = 0  # draft tokens accepted
    spec_accepted_per_position: list[int] = field(default_factory=list)  # index i: drafts accepted at position i
    # Where the step loop's time goes (seconds and calls, ever): what a step costs on the host beside the runner.
    steps_total: int = 0  # engine steps that had work
    step_seconds_total: float = 0.0  # wall time inside those steps
    runner_seconds_total: float = 0.0  # of which in runner calls (prefill, decode, speculation)
    prefill_calls_total: int = 0  # runner.prefill calls
    prefill_rows_total: int = 0  # prompts they carried
    decode_calls_total: int = 0  # decode (or speculative) runner calls
    decode_rows_total: int = 0  # rows they carried: / decode_calls_total = the mean decode batch

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of KV-cache slots in use (a slot is the unit of KV memory on Neuron)."""
        return self.num_running / self.num_slots if self.num_slots else 0.0
