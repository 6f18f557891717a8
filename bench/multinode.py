"""Multi-process tensor parallelism on CPU: does TP=2 answer as TP=1, what does it cost, and what does the
leader's per-step broadcast cost.

Figures:
  tp2_matches_tp1         1 when a TP=2 group (one `serve` with its second rank as a local worker process)
                          gives the TP=1 server's greedy text for every prompt, else 0
  tp2_over_tp1_tokens_s   tokens/s of TP=2 over TP=1, the same concurrent greedy requests, both servers up side by
                          side and measured in alternation (each line also prints both step times: the mean
                          time per decoded token of one stream)
  broadcast_ms_per_step   the leader's step message at batch 64 (encode and both broadcasts; the worker receives
                          and decodes it), mean over many steps between two processes of one gloo group
                          (on Neuron a 70B step with fused speculation is about 5 ms: goal well under 1 ms)

On 2 CPU cores TP=2 runs two single-threaded processes where TP=1 runs one two-threaded process, with gloo's
all-reduce twice per layer over loopback: a correctness figure and a cost figure, not a speedup on this machine.

Usage: .venv/bin/python bench/multinode.py [--prompts 12] [--tokens 32] [--rounds 2] [--steps 500]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import time

import httpx
from _harness import TINY_TARGET, figure, free_port, runtime_server, stream_completion

PROMPTS = ["def add(a, b):", "Return the", "import os\n", "class Config:", "The function", "for i in range(",
           "    \"\"\"Read the", "if x is None:", "A list of", "raise ValueError(", "with open(", "# Parse the",
           "Parse the arguments", "def main():", "Open the file", "The list of"]


def config(tp: int) -> dict:
    return {"model": str(TINY_TARGET), "framework": "torch", "max_num_seqs": 8, "max_model_len": 512,
            "parallelism": {"tensor_parallel_degree": tp}}


def greedy(url: str, prompts: list[str], tokens: int) -> list[str]:
    body = {"model": "target", "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    return [httpx.post(url + "/v1/completions", json={**body, "prompt": p}, timeout=300).json()["choices"][0]["text"]
            for p in prompts]


async def load(url: str, prompts: list[str], tokens: int) -> tuple[float, float]:
    """(tokens/s over the whole burst, mean seconds per token of one stream after its first)."""
    body = {"model": "target", "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=300) as client:
        started = time.perf_counter()
        done = await asyncio.gather(*(stream_completion(client, url, {**body, "prompt": p}) for p in prompts))
        elapsed = time.perf_counter() - started
    total_tokens = sum(d[2] for d in done)
    per_token = statistics.mean((total - (first or 0)) / max(1, n - 1) for total, first, n, _ in done)
    return total_tokens / elapsed, per_token


def _broadcast_peer(rank: int, port: int, steps: int, batch: int, out) -> None:
    import torch

    torch.set_num_threads(1)
    from neuronmodel_runtime.distributed import channel
    from neuronmodel_runtime.distributed.channel import Op
    from neuronmodel_runtime.distributed.topology import Topology
    from neuronmodel_runtime.runners.base import DecodeBatch
    from neuronmodel_runtime.sampling.params import RowSampling

    topology = Topology(nodes=2, node_rank=rank, processes_per_node=1, local_rank=0, leader_address="127.0.0.1",
                        port=port)
    channel.init_group(topology, timeout_s=120)
    rows = [RowSampling(top_k=50, top_p=0.9, temperature=0.7, seed=i, output_ids=list(range(500)))
            for i in range(batch)]
    codec = channel.StepCodec()
    channel.barrier()
    started = time.perf_counter()
    for step in range(steps):
        if rank == 0:
            message = DecodeBatch(slots=list(range(batch)), last_tokens=[step] * batch,
                                  positions=[1000 + step] * batch, sampling=rows, num_logprobs=[None] * batch)
            channel.send(Op.DECODE, codec.encode(Op.DECODE, message))
        else:
            op, data = channel.receive()
            codec.decode(op, data)
    channel.barrier()  # the last message arrived and was decoded
    if rank == 0:
        out.put((time.perf_counter() - started) / steps * 1000)
    channel.leave_group()


def broadcast_ms(steps: int, batch: int = 64) -> float:
    ctx = multiprocessing.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    peers = [ctx.Process(target=_broadcast_peer, args=(rank, port, steps, batch, out)) for rank in (0, 1)]
    for p in peers:
        p.start()
    value = out.get(timeout=300)
    for p in peers:
        p.join(60)
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2, help="alternated load rounds per server")
    parser.add_argument("--steps", type=int, default=500, help="broadcasts timed for broadcast_ms_per_step")
    args = parser.parse_args()
    prompts = (PROMPTS * 4)[:args.prompts]

    value = broadcast_ms(args.steps)
    figure("broadcast_ms_per_step", value, "< 1", batch=64, steps=args.steps)
    with runtime_server(config(1)) as tp1, runtime_server(config(2), env={"NEURONMODEL_GROUP_PORT":
                                                                         str(free_port())}) as tp2:
        one, two = greedy(tp1, prompts, args.tokens), greedy(tp2, prompts, args.tokens)
        differ = [p for p, a, b in zip(prompts, one, two) if a != b]
        figure("tp2_matches_tp1", float(not differ), "1", prompts=len(prompts), tokens=args.tokens,
               differ=differ[:3])
        rates: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
        for _ in range(args.rounds):
            for tp, url in ((1, tp1), (2, tp2)):
                rates[tp].append(asyncio.run(load(url, prompts, args.tokens)))
        tp1_rate, tp2_rate = (statistics.mean(r for r, _ in rates[tp]) for tp in (1, 2))
        tp1_step, tp2_step = (statistics.mean(s for _, s in rates[tp]) * 1000 for tp in (1, 2))
        figure("tp2_over_tp1_tokens_s", tp2_rate / tp1_rate, "report (CPU: no speedup expected)",
               tp1_tokens_s=round(tp1_rate, 1), tp2_tokens_s=round(tp2_rate, 1),
               tp1_ms_per_token=round(tp1_step, 2), tp2_ms_per_token=round(tp2_step, 2),
               streams=len(prompts), tokens=args.tokens)


if __name__ == "__main__":
    main()
