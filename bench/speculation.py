"""Speculative decoding benchmark: acceptance, measured speedup, and measured over theoretical speedup.

Two setups, each measured side by side with the same requests decoded without speculation (greedy, one request
at a time, through the real engine):
  draft         the committed tiny target with its 1-layer distilled draft, chat prompts (EOS ignored, so every
                request decodes the full length: the tiny model otherwise stops after ~11 tokens)
  promptLookup  the embedded default model asked to repeat / lightly edit a text (n-gram proposals, no draft)

Figures: spec_acceptance (accepted / proposed draft tokens), spec_speedup (decode-phase time, first token to
finish, without / with speculation; the end-to-end ratio, prefill included, is printed beside it),
spec_measured_over_theory, where theory is Leviathan et al.'s E = (1 - a^(k+1)) / ((1 - a)(k c + 1)) with a fitted
so that (1 - a^(k+1)) / (1 - a) equals the measured mean tokens per step, and c the measured cost of one draft
forward over one target decode forward (0 for prompt lookup, whose proposals cost host microseconds).

Usage: .venv/bin/python bench/speculation.py [--tokens 64] [--k 4] [--device cpu]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Optional

import torch
from _harness import TINY_DRAFT, TINY_TARGET, figure, p50, sync

from neuronmodel_runtime.config import RuntimeConfig, default_model_path
from neuronmodel_runtime.engine.engine import Engine
from neuronmodel_runtime.engine.speculation import build_speculation
from neuronmodel_runtime.engine.outputs import EngineStats
from neuronmodel_runtime.server.tokenizer import chat_prompt_ids, eos_token_ids, load_tokenizer
from neuronmodel_runtime.runners.torch_reference import TorchReferenceRunner
from neuronmodel_runtime.sampling.params import SamplingParams

CHAT = ["What does os.path.join do?", "Return the number of items in a list.", "How do I open a file?",
        "What does json.dumps do?", "Explain the sort method.", "What is a context manager?"]
TEXT = ("The quick brown fox jumps over the lazy dog. The dog sleeps in the warm sun all afternoon, "
        "and the fox runs back into the forest before the farmer comes home.")
REPEAT = [f"Repeat the following text exactly, changing nothing:\n\n{TEXT}",
          f"Rewrite this text, replacing 'fox' with 'cat':\n\n{TEXT}",
          f"Copy this text word for word:\n\n{TEXT}"]


DEVICE = "cpu"  # --device


def make_runner(model: Path, spec: Optional[dict]) -> TorchReferenceRunner:
    fields = dict(model=str(model), max_num_seqs=1, max_model_len=512, max_context_length=256, device=DEVICE)
    config = RuntimeConfig(**fields, speculation=spec or {})
    runner = TorchReferenceRunner(config, str(model))
    runner.load()
    return runner, config


def run(model: Path, spec: Optional[dict], prompts: list[list[int]], tokens: int, eos: set[int], ignore_eos: bool):
    """Decode every prompt alone; returns ((end-to-end s, decode-phase s), engine stats, outputs)."""
    runner, config = make_runner(model, spec)
    engine = Engine(runner, load_tokenizer(model), eos, 4096, speculation=build_speculation(config.speculation, runner))
    outputs: dict[str, list[int]] = {}
    decode_s: list[float] = []  # per measured request: first token to finish (the phase speculation speeds up)

    def emit(outs):
        for out in outs:
            outputs.setdefault(out.request_id, []).extend(out.token_ids)
            if out.finished and not out.request_id.startswith("warm"):
                decode_s.append(out.metrics.finished - out.metrics.first_token)

    for i, ids in enumerate(prompts[:1]):  # warm-up
        engine.add(engine.make_request(f"warm{i}", ids, SamplingParams(temperature=0, max_tokens=4)))
    while engine.has_work:
        engine.step(emit)
    engine.stats = EngineStats(num_running=0, num_waiting=0, num_slots=1)  # count the measured part only
    started = time.perf_counter()
    for i, ids in enumerate(prompts):
        params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=ignore_eos)
        engine.add(engine.make_request(str(i), ids, params))
        while engine.has_work:
            engine.step(emit)
    timing = (time.perf_counter() - started, sum(decode_s))
    return timing, engine.stats, {k: v for k, v in outputs.items() if not k.startswith("w")}


def forward_cost(model: Path, width: int = 1, steps: int = 40) -> float:
    """Median seconds of one forward of `width` new tokens at batch 1 (1: a decode; k+1: a verification)."""
    runner, _ = make_runner(model, None)
    net = runner.model
    times = []
    with torch.inference_mode():
        net.forward(torch.tensor([[1, 2, 3, 4]]), [0], [0])
        for pos in range(4, 4 + steps):
            sync(DEVICE)
            started = time.perf_counter()
            net.forward(torch.tensor([[5] * width]), [0], [pos])
            sync(DEVICE)
            times.append(time.perf_counter() - started)
    return p50(times)


def fit_alpha(tokens_per_step: float, k: int) -> float:
    """a such that (1 - a^(k+1)) / (1 - a) = tokens_per_step (bisection; monotone in a)."""
    lo, hi = 0.0, 1.0 - 1e-9
    for _ in range(100):
        mid = (lo + hi) / 2
        value = (1 - mid ** (k + 1)) / (1 - mid)
        lo, hi = (mid, hi) if value < tokens_per_step else (lo, mid)
    return lo


def report(setup: str, plain: tuple, spec: tuple, stats, k: int, c: float, v: float, identical: bool) -> None:
    """plain/spec: (end-to-end s, decode-phase s). The speedup is the decode phase's (prefill is not speculated).

    v: cost of scoring k+1 positions over one decode; the formula assumes 1 (true when decode is memory-bound).
    """
    plain_s, spec_s = plain[1], spec[1]
    steps = stats.spec_drafts_total
    emitted = stats.spec_accepted_tokens_total + steps
    tokens_per_step = emitted / steps
    alpha = fit_alpha(tokens_per_step, k)
    theory = (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))
    adjusted = tokens_per_step / (k * c + v)
    measured = plain_s / spec_s
    per_position = [round(n / steps, 3) for n in stats.spec_accepted_per_position]
    acceptance = stats.spec_accepted_tokens_total / stats.spec_draft_tokens_total
    # identical: greedy output with speculation equals plain decoding (exact in float32; bf16 may differ on ties)
    figure("spec_acceptance", acceptance, "> 0.15", setup=setup, per_position=per_position,
           greedy_identical=identical, mean_tokens_per_step=round(tokens_per_step, 3), alpha_fit=round(alpha, 3), k=k)
    figure("spec_speedup", measured, "> 1", setup=setup, plain_decode_s=round(plain_s, 2),
           spec_decode_s=round(spec_s, 2), end_to_end_speedup=round(plain[0] / spec[0], 3))
    figure("spec_measured_over_theory", measured / theory, ">= 0.9", setup=setup, theory=round(theory, 3),
           draft_over_target_cost=round(c, 3), verify_over_decode_cost=round(v, 3),
           measured_over_theory_with_measured_verify_cost=round(measured / adjusted, 3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device

    tok = load_tokenizer(TINY_TARGET)
    chat = [chat_prompt_ids(tok, [{"role": "user", "content": q}]) for q in CHAT]
    eos = eos_token_ids(TINY_TARGET, tok)
    plain_s, _, plain_out = run(TINY_TARGET, None, chat, args.tokens, eos, True)
    draft = {"mode": "draft", "draft_model": str(TINY_DRAFT), "num_speculative_tokens": args.k}
    spec_s, stats, spec_out = run(TINY_TARGET, draft, chat, args.tokens, eos, True)
    decode = forward_cost(TINY_TARGET)
    report("tiny draft", plain_s, spec_s, stats, args.k, forward_cost(TINY_DRAFT) / decode,
           forward_cost(TINY_TARGET, args.k + 1) / decode, spec_out == plain_out)

    model = default_model_path()
    tok = load_tokenizer(model)
    repeat = [chat_prompt_ids(tok, [{"role": "user", "content": q}]) for q in REPEAT]
    eos = eos_token_ids(model, tok)
    plain_s, _, plain_out = run(model, None, repeat, args.tokens, eos, False)
    lookup = {"mode": "promptLookup", "num_speculative_tokens": args.k}
    spec_s, stats, spec_out = run(model, lookup, repeat, args.tokens, eos, False)
    report("SmolLM2 prompt lookup", plain_s, spec_s, stats, args.k, 0.0,
           forward_cost(model, args.k + 1, steps=10) / forward_cost(model, steps=10), spec_out == plain_out)


if __name__ == "__main__":
    main()
