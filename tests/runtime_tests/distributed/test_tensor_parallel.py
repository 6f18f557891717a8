"""The tensor-parallel shard against transformers: n ranks of the reference model, each on its own thread with an
in-memory all-reduce, give transformers' logits; every rank ends with the same full logits (the sampler needs no
gather); and a degree that does not divide the model is refused naming the field."""

import threading

import pytest
import torch

from neuronmodel_runtime.runners.base import RunnerError
from neuronmodel_runtime.runners.checkpoint import build_weights, read_config, read_tensors
from neuronmodel_runtime.runners.llama import LlamaModel
from neuronmodel_runtime.runners.tensor_parallel import shard

transformers = pytest.importorskip("transformers")


class ThreadGroup:
    """An all-reduce between n threads, summing in rank order as every rank sees it."""

    def __init__(self, world: int):
        self.parts: list = [None] * world
        self.barrier = threading.Barrier(world)

    def reduce_of(self, rank: int):
        def reduce(partial: torch.Tensor) -> torch.Tensor:
            self.parts[rank] = partial.clone()
            self.barrier.wait()
            total = sum(self.parts[1:], self.parts[0].clone())
            self.barrier.wait()
            return partial.copy_(total)
        return reduce


def sharded_logits(folder, world: int, tokens: torch.Tensor, slots: list[int], start: list[int]) -> list:
    config = read_config(folder, 64)
    weights = build_weights(config, read_tensors(folder), torch.device("cpu"), torch.float32)
    group, out = ThreadGroup(world), [None] * world

    def run(rank: int) -> None:
        part, rank_weights = shard(config, weights, rank, world)
        model = LlamaModel(part, rank_weights, 4, 64, reduce=group.reduce_of(rank))
        assert model.k_cache.shape[2] == config.num_kv_heads // world, "each rank caches its own heads only"
        out[rank] = model.forward(tokens, slots, start)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


@pytest.fixture(scope="module")
def biased_llama(tmp_path_factory):
    """A Llama with attention_bias (q, k, v and o biases, random): the output projection's bias is added once."""
    torch.manual_seed(99)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      attention_bias=True, initializer_range=0.15, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).eval()
    for layer in model.model.layers:
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj):
            torch.nn.init.normal_(proj.bias, std=0.5)
    folder = tmp_path_factory.mktemp("tiny-llama-bias")
    model.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("kind", ["llama", "qwen2", "llama-bias"])
@pytest.mark.parametrize("world", [2])
def test_ranks_give_transformers_logits(tiny_checkpoint, biased_llama, kind, world):
    folder = biased_llama if kind == "llama-bias" else tiny_checkpoint(kind)
    torch.manual_seed(0)
    tokens = torch.randint(1, 96, (2, 12))
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        expected = reference(tokens).logits
        ranks = sharded_logits(folder, world, tokens, [0, 1], [0, 0])
    for rank, logits in enumerate(ranks):
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4, msg=f"rank {rank}")
    assert all(torch.equal(ranks[0], r) for r in ranks[1:]), "every rank has the same logits"


def test_a_degree_that_splits_no_head_evenly_is_refused(tiny_checkpoint):
    folder = tiny_checkpoint("llama")  # 4 query heads, 2 KV heads
    config = read_config(folder, 64)
    weights = build_weights(config, read_tensors(folder), torch.device("cpu"), torch.float32)
    with pytest.raises(RunnerError, match=r"tensor_parallel_degree 4 does not divide the model's "
                                          r"num_key_value_heads \(2\)"):
        shard(config, weights, 0, 4)
