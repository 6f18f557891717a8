"""Pre-sharded weights in the compile-artifact cache (compile_cache.sharded_weights, torch runner, TP > 1): each
rank's first start cuts its shard from the checkpoint and stores it under a key of its own; a rank of a new pod
(an empty local cache) then reads only its shard from the store, never the checkpoint, and holds exactly what
cutting the checkpoint gives (`shard`, checked against transformers in test_tensor_parallel.py)."""

import dataclasses

import pytest
import torch

from neuronmodel_runtime.config import RuntimeConfig
from neuronmodel_runtime.runners import torch_reference
from neuronmodel_runtime.runners.base import RunnerError
from neuronmodel_runtime.runners.checkpoint import build_weights, read_config, read_tensors
from neuronmodel_runtime.runners.tensor_parallel import TensorParallel, shard
from neuronmodel_runtime.runners.torch_reference import TorchReferenceRunner

WORLD = 2


def config(store, **cache) -> RuntimeConfig:
    return RuntimeConfig(framework="torch", max_num_seqs=2, max_model_len=64, max_context_length=32,
                         parallelism={"tensor_parallel_degree": WORLD},
                         compile_cache={"url": str(store), "sharded_weights": True, **cache})


def rank_runner(folder, cfg: RuntimeConfig, rank: int) -> TorchReferenceRunner:
    runner = TorchReferenceRunner(cfg, str(folder), tensor_parallel=TensorParallel(rank, WORLD, reduce=lambda t: t))
    runner.load()  # a load runs no collective
    return runner


def layer_tensors(runner: TorchReferenceRunner) -> list[torch.Tensor]:
    return [t for layer in runner.model.weights.layers for t in dataclasses.astuple(layer) if t is not None]


def test_a_new_pods_ranks_read_only_their_shards_from_the_store(tiny_checkpoint, tmp_path, monkeypatch):
    folder, store = tiny_checkpoint("llama"), tmp_path / "store"
    monkeypatch.setenv("NEURONMODEL_CACHE", str(tmp_path / "pod-1"))
    first = [rank_runner(folder, config(store), rank) for rank in range(WORLD)]
    assert all(r.artifacts.outcome.compiled for r in first)
    keys = {r.artifacts.key.digest for r in first}
    assert len(keys) == WORLD, "a key per rank"
    assert all(r.artifacts.key.inputs["shape"]["tensor_parallel"]["layout"] for r in first)

    monkeypatch.setenv("NEURONMODEL_CACHE", str(tmp_path / "pod-2"))  # a new pod: nothing local

    def no_checkpoint(*args, **kwargs):
        raise AssertionError("a warm rank read the checkpoint")
    monkeypatch.setattr(torch_reference, "read_tensors", no_checkpoint)
    warm = [rank_runner(folder, config(store), rank) for rank in range(WORLD)]
    assert [r.artifacts.outcome.source for r in warm] == ["store"] * WORLD
    assert {r.artifacts.key.digest for r in warm} == keys

    model_config = read_config(folder, 64)
    full = build_weights(model_config, read_tensors(folder), torch.device("cpu"), torch.float32)
    for rank, runner in enumerate(warm):
        _, expected = shard(model_config, full, rank, WORLD)
        cut = [t for layer in expected.layers for t in dataclasses.astuple(layer) if t is not None]
        got = layer_tensors(runner)
        assert len(got) == len(cut) and all(torch.equal(a, b) for a, b in zip(got, cut)), f"rank {rank}"
        assert runner.model.config.num_heads == model_config.num_heads // WORLD


def test_another_degree_is_another_key(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("NEURONMODEL_CACHE", str(tmp_path / "local"))
    folder, store = tiny_checkpoint("llama"), tmp_path / "store"
    two = rank_runner(folder, config(store), 0)
    single = RuntimeConfig(**{**config(store).model_dump(), "parallelism": {"tensor_parallel_degree": 1}})
    other = TorchReferenceRunner(single, str(folder))
    other.load()
    assert other.artifacts is None, "one process: nothing to shard, nothing stored"
    assert two.artifacts.key.inputs["tensor_parallel_degree"] == WORLD


def test_policy_never_without_a_shard_fails_naming_the_field(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("NEURONMODEL_CACHE", str(tmp_path / "local"))
    with pytest.raises(RunnerError, match="compile_cache.sharded_weights: rank 1's shard: .*"):
        rank_runner(tiny_checkpoint("llama"), config(tmp_path / "store", policy="Never"), 1)


def test_the_compile_job_cuts_every_ranks_shard_and_the_ranks_read_them(tiny_checkpoint, tmp_path, monkeypatch):
    folder, store = tiny_checkpoint("llama"), tmp_path / "store"
    monkeypatch.setenv("NEURONMODEL_CACHE", str(tmp_path / "job"))
    job = TorchReferenceRunner(config(store), str(folder))  # the Job's one process: no group
    assert job.compile().outcome.compiled
    monkeypatch.setenv("NEURONMODEL_CACHE", str(tmp_path / "pod"))
    monkeypatch.setattr(torch_reference, "read_tensors", lambda *a, **k: pytest.fail("a rank read the checkpoint"))
    assert [rank_runner(folder, config(store), rank).artifacts.outcome.source for rank in range(WORLD)] == \
        ["store"] * WORLD
    plain = RuntimeConfig(**{**config(store).model_dump(), "compile_cache": {"url": str(store)}})
    assert TorchReferenceRunner(plain, str(folder)).compile() is None, "without sharded weights: nothing to compile"
