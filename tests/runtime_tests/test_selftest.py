"""selftest's checks fail when what they check is broken (the passing runs are in test_runner_suite and the README)."""

from __future__ import annotations

from pathlib import Path

from neuronmodel_runtime.cli import build_engine
from neuronmodel_runtime.config import load_config
from neuronmodel_runtime.runners.base import DecodeBatch, PrefillBatch
from neuronmodel_runtime.sampling.params import GREEDY
from neuronmodel_runtime.selftest import FAIL, PASS, SKIP, run_checks, table

TARGET = Path(__file__).resolve().parents[1] / "assets" / "tiny" / "target"


def engine(**overrides):
    fields = {"model": str(TARGET), "framework": "torch", "max_num_seqs": 4, "max_model_len": 64,
              "max_context_length": 32, **overrides}
    return build_engine(load_config(None, fields, env={})).engine


def prompts(e):
    return [e.tokenizer.encode("The capital of France is"), e.tokenizer.encode("Write a haiku")]


def test_a_runner_that_ignores_per_request_sampling_fails_the_sampled_check():
    e = engine()
    runner = e.runner
    prefill, decode = runner.prefill, runner.decode
    runner.prefill = lambda b: prefill(PrefillBatch(b.slots, b.prompt_ids, [GREEDY] * len(b.slots)))
    runner.decode = lambda b: decode(DecodeBatch(b.slots, b.last_tokens, b.positions, [GREEDY] * len(b.slots)))
    checks = {c.name: c for c in run_checks(e, prompts(e), 8, False, None)}
    assert checks["greedy"].result == PASS and checks["sampled"].result == FAIL
    assert checks["compiled artifacts"].result == SKIP and table(checks.values(), {}).endswith("selftest FAILED")


def test_rows_that_read_each_others_kv_lines_fail_the_greedy_check():
    e = engine()
    decode = e.runner.decode
    e.runner.decode = lambda b: decode(DecodeBatch(b.slots[::-1], b.last_tokens, b.positions, b.sampling))
    checks = {c.name: c for c in run_checks(e, prompts(e)[::-1], 8, False, None)}
    assert checks["greedy"].result == FAIL, checks["greedy"].detail


def test_artifacts_that_recompile_fail_the_round_trip():
    e = engine()

    class Recompiling:
        def info(self):
            return {"compiled_now": True, "artifacts": "/tmp/x"}

    original = e.runner

    def rebuild():
        fresh = engine().runner
        fresh.info = Recompiling().info
        return fresh

    checks = {c.name: c for c in run_checks(e, prompts(e), 6, False, rebuild)}
    assert checks["compiled artifacts"].result == FAIL and "without compiling: False" in checks["compiled artifacts"].detail
    assert e.runner is not original  # the second runner served the round trip
