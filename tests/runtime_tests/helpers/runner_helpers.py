"""Driving a runner in tests: build one on a checkpoint folder, and generate with prefill + batched decode."""

from __future__ import annotations

from typing import Optional

from neuronmodel_runtime.config import RuntimeConfig
from neuronmodel_runtime.runners.base import DecodeBatch, PrefillBatch
from neuronmodel_runtime.runners.torch_reference import TorchReferenceRunner
from neuronmodel_runtime.sampling.params import GREEDY, RowSampling


def make_runner(folder, **overrides) -> TorchReferenceRunner:
    """A loaded runner: 4 slots, max_model_len 64, max_context_length 32 unless overridden."""
    fields = dict(framework="torch", max_num_seqs=4, max_model_len=64, max_context_length=32)
    runner = TorchReferenceRunner(RuntimeConfig(**{**fields, **overrides}), str(folder))
    runner.load()
    return runner


def generate(
    runner: TorchReferenceRunner,
    slots: list[int],
    prompts: list[list[int]],
    steps: int,
    rows: Optional[list[RowSampling]] = None,
) -> list[list[int]]:
    """Prefill all rows together, then decode them together; returns each row's `steps` new tokens."""
    rows = rows or [GREEDY] * len(slots)
    out = [t[0] for t in runner.prefill(PrefillBatch(slots, prompts, rows)).token_ids]
    tokens = [[t] for t in out]
    for step in range(steps - 1):
        positions = [len(p) + step for p in prompts]
        out = [t[0] for t in runner.decode(DecodeBatch(slots, out, positions, rows)).token_ids]
        for row, t in zip(tokens, out):
            row.append(t)
    return tokens
