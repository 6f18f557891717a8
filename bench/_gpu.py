"""The reference runner on one GPU: a randomly initialised Llama of Llama-3.2-1B's shape, measured side by side.

Run by bench/gpu.sh (which installs what is missing and holds the hard time limit); GPU_BENCH_SMALL=1 runs the same
code on the CPU with a small config, so that it is tested where there is no GPU.

The model is built with transformers from a config written here (no hub: hidden 2048, 16 layers, 32 heads, 8 KV
heads, intermediate 8192, vocab 128256, tied embeddings, Llama 3's RoPE), in bfloat16, saved as a Hugging Face
folder beside the committed tiny model's byte-level BPE tokenizer with its vocabulary padded to 128256 entries
(placeholder tokens that decode as `<|x12345|>`), so that the server can detokenize anything the random model says.
Every request ignores EOS: each decodes its full length.

Stages, each its own try (an error is recorded and the next stage runs), cheapest first; a stage starts only while
the soft budget has room for it, and the results are written after each one:
  gpu_ods_over_host_sampling    decode step with the full 128k-vocabulary logits sampled on the host / with on-device
                                sampling, batch 32 (the median of 32 steps each)
  gpu_server_over_runner        server tokens/s with 32 streaming clients / the runner's own tokens/s on the same work
                                (32 prompts prefilled, then decoded to --tokens each), alternated, medians; TTFT p50
                                and both tokens/s beside it
  gpu_spec_speedup_self_draft   decode-phase time without / with draft speculation, the model as its own draft (k 4),
                                one request at a time through the engine; the acceptance beside it (1 unless bfloat16
                                rounding differs between a draft step and a verify step)
  gpu_compiled_over_eager       decode tokens/s at batch 32, the compiled runner (`compile: true`, fixed shapes at
                                max_model_len 128) / the eager one; the compile's seconds beside it

Output (OUT: --out): figures.jsonl (a `machine` record, then the figures, as bench/report.py reads them: `python
bench/report.py --from OUT/figures.jsonl --docs DIR`) and gpu_results.json (each stage: ok, error or skipped, its
seconds, and the budget).

Usage: python bench/_gpu.py --out DIR [--soft-budget 420] [--tokens 128] [--device cuda]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

import speculation
import serving
import torch
from _harness import TINY_TARGET, figure, p50, runtime_server
from report import machine

from neuronmodel_runtime.server.tokenizer import chat_prompt_ids, eos_token_ids, load_tokenizer

# bench/operator.py would shadow the standard library's operator module, which torch.compile imports afresh: bench/
# leaves the import path once its modules are imported (as in bench/cache.py)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

SMALL = os.environ.get("GPU_BENCH_SMALL") == "1"
#: Llama-3.2-1B's config.json, less what names the checkpoint.
LLAMA_1B = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True, max_position_embeddings=131072,
                rms_norm_eps=1e-5, rope_theta=500000.0, hidden_act="silu",
                rope_scaling={"rope_type": "llama3", "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                              "original_max_position_embeddings": 8192})
#: GPU_BENCH_SMALL: the same family, small enough for two CPU cores; the vocabulary still padded past the tokenizer's.
SMALL_LLAMA = {**LLAMA_1B, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 256, "vocab_size": 8192}
BATCH = 4 if SMALL else 32
SERVED = {"max_model_len": 512, "max_context_length": 256}
SPEC_K = 4


def build_model(folder: Path, device: str) -> Path:
    """A random Llama of the configured shape, in the runner's dtype for the device, saved with the padded
    tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = SMALL_LLAMA if SMALL else LLAMA_1B
    config = LlamaConfig(**shape, bos_token_id=0, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.float32 if device == "cpu" else torch.bfloat16).eval()
    model.save_pretrained(folder)
    del model
    write_tokenizer(folder, shape["vocab_size"])
    return folder


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """The tiny model's tokenizer, its vocabulary padded with placeholder tokens to `vocab_size` entries."""
    tokenizer = json.loads((TINY_TARGET / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab.update({f"<|x{i}|>": i for i in range(len(vocab), vocab_size)})
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text((TINY_TARGET / "tokenizer_config.json").read_text())


def ods_over_host(out: Results, model: str, work: list[list[int]]) -> None:
    steps = {}
    for on_device in (True, False):
        runner = serving.make_runner(model, BATCH, on_device=on_device)
        serving.decode_step_time(runner, work[:2], 4)  # warm-up
        steps[on_device] = serving.decode_step_time(runner, work, 32)
        del runner
    out.figure("gpu_ods_over_host_sampling", steps[False] / steps[True], ">= 1",
               ods_step_ms=round(steps[True] * 1e3, 2), host_step_ms=round(steps[False] * 1e3, 2), batch=BATCH,
               vocab=vocab_size(model))


def server_over_runner(out: Results, model: str, work: list[list[int]], tokens: int, repeats: int = 3) -> None:
    name = Path(model).name
    config = {"model": model, "max_num_seqs": BATCH, "device": serving.DEVICE, **SERVED}
    with runtime_server(config, ready_timeout=max(out.budget.left(), 30)) as url:
        runner = serving.make_runner(model, BATCH, **SERVED)
        serving.runner_generate(runner, work[:2], 4)  # warm-up
        asyncio.run(serving.server_concurrent(url, name, work[:2], 4))
        raw, served, ttfts = [], [], []
        for _ in range(repeats):  # alternated
            raw.append(serving.runner_generate(runner, work, tokens))
            run = asyncio.run(serving.server_concurrent(url, name, work, tokens))
            served.append(run.tokens / run.seconds)
            ttfts += run.ttfts
        del runner
    runner_tok_s, server_tok_s = len(work) * tokens / p50(raw), p50(served)
    out.figure("gpu_server_over_runner", server_tok_s / runner_tok_s, ">= 0.95",
               runner_tok_s=round(runner_tok_s, 1), server_tok_s=round(server_tok_s, 1),
               ttft_p50_ms=round(p50(ttfts) * 1e3, 1), batch=BATCH, tokens=tokens, runner="eager")


def self_draft(out: Results, model: str, tokenizer, tokens: int) -> None:
    chats = [chat_prompt_ids(tokenizer, [{"role": "user", "content": q}]) for q in speculation.CHAT[:3]]
    eos = eos_token_ids(model, tokenizer)
    plain, _, plain_out = speculation.run(Path(model), None, chats, tokens, eos, True)
    spec = {"mode": "draft", "draft_model": model, "num_speculative_tokens": SPEC_K}
    spec_s, stats, spec_out = speculation.run(Path(model), spec, chats, tokens, eos, True)
    out.figure("gpu_spec_speedup_self_draft", plain[1] / spec_s[1],
               "report (at most about 1: the draft costs what the target does)",
               acceptance=round(stats.spec_accepted_tokens_total / stats.spec_draft_tokens_total, 3),
               plain_decode_s=round(plain[1], 3), spec_decode_s=round(spec_s[1], 3), k=SPEC_K,
               greedy_identical=plain_out == spec_out, requests=len(chats), tokens=tokens)


def compiled_over_eager(out: Results, model: str, work: list[list[int]]) -> None:
    longest = max(len(ids) for ids in work)
    shape = {"max_model_len": 128, "max_context_length": 32 if longest <= 32 else 64}
    steps, load_s = {}, {}
    for compiled in (False, True):
        started = time.perf_counter()
        runner = serving.make_runner(model, BATCH, **shape, compile=compiled)
        load_s[compiled] = time.perf_counter() - started
        serving.decode_step_time(runner, work[:2], 4)  # warm-up
        steps[compiled] = serving.decode_step_time(runner, work, 32)
        del runner
    out.figure("gpu_compiled_over_eager", steps[False] / steps[True], "report",
               eager_tok_s=round(BATCH / steps[False], 1), compiled_tok_s=round(BATCH / steps[True], 1),
               compiled_load_s=round(load_s[True], 1), eager_load_s=round(load_s[False], 1), batch=BATCH, **shape)


def vocab_size(model: str) -> int:
    return json.loads((Path(model) / "config.json").read_text())["vocab_size"]


class Budget:
    """Seconds left of the soft budget; the hard one is bench/gpu.sh's `timeout`."""

    def __init__(self, soft_s: float):
        self.started, self.soft_s = time.monotonic(), soft_s

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        return self.soft_s - self.elapsed()


class Results:
    """figures.jsonl and gpu_results.json in `out`, rewritten as each stage ends."""

    def __init__(self, out: Path, budget: Budget):
        self.out, self.budget, self.stages = out, budget, {}
        out.mkdir(parents=True, exist_ok=True)
        self.figures = (out / "figures.jsonl").open("w")

    def record(self, record: dict) -> None:
        self.figures.write(json.dumps(record) + "\n")
        self.figures.flush()

    def figure(self, name: str, value: float, goal: str, **extra) -> None:
        """Print a figure (as every bench does) and keep it."""
        self.record({"bench": "gpu", **figure(name, value, goal, **extra)})

    def stage(self, name: str, needs_s: float, run: Callable[[], None]) -> None:
        """Run one stage if the soft budget has `needs_s` seconds left; record how it went."""
        if self.budget.left() < needs_s:
            self.stages[name] = {"status": "skipped", "reason": f"{self.budget.left():.0f} s of the soft budget left, "
                                                                f"needs {needs_s:.0f}"}
            print(f"# {name} skipped: {self.stages[name]['reason']}", flush=True)
        else:
            started = time.monotonic()
            try:
                run()
                self.stages[name] = {"status": "ok"}
            except Exception as exc:  # noqa: BLE001 - a stage's failure is a result; the next stage still runs
                self.stages[name] = {"status": "error", "error": f"{type(exc).__name__}: {exc}",
                                     "traceback": traceback.format_exc()[-2000:]}
                print(f"# {name} failed: {exc}", flush=True)
            self.stages[name]["seconds"] = round(time.monotonic() - started, 1)
        summary = {"stages": self.stages, "elapsed_s": round(self.budget.elapsed(), 1),
                   "soft_budget_s": self.budget.soft_s, "small": SMALL}
        path = self.out / "gpu_results.json"
        path.with_suffix(".tmp").write_text(json.dumps(summary, indent=2))
        path.with_suffix(".tmp").replace(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--soft-budget", type=float, default=420.0, help="seconds; a stage starts only within it")
    parser.add_argument("--tokens", type=int, default=16 if SMALL else 128, help="decoded per request")
    parser.add_argument("--device", default="cpu" if SMALL else "cuda")
    parser.add_argument("--work", type=Path, help="where the model folder goes (default: a temporary folder)")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"bench/_gpu.py: torch {torch.__version__} sees no CUDA device", flush=True)
        return 2
    serving.DEVICE = speculation.DEVICE = args.device
    with contextlib.nullcontext(args.work) if args.work else tempfile.TemporaryDirectory(prefix="neuronmodel-gpu-") \
            as work_dir:
        return measure(args, Path(work_dir))


def measure(args: argparse.Namespace, work_dir: Path) -> int:
    """Every stage into args.out, the model (and the compiled runner's artifacts) in `work_dir`; 0 when all ran."""
    budget = Budget(args.soft_budget)
    results = Results(args.out, budget)
    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else None
    results.record({"machine": {**machine(), "gpu": gpu, "torch": torch.__version__, "small": SMALL}})
    os.environ.setdefault("NEURONMODEL_CACHE", str(work_dir / "cache"))  # the compiled runner's artifacts
    folder = work_dir / ("llama-small-random" if SMALL else "llama-1b-random")
    results.stage("build_model", 0, lambda: build_model(folder, args.device))
    if results.stages["build_model"]["status"] != "ok":
        return 1
    model = str(folder)
    tokenizer = load_tokenizer(model)
    work = serving.prompts(tokenizer, BATCH)
    results.stage("ods_over_host_sampling", 20, lambda: ods_over_host(results, model, work))
    results.stage("server_over_runner", 60, lambda: server_over_runner(results, model, work, args.tokens))
    results.stage("spec_self_draft", 40, lambda: self_draft(results, model, tokenizer, min(args.tokens, 64)))
    results.stage("compiled_over_eager", 30 if SMALL else 150, lambda: compiled_over_eager(results, model, work))
    print(f"# bench/_gpu.py: {budget.elapsed():.0f} s; results in {args.out}", flush=True)
    return 0 if all(s["status"] == "ok" for s in results.stages.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
