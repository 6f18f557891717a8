"""The soak (`make soak`, SOAK_SECONDS=1800 by default; not part of `make test` or `make bench`): serve a model as
`make run` does (the default model, SmolLM2-135M-Instruct; --model tiny for the committed tiny one) and send mixed
traffic for --seconds with bench/_load.py: chat and completions, short and long prompts and outputs, about twice as
many clients as batch slots (so requests queue), 10 % of them dropping each stream after its first token.

The run is cut into --windows windows; after each one the server's RSS is read and the window's latencies kept.
The first window is the warm-up (allocator pools, the tokenizer's caches) and counts for neither figure:

  soak_rss_growth_mb   RSS after the last window minus RSS after the warm-up (MiB): a leak grows it with time
  soak_latency_drift   p50 request latency of the last window / that of the first window after the warm-up
  soak_errors          requests that failed: any answer but 200 (429 included), no answer, or a stream that ended
                       without [DONE] and was not dropped by its client
  soak_requests        requests sent in all

One JSON line per window ({"window": ..., "rss_mb": ..., "p50_s": ..., "requests": ...}) precedes the figures.

Usage: .venv/bin/python bench/_soak.py [--seconds 1800] [--model default|tiny] [--windows 10] [--clients N]
"""

from __future__ import annotations

import argparse
import json
import os

from _harness import SERVERS, TINY_TARGET, figure, p50, rss_mb, runtime_server
from _load import Record, Shape, load

from neuronmodel_runtime.config import default_model_path

PROMPTS = ("Hello", "Write a short story about a lighthouse keeper who finds a message in a bottle on the shore.",
           "List the planets of the solar system in order from the sun, with one fact about each of them, " * 3)
MAX_TOKENS = (8, 64, 160)
SHAPES = [Shape(route, prompt, max_tokens) for route in ("chat", "completions") for prompt in PROMPTS
          for max_tokens in MAX_TOKENS]
SLOTS = 8  # the runtime's default max_num_seqs, as `make run` serves


def failed(r: Record) -> bool:
    return r.status != 200 or r.error is not None or not (r.done or r.disconnected)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_SECONDS", 1800)))
    parser.add_argument("--model", choices=("default", "tiny"), default="default")
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--clients", type=int, default=2 * SLOTS)
    args = parser.parse_args()
    if args.windows < 3:
        parser.error("--windows must be at least 3: a warm-up, a first and a last window")
    model = TINY_TARGET if args.model == "tiny" else default_model_path()
    config = {"model": str(model), "framework": "torch", "max_num_seqs": SLOTS, "max_model_len": 512,
              "max_context_length": 256}
    window_s = args.seconds / args.windows
    rss, p50s, records = [], [], []
    with runtime_server(config) as url:
        pid = SERVERS[url].pid
        for window in range(args.windows):
            batch = load(url, clients=args.clients, duration_s=window_s, shapes=SHAPES, seed=window)
            records += batch
            latencies = [r.latency_s for r in batch if r.status == 200 and r.done]
            rss.append(rss_mb(pid))
            p50s.append(p50(latencies) if latencies else float("nan"))
            print(json.dumps({"window": window, "rss_mb": round(rss[-1], 1), "p50_s": round(p50s[-1], 4),
                              "requests": len(batch), "failed": sum(map(failed, batch))}), flush=True)
    extra = {"model": model.name, "seconds": args.seconds, "clients": args.clients}
    figure("soak_rss_growth_mb", rss[-1] - rss[0], "about 0: no growth once warm", **extra)
    figure("soak_latency_drift", p50s[-1] / p50s[1], "about 1: no slowdown with time", **extra)
    figure("soak_errors", sum(map(failed, records)), "0", **extra)
    figure("soak_requests", len(records), "as many as the server sustains", **extra)


if __name__ == "__main__":
    main()
