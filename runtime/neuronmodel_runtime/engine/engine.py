"""The engine step: schedule -> execute -> update. Synchronous, single-threaded, no HTTP and no asyncio."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Mapping, Optional, Sequence

from neuronmodel_runtime.engine.detokenizer import Decoder, IncrementalDetokenizer, StopStringMatcher, text_decoder
from neuronmodel_runtime.engine.outputs import FINISH_ERROR, EngineStats, RequestOutput
from neuronmodel_runtime.engine.request import Request, RequestStatus
from neuronmodel_runtime.engine.scheduler import Scheduler
from neuronmodel_runtime.engine.speculation import Speculation, speculative_decode
from neuronmodel_runtime.runners.base import DecodeBatch, ModelRunner, PrefillBatch, StepOutput
from neuronmodel_runtime.sampling.params import RowSampling, SamplingParams

log = logging.getLogger(__name__)

Emit = Callable[[list[RequestOutput]], None]


class Engine:
    """Owns the scheduler and the runner; `step()` advances every running request by one runner step."""

    def __init__(
        self,
        runner: ModelRunner,
        tokenizer: Decoder,
        eos_token_ids: Iterable[int],
        max_num_batched_tokens: int,
        request_timeout_s: float = 600.0,
        speculation: Optional[Speculation] = None,
        sampling_defaults: Optional[Mapping[str, float]] = None,
        async_scheduling: bool = False,
    ):
        """async_scheduling: detokenize and hand on a runner call's outputs while the next call runs (on a thread
        of their own), instead of between the two. The runner is still called from one thread, in order, and each
        call's batch is built from the token ids of the call before it; a stop string is found one call late, so a
        request it ends may have run one more step, whose token is dropped (as vLLM's async scheduling does)."""
        self.runner = runner
        self.tokenizer = tokenizer
        self.decoder = text_decoder(tokenizer)  # what each request's detokenizer decodes with
        self.capacity = runner.capacity()
        self.capabilities = runner.capabilities()
        self.eos_token_ids = frozenset(eos_token_ids)
        self.request_timeout_s = request_timeout_s
        self.speculation = speculation  # None: no speculation (build_speculation makes it from the config)
        #: Request defaults from the model's generation_config.json (temperature, top_p, top_k, repetition_penalty).
        self.sampling_defaults = dict(sampling_defaults or {})
        self.scheduler = Scheduler(self.capacity.max_num_seqs, max_num_batched_tokens)
        self.stats = EngineStats(num_running=0, num_waiting=0, num_slots=self.capacity.max_num_seqs)
        self._texter = ThreadPoolExecutor(1, thread_name_prefix="detokenize") if async_scheduling else None
        self._untexted: list[Request] = []  # the last runner call's requests, while their text waits for the next

    def make_request(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> Request:
        """Build a request's state (cheap; any thread). Limits were validated at the edge."""
        req = Request(
            request_id=request_id,
            prompt_ids=list(prompt_ids),
            params=params,
            detokenizer=IncrementalDetokenizer.for_prompt(self.decoder, prompt_ids),
            stop_matcher=StopStringMatcher(tuple(params.stop), include_stop=params.include_stop_str_in_output),
            eos_token_ids=self.eos_token_ids,
            max_model_len=self.capacity.max_model_len,
            deadline=0.0,
        )
        req.deadline = req.metrics.arrival + self.request_timeout_s
        return req

    def add(self, request: Request) -> None:
        self.scheduler.add(request)

    def abort(self, request_ids: Iterable[str]) -> None:
        """Abort these requests (client gone, timeout); their slots free at the next step."""
        self.scheduler.abort(request_ids)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or bool(self._untexted)

    def discard_untexted(self) -> None:
        """Forget the outputs waiting for the next step (the step loop fails every unfinished request instead)."""
        self._untexted = []

    def step(self, emit: Emit) -> None:
        """One iteration. Each runner call's tokens are detokenized and handed on before the next call starts (so a
        prefill's first tokens are out before the decode runs), or, with async scheduling, while it runs."""
        started = time.perf_counter()
        self.scheduler.abort_expired(time.monotonic())
        plan = self.scheduler.schedule()
        untexted, self._untexted = self._untexted, []
        if plan.aborted:
            for req in plan.aborted:
                self._release_slot(req)
            gone = {id(r) for r in plan.aborted}
            untexted = [r for r in untexted if id(r) not in gone]
            emit(self._take_outputs(plan.aborted))
        ran = False
        for reqs, prepare in ((plan.prefills, self._prefill), (plan.decodes, self._decode)):
            reqs = [r for r in reqs if r.finish_reason is None]  # a stop string may have ended it meanwhile
            if not reqs:
                continue
            call = prepare(reqs)  # built before any text runs beside it: the two never touch the same request
            text = self._texter.submit(self._text, untexted, emit) if self._texter and untexted else None
            result = self._run(call, len(reqs))
            if text is not None:
                self._finish(text.result())
            untexted = self._apply(reqs, result)
            if self._texter is None:
                self._finish(self._text(untexted, emit))
                untexted = []
            ran = True
        if ran:
            self._untexted = untexted
        elif untexted:  # nothing to run beside the text: it runs now
            self._finish(self._text(untexted, emit))
        stats = self.stats
        stats.num_running = self.scheduler.num_running
        stats.num_waiting = self.scheduler.num_waiting
        if not plan.empty:
            stats.steps_total += 1
            stats.step_seconds_total += time.perf_counter() - started
            stats.prefill_calls_total += bool(plan.prefills)
            stats.prefill_rows_total += len(plan.prefills)
            stats.decode_calls_total += bool(plan.decodes)
            stats.decode_rows_total += len(plan.decodes)

    def _prefill(self, reqs: list[Request]) -> Callable[[], StepOutput]:
        self.stats.prompt_tokens_total += sum(len(r.prompt_ids) for r in reqs)
        batch = PrefillBatch(
            slots=[r.slot for r in reqs],
            prompt_ids=[r.prompt_ids for r in reqs],
            sampling=[r.row for r in reqs],
            num_logprobs=[r.params.logprobs for r in reqs],
        )
        slots = list(batch.slots)

        def call() -> StepOutput:
            out = self.runner.prefill(batch)
            proposer = self.speculation.proposer if self.speculation else None
            if proposer is not None:
                for slot, prompt, tokens in zip(slots, batch.prompt_ids, out.token_ids):
                    proposer.start(slot, prompt, tokens[0])
            return out

        return call

    def _decode(self, reqs: list[Request]) -> Callable[[], StepOutput]:
        rows = [r.row for r in reqs]
        batch = DecodeBatch(
            slots=[r.slot for r in reqs],
            last_tokens=[r.output_ids[-1] for r in reqs],
            positions=[r.num_tokens - 1 for r in reqs],
            sampling=rows,
            num_logprobs=[r.params.logprobs for r in reqs],
        )
        spec = self.speculation
        budgets = [self._spec_budget(r, row) for r, row in zip(reqs, rows)] if spec else []
        histories = [r.prompt_ids + r.output_ids for r in reqs] if any(budgets) and spec.proposer else []
        slots = list(batch.slots)

        def call() -> StepOutput:
            if not any(budgets):
                out = self.runner.decode(batch)
            else:
                out = speculative_decode(self.runner, spec, batch, budgets, histories,
                                         self.capabilities.sampling.max_top_k)
            if spec is not None and spec.proposer is not None:
                for slot, tokens in zip(slots, out.token_ids):
                    spec.proposer.accept(slot, tokens)
            return out

        return call

    def _spec_budget(self, req: Request, row: RowSampling) -> int:
        """Draft tokens worth proposing this step; 0 = decode without speculation.

        Rows with logprobs or logits processors never speculate (those come from plain decode steps). A per-row
        runner gets k reduced so the step passes neither max_model_len nor max_tokens; a runner compiled for
        one k gets k or, in a slot's last k positions (where verification would write past the KV line), 0.
        """
        spec = self.speculation
        if spec is None or req.params.logprobs is not None or row.processes_logits:
            return 0
        room_in_cache = self.capacity.max_model_len - req.num_tokens  # verification writes k more positions
        if not spec.per_row_length:
            return spec.k if room_in_cache >= spec.k else 0
        return max(0, min(spec.k, room_in_cache, req.max_new_tokens - 1))

    def _count_speculation(self, out: StepOutput) -> None:
        if not out.num_draft_tokens:
            return
        stats = self.stats
        for drafted, tokens in zip(out.num_draft_tokens, out.token_ids):
            if not drafted:
                continue
            accepted = len(tokens) - 1
            stats.spec_drafts_total += 1
            stats.spec_draft_tokens_total += drafted
            stats.spec_accepted_tokens_total += accepted
            if len(stats.spec_accepted_per_position) < drafted:
                stats.spec_accepted_per_position.extend([0] * (drafted - len(stats.spec_accepted_per_position)))
            for position in range(accepted):
                stats.spec_accepted_per_position[position] += 1

    def _run(self, call: Callable[[], StepOutput], rows: int) -> StepOutput | Exception:
        """One runner call; a failing call fails only the requests in it (the process keeps serving the others)."""
        started = time.perf_counter()
        try:
            return call()
        except Exception as exc:
            log.exception("runner step failed for %d request(s)", rows)
            return exc
        finally:
            self.stats.runner_seconds_total += time.perf_counter() - started

    def _apply(self, reqs: list[Request], result: StepOutput | Exception) -> list[Request]:
        """Append a call's token ids to its requests (those a stop string ended meanwhile take none) and end those
        whose tokens end them; returns the requests with something to hand on."""
        if isinstance(result, Exception):
            why = f"model runner failed: {type(result).__name__}: {result}"
            for req in reqs:
                if req.finish_reason is None:
                    req.finish_reason, req.error = FINISH_ERROR, why
        else:
            self._count_speculation(result)
            now = time.monotonic()
            for i, req in enumerate(reqs):
                if req.finish_reason is not None:
                    continue
                req.append_token_ids(result.token_ids[i], result.logprobs[i] if result.logprobs else None)
                if req.metrics.first_token is None and req.output_ids:
                    req.metrics.first_token = now
        live = [req for req in reqs if req.status is not RequestStatus.FINISHED]  # else a stop string ended it
        self._finish([req for req in live if req.finish_reason is not None])
        return live

    def _text(self, reqs: list[Request], emit: Emit) -> list[Request]:
        """Detokenize the requests' new tokens and hand on their outputs; returns those a stop string ended (their
        slots are freed by the caller, after the runner call this may run beside)."""
        ended = [req for req in reqs if req.detokenize()]
        outputs = self._take_outputs([r for r in reqs if r.finish_reason is not None or r.pending_ids])
        if outputs:
            emit(outputs)
        return ended

    def _take_outputs(self, reqs: list[Request]) -> list[RequestOutput]:
        outputs = [req.take_output() for req in reqs]
        self.stats.generation_tokens_total += sum(len(out.token_ids) for out in outputs)
        return outputs

    def _finish(self, reqs: list[Request]) -> None:
        """End requests whose finish reason is set: out of the scheduler, their slots freed."""
        for req in reqs:
            self.scheduler.finish(req)
            self._release_slot(req)

    def _release_slot(self, req: Request) -> None:
        if req.slot is not None:
            self.runner.release(req.slot)
            if self.speculation is not None and self.speculation.proposer is not None:
                self.speculation.proposer.release(req.slot)
