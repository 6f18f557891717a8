"""The real Engine over a runner, speculating as its config asks, driven to completion without a server."""

from __future__ import annotations

import random

from runtime_tests.helpers.fakes_runner import ByteTokenizer
from neuronmodel_runtime.engine.engine import Engine
from neuronmodel_runtime.engine.speculation import build_speculation


def spec_fields(mode, k, draft=None):
    return {"speculation": {"mode": mode, "num_speculative_tokens": k, "draft_model": str(draft) if draft else None}}


def spec_engine(runner, eos=()):
    """The real Engine over `runner`, speculating as the runner's config asks (as cli.build_engine wires it)."""
    return Engine(runner, ByteTokenizer(), set(eos), max_num_batched_tokens=4096,
                  speculation=build_speculation(runner.config.speculation, runner))


def run_engine(runner, requests, eos=()):
    """requests: (id, prompt ids, SamplingParams) -> id -> output token ids; also returns the engine."""
    engine = spec_engine(runner, eos)
    for rid, prompt, params in requests:
        engine.add(engine.make_request(rid, prompt, params))
    outputs = {rid: [] for rid, _, _ in requests}

    def emit(outs):
        for out in outs:
            outputs[out.request_id] += out.token_ids

    while engine.has_work:
        engine.step(emit)
    return outputs, engine


def prompts(n, vocab=96, seed=0):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        motif = [rng.randrange(1, vocab) for _ in range(rng.randint(2, 5))]
        out.append((motif * 6)[: rng.randint(3, 24)])  # repetitive, so prompt lookup finds matches
    return out
