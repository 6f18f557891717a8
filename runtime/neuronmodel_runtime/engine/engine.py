"""The engine step: schedule -> execute -> update. Synchronous, single-threaded, no HTTP and no asyncio."""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable, Mapping, Optional, Sequence

from neuronmodel_runtime.engine.detokenizer import Decoder, IncrementalDetokenizer, StopStringMatcher, text_decoder
from neuronmodel_runtime.engine.outputs import FINISH_ERROR, EngineStats, RequestOutput
from neuronmodel_runtime.engine.request import Request
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
    ):
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
        return self.scheduler.has_work

    def step(self, emit: Emit) -> None:
        """One iteration. Prefill outputs are emitted before the decode runs, so first tokens are not delayed."""
        started = time.perf_counter()
        self.scheduler.abort_expired(time.monotonic())
        plan = self.scheduler.schedule()
        for req in plan.aborted:
            self._release_slot(req)
        if plan.aborted:
            emit([req.take_output() for req in plan.aborted])
        if plan.prefills:
            self._execute(plan.prefills, self._prefill)
            emit(self._update(plan.prefills))
        if plan.decodes:
            self._execute(plan.decodes, self._decode)
            emit(self._update(plan.decodes))
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

    def _prefill(self, reqs: list[Request]) -> StepOutput:
        self.stats.prompt_tokens_total += sum(len(r.prompt_ids) for r in reqs)
        out = self.runner.prefill(
            PrefillBatch(
                slots=[r.slot for r in reqs],
                prompt_ids=[r.prompt_ids for r in reqs],
                sampling=[r.row for r in reqs],
                num_logprobs=[r.params.logprobs for r in reqs],
            )
        )
        proposer = self.speculation.proposer if self.speculation else None
        if proposer is not None:
            for req, tokens in zip(reqs, out.token_ids):
                proposer.start(req.slot, req.prompt_ids, tokens[0])
        return out

    def _decode(self, reqs: list[Request]) -> StepOutput:
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
        if not any(budgets):
            out = self.runner.decode(batch)
        else:
            histories = [r.prompt_ids + r.output_ids for r in reqs] if spec.proposer is not None else []
            out = speculative_decode(self.runner, spec, batch, budgets, histories,
                                     self.capabilities.sampling.max_top_k)
        if spec is not None and spec.proposer is not None:
            for req, tokens in zip(reqs, out.token_ids):
                spec.proposer.accept(req.slot, tokens)
        return out

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

    def _execute(self, reqs: list[Request], run: Callable[[list[Request]], StepOutput]) -> None:
        """Run one runner call and append its tokens; a failing call fails only the requests in it."""
        started = time.perf_counter()
        try:
            out = run(reqs)
        except Exception as exc:  # the process keeps serving the others
            log.exception("runner step failed for %d request(s)", len(reqs))
            for req in reqs:
                req.finish_reason, req.error = FINISH_ERROR, f"model runner failed: {type(exc).__name__}: {exc}"
            return
        finally:
            self.stats.runner_seconds_total += time.perf_counter() - started
        self._count_speculation(out)
        now = time.monotonic()
        for i, req in enumerate(reqs):
            before = len(req.output_ids)
            req.append_tokens(out.token_ids[i], out.logprobs[i] if out.logprobs else None)
            self.stats.generation_tokens_total += len(req.output_ids) - before
            if req.metrics.first_token is None and req.output_ids:
                req.metrics.first_token = now

    def _update(self, reqs: list[Request]) -> list[RequestOutput]:
        outputs = []
        for req in reqs:
            if req.finish_reason is not None:
                self.scheduler.finish(req)
                self._release_slot(req)
            if req.finished or req.pending_ids:
                outputs.append(req.take_output())
        return outputs

    def _release_slot(self, req: Request) -> None:
        if req.slot is not None:
            self.runner.release(req.slot)
            if self.speculation is not None and self.speculation.proposer is not None:
                self.speculation.proposer.release(req.slot)
