"""Serving benchmark: the server against the bare runner, transformers and host-side sampling, side by side.

Figures (one JSON line each):
  server_over_runner           server tokens/s with B concurrent streaming clients / the runner's own tokens/s
                               on the same work (B prompts prefilled, then decoded to N tokens each)
  batching_over_hf_sequential  transformers.generate one request at a time / the server with 16 concurrent requests
                               (wall time for the same 16 requests)
  ttft_overhead_ms_p50         server time-to-first-token minus the runner's own prefill time, medians, idle server
  ods_over_host_sampling       decode step time with full logits returned and sampled on the host / with on-device
                               sampling, batch 16

Usage: .venv/bin/python bench/serving.py [--model PATH] [--batch 16] [--tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx
import torch
from _harness import figure, p50, runtime_server, stream_completion

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


def make_runner(model: str, batch: int, on_device: bool = True) -> TorchReferenceRunner:
    config = RuntimeConfig(model=model, max_num_seqs=batch, max_model_len=512, max_context_length=256,
                           sampling={"on_device": on_device})
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


def decode_step_time(runner: TorchReferenceRunner, batch_prompts: list[list[int]], steps: int) -> float:
    slots = list(range(len(batch_prompts)))
    rows = [GREEDY] * len(slots)
    out = runner.prefill(PrefillBatch(slots, batch_prompts, rows))
    last, positions = [t[0] for t in out.token_ids], [len(p) for p in batch_prompts]
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        out = runner.decode(DecodeBatch(slots, last, positions, rows))
        times.append(time.perf_counter() - started)
        last, positions = [t[0] for t in out.token_ids], [p + 1 for p in positions]
    return p50(times)


def prefill_time(runner: TorchReferenceRunner, prompt: list[int]) -> float:
    started = time.perf_counter()
    runner.prefill(PrefillBatch([0], [prompt], [GREEDY]))
    elapsed = time.perf_counter() - started
    runner.release(0)
    return elapsed


def hf_sequential(model: str, batch_prompts: list[list[int]], tokens: int) -> float:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    started = time.perf_counter()
    with torch.inference_mode():
        for ids in batch_prompts:
            hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=tokens, min_new_tokens=tokens,
                        attention_mask=torch.ones(1, len(ids), dtype=torch.long))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.model)
    work = prompts(tokenizer, args.batch)
    name = args.model.rstrip("/").split("/")[-1]

    runner = make_runner(args.model, args.batch)
    runner_generate(runner, work[:2], 4)  # warm-up
    raw_s = runner_generate(runner, work, args.tokens)
    raw_tps = args.batch * args.tokens / raw_s
    prefill_s = [prefill_time(runner, ids) for ids in work]
    ods_step = decode_step_time(runner, work, 32)
    del runner
    host_runner = make_runner(args.model, args.batch, on_device=False)
    host_step = decode_step_time(host_runner, work, 32)
    del host_runner

    config = {"model": args.model, "max_num_seqs": args.batch, "max_model_len": 512, "max_context_length": 256}
    with runtime_server(config) as url:
        asyncio.run(server_concurrent(url, name, work[:2], 4))  # warm-up
        server_s, server_tokens = asyncio.run(server_concurrent(url, name, work, args.tokens))
        ttfts = asyncio.run(server_ttfts(url, name, work))
    server_tps = server_tokens / server_s
    hf_s = hf_sequential(args.model, work, args.tokens)

    figure("server_over_runner", server_tps / raw_tps, ">= 0.9", server_tok_s=round(server_tps, 1),
           runner_tok_s=round(raw_tps, 1), batch=args.batch)
    figure("batching_over_hf_sequential", hf_s / server_s, ">= 5", hf_sequential_s=round(hf_s, 2),
           server_s=round(server_s, 2), requests=args.batch)
    figure("ttft_overhead_ms_p50", (p50(ttfts) - p50(prefill_s)) * 1000, "<= 5",
           server_ttft_ms_p50=round(p50(ttfts) * 1000, 2), runner_prefill_ms_p50=round(p50(prefill_s) * 1000, 2))
    figure("ods_over_host_sampling", host_step / ods_step, "> 1", ods_step_ms=round(ods_step * 1000, 2),
           host_step_ms=round(host_step * 1000, 2), batch=args.batch)


if __name__ == "__main__":
    main()
