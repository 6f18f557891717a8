"""`neuronmodel-runtime selftest`: what a user runs on a real inf2 / trn1 / trn2 pod to see that this runtime and the
installed Neuron stack work together, with the model and config the pod serves.

Each check drives the real engine (scheduler, runner, sampling, speculation) and passes or fails on what a user
would see; nothing here knows which runner it drives:

- greedy: two prompts generate the same tokens batched together and one at a time (KV lines and row order right);
- sampled: in one batch, a top_k=1 row at temperature 1.5 equals greedy while a temperature-1 row leaves it
  (per-request parameters reach the device row by row); skipped on a runner that decodes greedily only;
- speculation (when configured): drafts are accepted, steps emit several tokens, and greedy output is the same
  batched and alone;
- compiled artifacts: a second runner built from the same config loads what the first compiled, without compiling,
  and generates the same greedy tokens.

CI runs it only on the reference runner and on the contract fakes, never on Neuron hardware.
"""

from __future__ import annotations

import gc
import itertools
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from neuronmodel_runtime.sampling.params import SamplingParams

PROMPTS = ("The capital of France is", "Write a haiku about the sea:")
PASS, FAIL, SKIP = "pass", "FAIL", "skip"


@dataclass
class Check:
    name: str  # what was checked
    result: str  # pass | FAIL | skip
    detail: str  # numbers, or why it failed or was skipped


_request_ids = itertools.count()


def generate(engine: Any, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams]
             ) -> tuple[list[list[int]], int]:
    """All prompts submitted at once, stepped to completion: (token ids per prompt, engine steps taken)."""
    ids = [f"selftest-{next(_request_ids)}" for _ in prompts]
    out: dict[str, list[int]] = {request_id: [] for request_id in ids}
    for request_id, prompt, p in zip(ids, prompts, params):
        engine.add(engine.make_request(request_id, list(prompt), p))
    steps = 0
    while engine.has_work:
        engine.step(lambda outputs: [out[o.request_id].extend(o.token_ids) for o in outputs])
        steps += 1
    return [out[request_id] for request_id in ids], steps


def greedy(tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)


def run_checks(engine: Any, prompt_ids: Sequence[Sequence[int]], tokens: int, speculating: bool,
               rebuild: Optional[Callable[[], Any]]) -> list[Check]:
    """Every check, in order; `rebuild` builds and loads a second runner of the same config (None: the runner
    compiles nothing, so there are no artifacts to round-trip)."""
    checks: list[Check] = []
    together, _ = generate(engine, prompt_ids, [greedy(tokens)] * len(prompt_ids))
    alone = [generate(engine, [p], [greedy(tokens)])[0][0] for p in prompt_ids]
    ok = together == alone and all(len(t) == tokens for t in together)
    checks.append(Check("greedy", PASS if ok else FAIL,
                        f"{len(prompt_ids)} prompts x {tokens} tokens, batched == alone: {together == alone}"))

    if engine.capabilities.sampling.sampled:
        rows = [SamplingParams(temperature=1.5, top_k=1, max_tokens=tokens, ignore_eos=True),
                SamplingParams(temperature=1.0, top_k=-1, max_tokens=tokens, ignore_eos=True)]
        top1, free = generate(engine, [prompt_ids[0]] * 2, rows)[0]
        ok = top1 == alone[0] and free != alone[0]
        checks.append(Check("sampled", PASS if ok else FAIL, f"top_k=1 row == greedy: {top1 == alone[0]}; "
                            f"temperature-1 row != greedy: {free != alone[0]}"))
    else:
        checks.append(Check("sampled", SKIP, "the runner decodes greedily only (the server refuses sampled requests)"))

    if speculating:
        before = engine.stats.spec_accepted_tokens_total
        spec_alone, steps = generate(engine, [prompt_ids[0]], [greedy(tokens)])
        accepted = engine.stats.spec_accepted_tokens_total - before
        ok = accepted > 0 and steps < tokens and spec_alone[0] == together[0]
        checks.append(Check("speculation", PASS if ok else FAIL,
                            f"{accepted} draft tokens accepted, {tokens} tokens in {steps} steps, "
                            f"greedy batched == alone: {spec_alone[0] == together[0]}"))
    else:
        checks.append(Check("speculation", SKIP, "speculation.mode none"))

    if rebuild is None:
        checks.append(Check("compiled artifacts", SKIP, "this runner compiles nothing"))
        return checks
    engine.runner.shutdown()  # frees its NeuronCores for the second runner
    gc.collect()
    started = time.monotonic()
    second = rebuild()
    loaded_s = time.monotonic() - started
    compiled_again = bool(second.info().get("compiled_now"))
    engine.runner = second
    again, _ = generate(engine, [prompt_ids[0]], [greedy(tokens)])
    ok = not compiled_again and again[0] == alone[0]
    checks.append(Check("compiled artifacts", PASS if ok else FAIL,
                        f"reloaded from {second.info().get('artifacts')} in {loaded_s:.1f} s without compiling: "
                        f"{not compiled_again}; same greedy tokens: {again[0] == alone[0]}"))
    return checks


def table(checks: Sequence[Check], versions: dict[str, Any]) -> str:
    """The report: versions, then one line per check."""
    lines = [f"{k}: {v}" for k, v in versions.items()]
    width = max(len(c.name) for c in checks)
    lines += [f"{c.result:4}  {c.name:<{width}}  {c.detail}" for c in checks]
    passed = all(c.result != FAIL for c in checks)
    lines.append("selftest " + ("passed" if passed else "FAILED"))
    return "\n".join(lines)


__all__ = ["Check", "FAIL", "PASS", "PROMPTS", "SKIP", "generate", "run_checks", "table"]
