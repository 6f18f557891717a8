"""Between HTTP and the engine: checks a request against the server's limits, admits its choices as engine
requests, merges their output streams, and ends them on disconnect or drain.

One HTTP request becomes `len(prompts) * n` engine requests ("choices"), admitted all-or-nothing. A
`Generation` owns them until the response is complete; closing it aborts whatever is unfinished, which
frees the slots.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Callable, Optional, Sequence, Union

from starlette.responses import JSONResponse, Response
from starlette.types import Receive

from neuronmodel_runtime.config import RuntimeConfig
from neuronmodel_runtime.engine.async_engine import EngineNotRunning, QueueFullError, RequestStream
from neuronmodel_runtime.engine.outputs import FINISH_ERROR, RequestOutput
from neuronmodel_runtime.runners.base import TokenLogprob
from neuronmodel_runtime.sampling.params import MAX_N, SamplingParams, SamplingParamsError, choice_seed
from neuronmodel_runtime.server.errors import APIError, error_body, invalid
from neuronmodel_runtime.server.metrics import Metrics
from neuronmodel_runtime.server.protocol import IGNORED_FIELDS, REFUSED_FIELDS, Usage
from neuronmodel_runtime.server.sse import EventStream

log = logging.getLogger(__name__)


@dataclass
class ChoiceResult:
    """One choice's whole output (non-streaming responses)."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # aligned with token_ids, when asked
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[str, int]] = None


@dataclass
class SSEStream:
    """A streaming result: SSE `data:` payloads, and the cleanup to run however the response ends."""

    events: AsyncIterator[str]
    close: Callable[[], None]


def respond(result: Union[dict, SSEStream]) -> Response:
    """A route's result as JSON or as a server-sent-event stream."""
    if isinstance(result, SSEStream):
        return EventStream(result.events, result.close)
    return JSONResponse(result)


def error_event(message: str) -> str:
    """A stream's error payload (the status line was already sent); the OpenAI client raises on it."""
    return json.dumps(error_body(500, message), ensure_ascii=False)


class Generation:
    """The engine requests ("choices") behind one HTTP request, merged into one ordered event stream."""

    def __init__(self, request_id: str, streams: list[RequestStream], prompt_lens: list[int], metrics: Metrics,
                 on_close: Callable[["Generation"], None]):
        self.request_id = request_id
        self._streams = streams
        self._prompt_lens = prompt_lens  # per prompt (not per choice): usage counts each prompt once
        self._num_output = [0] * len(streams)
        self._queue: asyncio.Queue[tuple[int, RequestOutput]] = asyncio.Queue()
        # One choice (nearly every request) is read from its stream directly, without a relay task per token; the
        # relay starts when the response ends before the stream does (`close`), so its final output is counted.
        self._direct = len(streams) == 1
        self._pumps = [] if self._direct else [asyncio.ensure_future(self._pump(i, s)) for i, s in
                                                enumerate(streams)]  # held: not GC'd
        self._metrics = metrics
        self._on_close = on_close
        self._closed = False

    @property
    def num_choices(self) -> int:
        return len(self._streams)

    async def _pump(self, index: int, stream: RequestStream) -> None:
        """Relays one choice's outputs; runs until the engine's final output, even after `close()`, so every
        engine request is logged and counted once (aborted ones included)."""
        async for out in stream:
            if out.finished:
                self._finished(out)
            self._queue.put_nowait((index, out))

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(choice index, output increment) in arrival order; choices interleave. Ends when all finished."""
        if self._direct:
            async for out in self._streams[0]:
                self._num_output[0] = out.num_output_tokens
                if out.finished:
                    self._finished(out)
                yield 0, out
            return
        unfinished = len(self._streams)
        while unfinished:
            index, out = await self._queue.get()
            self._num_output[index] = out.num_output_tokens
            if out.finished:
                unfinished -= 1
            yield index, out

    async def collect(self, receive: Receive) -> list[ChoiceResult]:
        """Every choice's whole output; a client disconnect meanwhile aborts them (freeing their slots).
        Closes the generation however it ends.

        Raises:
            APIError: 500 when the engine failed a choice.
        """
        results = [ChoiceResult(i) for i in range(len(self._streams))]
        watcher = asyncio.ensure_future(self._abort_on_disconnect(receive))
        try:
            async for index, out in self.outputs():
                r = results[index]
                r.text += out.text
                r.token_ids += out.token_ids
                r.logprobs += out.logprobs or []
                if out.finished:
                    if out.finish_reason == FINISH_ERROR:
                        raise APIError(500, out.error or "the model runner failed", code="engine_error")
                    r.finish_reason, r.stop_reason = out.finish_reason, out.stop_reason
        finally:
            watcher.cancel()
            self.close()
        return results

    async def _abort_on_disconnect(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        log.info("request %s: client disconnected, aborting", self.request_id)
        self.abort()

    async def events(self, render: Callable[[int, RequestOutput], str], usage_template: Any, include_usage: bool,
                     prelude: Sequence[str] = ()) -> AsyncIterator[str]:
        """The SSE payloads of a streaming response; closes the generation however the stream ends.

        `prelude` first, then `render(choice, output)` for each output with something to send (a token that
        completes no character yet is skipped), an error event if the runner failed, the usage chunk (a copy of
        `usage_template`) when asked, and `[DONE]`.
        """
        try:
            for event in prelude:
                yield event
            async for index, out in self.outputs():
                if out.finish_reason == FINISH_ERROR:
                    if out.text or out.logprobs:  # increments merged into the error output (a reader behind)
                        yield render(index, replace(out, finished=False, finish_reason=None))
                    yield error_event(out.error or "the model runner failed")
                    break
                if out.text or out.finished or out.logprobs:
                    yield render(index, out)
            else:
                if include_usage:
                    yield usage_template.model_copy(update={"usage": self.usage()}).model_dump_json()
            yield "[DONE]"
        finally:
            self.close()

    def usage(self) -> Usage:
        prompt, completion = sum(self._prompt_lens), sum(self._num_output)
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)

    def abort(self) -> None:
        """Abort every unfinished choice; the engine answers each with a final "abort" output."""
        for stream in self._streams:
            stream.abort()

    def close(self) -> None:
        """End this generation however the response ended (idempotent): unfinished choices are aborted."""
        if self._closed:
            return
        self._closed = True
        self.abort()
        if self._direct and not self._streams[0].finished:
            self._pumps.append(asyncio.ensure_future(self._pump(0, self._streams[0])))
        self._on_close(self)

    def _finished(self, out: RequestOutput) -> None:
        self._metrics.observe_finished(out)
        m = out.metrics
        ttft = f"{m.ttft:.3f}s" if m and m.ttft is not None else "-"
        total = f"{m.e2e:.3f}s" if m and m.e2e is not None else "-"
        log.info(
            "request %s: prompt_tokens=%d output_tokens=%d ttft=%s total=%s finish_reason=%s",
            out.request_id, out.num_prompt_tokens, out.num_output_tokens, ttft, total, out.finish_reason,
        )


class Serving:
    """Request validation against the loaded model's limits, admission, and the drain on shutdown."""

    def __init__(self, engine: Any, config: RuntimeConfig, metrics: Metrics):
        self.engine = engine
        self.config = config
        self.metrics = metrics
        self.model_name: str = engine.model_name  # the CLI sets it from server.served_model_name
        self.created = int(time.time())
        self.draining = False
        self._live: set[Generation] = set()
        #: Request fields' defaults from the model's generation_config.json (vLLM's default behaviour).
        self.sampling_defaults: dict[str, float] = dict(engine.sampling_defaults)
        # One thread: a Hugging Face tokenizer is not meant for concurrent calls.
        self._tokenizer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")

    # -- request -> engine ----------------------------------------------------------------------------
    def check_model(self, model: Optional[str]) -> None:
        if model is not None and model != self.model_name:
            raise APIError(
                404,
                f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )

    def check_fields(self, req: Any) -> None:
        """400 for a field this server refuses (unless it holds its neutral value) and for unknown fields."""
        for name, value in (req.model_extra or {}).items():
            if name in IGNORED_FIELDS:
                continue
            if name not in REFUSED_FIELDS:
                raise invalid(name, f"unknown field {name!r}; remove it (see GET /openapi.json for the fields)")
            neutral, why = REFUSED_FIELDS[name]
            if name == "best_of" and value == req.n:
                continue
            if value not in neutral:
                raise invalid(name, f"{name}: {why}")

    def sampling_params(self, req: Any, *, max_tokens: Optional[int], logprobs: Optional[int],
                        names: Optional[dict[str, str]] = None) -> SamplingParams:
        """The request's SamplingParams, normalised and validated against the runner's capabilities; fields the
        request omits take the model's generation_config.json defaults. `names` maps a field to the client's."""
        self.check_fields(req)
        if not 1 <= req.n <= MAX_N:
            raise invalid("n", f"n must be in [1, {MAX_N}], got {req.n}")
        if req.stream_options is not None and not req.stream:
            raise invalid("stream_options", "stream_options is only allowed with stream: true")
        try:
            logit_bias = req.bias_ids()
        except ValueError as exc:
            raise invalid("logit_bias", str(exc)) from None
        given = req.model_fields_set
        defaults = {k: v for k, v in self.sampling_defaults.items() if k not in given}
        params = SamplingParams(
            temperature=defaults.get("temperature", req.temperature),
            top_p=defaults.get("top_p", req.top_p),
            top_k=int(defaults.get("top_k", req.top_k)),
            repetition_penalty=defaults.get("repetition_penalty", req.repetition_penalty),
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            logit_bias=logit_bias,
            seed=req.seed,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            stop=req.stop_strings,
            stop_token_ids=tuple(req.stop_token_ids or ()),
            include_stop_str_in_output=req.include_stop_str_in_output,
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
        )
        cap = self.engine.capacity
        try:
            return params.validate(self.engine.capabilities.sampling, max_model_len=cap.max_model_len,
                                   vocab_size=cap.vocab_size)
        except SamplingParamsError as exc:
            param = (names or {}).get(exc.param, exc.param)
            raise invalid(param, str(exc).replace(exc.param, param, 1)) from None

    async def tokenize(self, encode: Callable[[], list[int]]) -> list[int]:
        """Run a tokenization off the event loop (long prompts would stall every stream), one at a time."""
        return await asyncio.get_running_loop().run_in_executor(self._tokenizer_thread, encode)

    def check_prompt(self, prompt_ids: list[int], params: SamplingParams, param: str, max_tokens_param: str) -> None:
        """Prompt limits: not empty, token ids in the vocabulary, <= max_context_length, fits max_model_len."""
        cap = self.engine.capacity
        if not prompt_ids:
            raise invalid(param, f"{param} is empty: it must contain at least one token")
        if cap.vocab_size and not all(0 <= t < cap.vocab_size for t in prompt_ids):
            raise invalid(param, f"{param} holds token ids outside the vocabulary [0, {cap.vocab_size})")
        if len(prompt_ids) > cap.max_context_length:
            raise invalid(
                param,
                f"{param} is {len(prompt_ids)} tokens; this server accepts at most {cap.max_context_length} "
                "prompt tokens (max_context_length)",
            )
        if params.max_tokens is not None and len(prompt_ids) + params.max_tokens > cap.max_model_len:
            raise invalid(
                max_tokens_param,
                f"{param} ({len(prompt_ids)} tokens) + {max_tokens_param} ({params.max_tokens}) exceeds "
                f"max_model_len ({cap.max_model_len}); lower {max_tokens_param} or shorten the prompt",
            )

    def start(self, request_id: str, prompts: list[list[int]], params: SamplingParams, n: int) -> Generation:
        """Admit n choices per prompt, all or none.

        Raises:
            APIError: 503 while loading or draining, 429 (with Retry-After) when the waiting queue is full.
        """
        if self.draining:
            raise APIError(503, "the server is shutting down; retry on another replica", code="draining")
        streams: list[RequestStream] = []
        try:
            for p, prompt in enumerate(prompts):
                for i in range(n):
                    choice = replace(params, seed=choice_seed(params.seed, i))
                    streams.append(self.engine.add_request(f"{request_id}-{p * n + i}", prompt, choice))
        except QueueFullError as exc:
            for stream in streams:
                stream.abort()
            retry_after = str(max(1, math.ceil(exc.retry_after)))
            raise APIError(429, str(exc), code="queue_full", headers={"Retry-After": retry_after}) from None
        except EngineNotRunning as exc:
            for stream in streams:
                stream.abort()
            raise APIError(503, str(exc), code="not_ready") from None
        generation = Generation(request_id, streams, [len(p) for p in prompts], self.metrics, self._live.discard)
        self._live.add(generation)
        return generation

    # -- lifecycle ------------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.engine.ready and not self.draining

    async def drain(self, timeout: float) -> bool:
        """Stop admission and let in-flight requests finish; abort what is left after `timeout` seconds.

        Returns:
            True when every in-flight request finished on its own.
        """
        self.draining = True
        self.engine.stop_accepting()
        log.info("draining: %d request(s) in flight, up to %.0f s", len(self._live), timeout)
        if await self._wait_live(timeout):
            return True
        log.warning("drain timeout: aborting %d request(s)", len(self._live))
        for generation in list(self._live):
            generation.abort()
        await self._wait_live(5.0)  # their responses end with finish_reason "abort"
        return False

    async def _wait_live(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._live and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return not self._live

