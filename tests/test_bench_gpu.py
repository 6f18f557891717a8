"""bench/gpu.sh and bench/_gpu.py, without a GPU: what the script says where it cannot run, and that the model it
builds (small here) is one the reference runner serves, with a tokenizer that covers its whole vocabulary. The whole
script runs on the CPU with GPU_BENCH_SMALL=1 (about 2 minutes: not a test)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU_SH = ROOT / "bench" / "gpu.sh"
OFFLINE = {"GPU_BENCH_INDEX": "http://127.0.0.1:9/", "GPU_BENCH_WHEELS": "/nonexistent"}  # port 9: refused


def gpu_sh(tmp_path: Path, python: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(GPU_SH), str(tmp_path / "out")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **OFFLINE, "PYTHON": python, **env})


def test_without_a_cuda_torch_or_pypi_it_says_so_and_exits_4(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    done = gpu_sh(tmp_path, sys.executable)
    assert done.returncode == 4, done.stderr
    assert "torch sees no CUDA device, and PyPI (for one that does) cannot be reached" in done.stderr


def test_a_missing_module_offline_is_named_and_exits_3(tmp_path):
    bare = tmp_path / "python-without-site"  # the same interpreter without its site-packages
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    done = gpu_sh(tmp_path, str(bare))
    assert done.returncode == 3, done.stderr
    assert "missing: torch transformers" in done.stderr and "bench/gpu.sh --wheels" in done.stderr


@pytest.fixture(scope="module")
def gpu_module():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return importlib.import_module("_gpu")
    finally:  # _gpu takes bench/ off the path itself; in case it did not
        sys.path[:] = [p for p in sys.path if p != str(ROOT / "bench")]


def test_the_padded_tokenizer_decodes_every_id_and_encodes_as_the_tiny_one(gpu_module, tmp_path):
    from neuronmodel_runtime.server.tokenizer import load_tokenizer

    gpu_module.write_tokenizer(tmp_path, 128256)
    padded, tiny = load_tokenizer(tmp_path), load_tokenizer(gpu_module.TINY_TARGET)
    assert len(padded) == 128256
    assert padded.decode([128255]) == "<|x128255|>"
    text = "Write a short story about the sea."
    assert padded.encode(text) == tiny.encode(text)


def test_the_small_model_is_served_by_the_reference_runner(gpu_module, tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_module, "SMALL", True)
    folder = gpu_module.build_model(tmp_path / "model", "cpu")
    serving = sys.modules["serving"]
    runner = serving.make_runner(str(folder), 2)
    assert runner.capacity().vocab_size == gpu_module.SMALL_LLAMA["vocab_size"]
    work = serving.prompts(serving.load_tokenizer(str(folder)), 2)
    assert serving.runner_generate(runner, work, 4) > 0


def test_stages_past_the_soft_budget_are_skipped_and_failures_recorded_as_they_end(gpu_module, tmp_path):
    results = gpu_module.Results(tmp_path, gpu_module.Budget(10))
    results.stage("fails", 0, lambda: 1 / 0)
    results.stage("too_long", 60, lambda: pytest.fail("a stage ran past the soft budget"))
    results.stage("fits", 1, lambda: results.figure("gpu_fake", 2.0, ">= 1"))
    stages = json.loads((tmp_path / "gpu_results.json").read_text())["stages"]
    assert stages["fails"]["status"] == "error" and "ZeroDivisionError" in stages["fails"]["error"]
    assert stages["too_long"]["status"] == "skipped" and "needs 60" in stages["too_long"]["reason"]
    assert stages["fits"]["status"] == "ok"
    figures = [json.loads(line) for line in (tmp_path / "figures.jsonl").read_text().splitlines()]
    assert figures == [{"bench": "gpu", "figure": "gpu_fake", "value": 2.0, "goal": ">= 1"}]
