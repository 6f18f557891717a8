"""Serving benchmark: the server against the bare runner, transformers and host-side sampling, side by side.

Figures (one JSON line each):
  server_over_runner           server tokens/s with B concurrent streaming clients / the runner's own tokens/s
                               on the same work (B prompts prefilled, then decoded to N tokens each)
  batching_over_hf_sequential  transformers.generate one request at a time / the server with 16 concurrent requests
                               (wall time for the same 16 requests)
  ttft_overhead_ms_p50         server time-to-first-token minus the runner's own prefill time, medians, idle server,
                               on the committed tiny model (its ~2 ms prefill keeps run-to-run noise below the
                               overhead being measured; the overhead does not depend on the model)
  penalised_row_step_cost      decode step time with one row (of the batch) carrying penalties and logit_bias / none
  ods_over_host_sampling       decode step time with full logits returned and sampled on the host / with on-device
                               sampling, batch 16

Usage: .venv/bin/python bench/serving.py [--model PATH] [--batch 16] [--tokens 64] [--repeats 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import replace

import httpx
import torch
from _harness import TINY_TARGET, figure, p50, runtime_server, stream_completion, sync

from neuronmodel_runtime.config import RuntimeConfig, default_model_path
from neuronmodel_runtime.engine.tokenizer import chat_prompt_ids, load_tokenizer
from neuronmodel_runtime.runners.base import DecodeBatch, PrefillBatch
from neuronmodel_runtime.runners.torch_reference import TorchReferenceRunner
from neuronmodel_runtime.sampling.params import GREEDY

TOPICS = ["the sea", "a mountain", "bread", "the moon", "rivers", "old books", "trains", "winter", "bees",
          "a lighthouse", "chess", "rain", "the desert", "clocks", "forests", "music"]


def prompts(tokenizer, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"Write a short story about {TOPICS[i % len(TOPICS)]}."}]
        out.append(chat_prompt_ids(tokenizer, msgs))
    return out


DEVICE = "cpu"  # --device: where the runners (and the server's) run; cuda:N when a GPU is lent


def make_runner(model: str, batch: int, on_device: bool = True) -> TorchReferenceRunner:
    config = RuntimeConfig(model=model, max_num_seqs=batch, max_model_len=512, max_context_length=256,
                           sampling={"on_device": on_device}, device=DEVICE)
    runner = TorchReferenceRunner(config, model)
    runner.load()
    return runner


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


async def server_concurrent(url: str, name: str, batch_prompts: list[list[int]], tokens: int) -> tuple[float, int]:
    body = {"model": name, "max_tokens": tokens, "ignore_eos": True, "temperature": 0}
    async with httpx.AsyncClient(timeout=600) as client:
        started = time.perf_counter()
        results = await asyncio.gather(
            *(stream_completion(client, url, {**body, "prompt": ids}) for ids in batch_prompts)
        )
        return time.perf_counter() - started, sum(r[2] for r in results)


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
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    tokenizer = load_tokenizer(args.model)
    work = prompts(tokenizer, args.batch)
    name = args.model.rstrip("/").split("/")[-1]

    config = {"model": args.model, "max_num_seqs": args.batch, "max_model_len": 512, "max_context_length": 256,
              "device": DEVICE}
    with runtime_server(config) as url:
        runner = make_runner(args.model, args.batch)
        runner_generate(runner, work[:2], 4)  # warm-up
        asyncio.run(server_concurrent(url, name, work[:2], 4))
        raw_runs, server_runs, client_cpu = [], [], []
        for _ in range(args.repeats):  # alternated, so that drift in machine speed hits both sides alike
            raw_runs.append(runner_generate(runner, work, args.tokens))
            cpu = time.process_time()
            server_runs.append(asyncio.run(server_concurrent(url, name, work, args.tokens)))
            client_cpu.append(time.process_time() - cpu)
        ods_step = decode_step_time(runner, work, 32)
        penalty_steps = [(decode_step_time(runner, work, 32), decode_step_time(runner, work, 32, penalised=1))
                         for _ in range(args.repeats)]  # alternated, like the runs above
        del runner
    raw_tps = args.batch * args.tokens / p50(raw_runs)
    server_s, server_tokens = sorted(server_runs)[len(server_runs) // 2]  # the median run
    server_tps = server_tokens / server_s
    host_runner = make_runner(args.model, args.batch, on_device=False)
    host_step = decode_step_time(host_runner, work, 32)
    del host_runner
    hf_s = hf_sequential(args.model, work, args.tokens)
    server_ttft, runner_prefill = ttft_overhead()

    figure("server_over_runner", server_tps / raw_tps, ">= 0.95", server_tok_s=round(server_tps, 1),
           runner_tok_s=round(raw_tps, 1), batch=args.batch,
           client_cpu_share=round(p50(client_cpu) / server_s, 3))  # the clients run on the server's cores
    figure("batching_over_hf_sequential", hf_s / server_s, ">= 5", hf_sequential_s=round(hf_s, 2),
           server_s=round(server_s, 2), requests=args.batch)
    figure("ttft_overhead_ms_p50", (server_ttft - runner_prefill) * 1000, "<= 5", model="tiny target",
           server_ttft_ms_p50=round(server_ttft * 1000, 2), runner_prefill_ms_p50=round(runner_prefill * 1000, 2))
    figure("ods_over_host_sampling", host_step / ods_step, ">= 1", ods_step_ms=round(ods_step * 1000, 2),
           host_step_ms=round(host_step * 1000, 2), batch=args.batch)
    plain_step, penalised_step = p50([a for a, _ in penalty_steps]), p50([b for _, b in penalty_steps])
    figure("penalised_row_step_cost", penalised_step / plain_step, "<= 1.1", plain_step_ms=round(plain_step * 1000, 2),
           penalised_step_ms=round(penalised_step * 1000, 2), batch=args.batch, penalised_rows=1)


if __name__ == "__main__":
    main()
