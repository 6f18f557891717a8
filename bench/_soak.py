"""The soak (`make soak`, SOAK_SECONDS=1800 by default; not part of `make test` or `make bench`): serve a model as
`make run` does (the default model, SmolLM2-135M-Instruct; --model tiny for the committed tiny one) and send mixed
traffic for --seconds with bench/_load.py: chat and completions, short and long prompts and outputs, about twice as
many clients as batch slots (so requests queue), 10 % of them dropping each stream after its first token.

The run is cut into --windows windows of time: at the end of each one the server's RSS is read, and each request's
latency counts in the window it ended in (none for those that end after the traffic stops). The first window
is the warm-up (allocator pools, the tokenizer's caches) and counts for neither figure:

  soak_rss_growth_mb   RSS after the last window minus RSS after the warm-up (MiB): a leak grows it with time
  soak_latency_drift   p50 request latency of the last window / that of the first window after the warm-up
  soak_step_drift      the same ratio of the milliseconds per engine step (/metrics' counters): the server's and
                       the model's cost at a steady batch, apart from how the mix of requests fell into the windows
  soak_errors          requests that failed: any answer but 200 (429 included), no answer, or a stream that ended
                       without [DONE] and was not dropped by its client
  soak_requests        requests sent in all

One JSON line per window ({"window", "end_s", "rss_mb", "p50_s", "step_ms"}) precedes the figures. Windows must
hold many requests for the latency figures to mean anything: on a busy 2-core machine the default model's steps
take seconds, and a 90 s run is all warm-up (use --model tiny for a short try).

Usage: .venv/bin/python bench/_soak.py [--seconds 1800] [--model default|tiny] [--windows 10] [--clients N]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

from _harness import SERVERS, TINY_TARGET, engine_counters, figure, p50, process_tree, rss_mb, runtime_server
from _load import Record, Shape, load

from neuronmodel_runtime.config import default_model_path

PROMPTS = ("Hello", "Write a short story about a lighthouse keeper who finds a message in a bottle on the shore.",
           "List the planets of the solar system in order from the sun, with one fact about each of them, " * 3)
MAX_TOKENS = (8, 32, 96)
SHAPES = [Shape(route, prompt, max_tokens) for route in ("chat", "completions") for prompt in PROMPTS
          for max_tokens in MAX_TOKENS]
SLOTS = 8  # the runtime's default max_num_seqs, as `make run` serves


def failed(r: Record) -> bool:
    return r.status != 200 or r.error is not None or not (r.done or r.disconnected)


def window_p50s(records: list[Record], start: float, window_s: float, windows: int) -> list[float]:
    """p50 latency of the completed requests that ended in each window; those that end after the traffic stopped
    (under a lighter load) count in none."""
    latencies: list[list[float]] = [[] for _ in range(windows)]
    for r in records:
        window = int((r.started_at + r.latency_s - start) / window_s)
        if r.status == 200 and r.done and window < windows:
            latencies[window].append(r.latency_s)
    return [p50(values) if values else float("nan") for values in latencies]


def step_ms(before: dict[str, float], after: dict[str, float]) -> float:
    """Milliseconds per engine step between two readings of the counters (both move at the end of a step)."""
    steps = max(1.0, after["engine_steps"] - before["engine_steps"])
    return 1000 * (after["engine_step_seconds"] - before["engine_step_seconds"]) / steps


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
    records: list[Record] = []
    rss, counters = [], []
    with runtime_server(config) as url:
        pid = SERVERS[url].pid
        counters.append(engine_counters(url))
        start = time.monotonic()
        traffic = threading.Thread(target=lambda: records.extend(
            load(url, clients=args.clients, duration_s=args.seconds, shapes=SHAPES, finish_grace_s=300)))
        traffic.start()
        for window in range(args.windows):
            time.sleep(max(0.0, start + (window + 1) * window_s - time.monotonic()))
            rss.append(rss_mb(process_tree(pid)))
            counters.append(engine_counters(url))
        traffic.join()
    p50s = window_p50s(records, start, window_s, args.windows)
    steps = [step_ms(before, after) for before, after in zip(counters, counters[1:])]
    for window, (mb, latency, step) in enumerate(zip(rss, p50s, steps)):
        print(json.dumps({"window": window, "end_s": round((window + 1) * window_s, 1), "rss_mb": round(mb, 1),
                          "p50_s": round(latency, 4), "step_ms": round(step, 2)}), flush=True)
    extra = {"model": model.name, "seconds": args.seconds, "clients": args.clients}
    figure("soak_rss_growth_mb", rss[-1] - rss[0], "about 0: no growth once warm", **extra)
    figure("soak_latency_drift", p50s[-1] / p50s[1], "about 1: no slowdown with time", **extra)
    figure("soak_step_drift", steps[-1] / steps[1], "about 1: an engine step costs the same", **extra)
    figure("soak_errors", sum(map(failed, records)), "0", **extra)
    figure("soak_requests", len(records), "as many as the server sustains", **extra)


if __name__ == "__main__":
    main()
