"""The torch reference runner against transformers, and its slot semantics, on tiny random checkpoints.

Tolerance: fp32 logits within 1e-4 (max abs) of transformers' on the same checkpoint; observed ~1e-6.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from neuronmodel_runtime.config import RuntimeConfig  # noqa: E402
from neuronmodel_runtime.runners.base import DecodeBatch, PrefillBatch, RunnerError  # noqa: E402
from neuronmodel_runtime.runners.torch_reference import TorchReferenceRunner, prefill_groups  # noqa: E402
from neuronmodel_runtime.sampling.params import GREEDY, RowSampling  # noqa: E402
from runtime_tests.helpers.runner_helpers import generate, make_runner  # noqa: E402

KINDS = ["llama", "qwen2", "llama3", "mistral"]
ATOL = 1e-4
PROMPTS = [[3, 17, 5, 60, 2], [11, 12, 13, 14, 15, 16, 17, 18, 90], [7, 1, 88, 42, 42, 9, 30, 31, 5, 77, 64, 2, 3, 50]]


@pytest.fixture(scope="module", params=KINDS)
def pair(request, tiny_checkpoint):
    """(our runner, transformers' model) on the same tiny checkpoint."""
    folder = tiny_checkpoint(request.param)
    return make_runner(folder), transformers.AutoModelForCausalLM.from_pretrained(folder).eval()


def hf_logits(hf, ids: list[int]) -> "torch.Tensor":
    with torch.inference_mode():
        return hf(torch.tensor([ids])).logits[0]  # [T, V]


@torch.inference_mode()
def test_prefill_logits_match_transformers(pair):
    runner, hf = pair
    ids = PROMPTS[2]
    ours = runner.model.forward(torch.tensor([ids]), [2], [0])[0]
    assert (ours - hf_logits(hf, ids)).abs().max() < ATOL


@torch.inference_mode()
def test_right_padded_batch_matches_each_prompt_alone(pair):
    runner, hf = pair
    width = max(len(p) for p in PROMPTS)
    tokens = torch.tensor([p + [0] * (width - len(p)) for p in PROMPTS])
    logits = runner.model.forward(tokens, [3, 0, 1], [0, 0, 0])  # [3, T, V]
    for row, prompt in enumerate(PROMPTS):
        assert (logits[row, : len(prompt)] - hf_logits(hf, prompt)).abs().max() < ATOL


@torch.inference_mode()
def test_decode_step_logits_match_the_full_sequence(pair):
    runner, hf = pair
    ids = PROMPTS[2] + PROMPTS[1]
    ref = hf_logits(hf, ids)
    runner.model.forward(torch.tensor([ids[:4]]), [1], [0])
    for pos in range(4, len(ids)):
        step = runner.model.forward(torch.tensor([[ids[pos]]]), [1], [pos])[0, 0]
        assert (step - ref[pos]).abs().max() < ATOL, pos


@torch.inference_mode()
def test_several_tokens_at_an_offset_match_for_verification(pair):
    """Speculative verification feeds k+1 tokens after a cached prefix and needs logits at every one."""
    runner, hf = pair
    ids = PROMPTS[1] + PROMPTS[0]
    runner.model.forward(torch.tensor([ids[:9]]), [2], [0])
    ours = runner.model.forward(torch.tensor([ids[9:]]), [2], [9])[0]
    assert (ours - hf_logits(hf, ids)[9:]).abs().max() < ATOL


def test_greedy_output_matches_transformers_generate(pair):
    runner, hf = pair
    ours = generate(runner, [2, 0, 3], PROMPTS, steps=16)
    for prompt, tokens in zip(PROMPTS, ours):
        ref = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=16, min_new_tokens=16)
        assert tokens == ref[0, len(prompt) :].tolist()
    for slot in (0, 2, 3):
        runner.release(slot)


@torch.inference_mode()
def test_batched_decode_equals_each_slot_alone(tiny_checkpoint):
    runner = make_runner(tiny_checkpoint("llama"))
    model = runner.model
    for slot, prompt in zip([0, 1, 3], PROMPTS):
        model.forward(torch.tensor([prompt]), [slot], [0])
    last, positions = [4, 8, 15], [len(p) for p in PROMPTS]
    order = [2, 0, 1]  # rows out of slot order, positions all different
    batched = model.forward(
        torch.tensor([[last[i]] for i in order]), [[0, 1, 3][i] for i in order], [positions[i] for i in order]
    )[:, 0]
    for row, i in enumerate(order):
        alone = model.forward(torch.tensor([[last[i]]]), [[0, 1, 3][i]], [positions[i]])[0, 0]
        assert (batched[row] - alone).abs().max() < 1e-5


def test_batched_generation_equals_each_sequence_alone(tiny_checkpoint):
    runner = make_runner(tiny_checkpoint("qwen2"))
    rows = [GREEDY, RowSampling(top_k=-1, top_p=0.9, temperature=1.0, seed=5), RowSampling(20, 1.0, 0.8, 6)]
    together = generate(runner, [1, 3, 0], PROMPTS, steps=12, rows=rows)
    for slot in (0, 1, 3):
        runner.release(slot)
    alone = [generate(runner, [2], [p], steps=12, rows=[r])[0] for p, r in zip(PROMPTS, rows)]
    assert together == alone


def test_reused_slot_reads_no_stale_kv(tiny_checkpoint):
    """Garbage in every KV line (a previous sequence, or noise) never changes a new sequence's output."""
    folder = tiny_checkpoint("llama3")
    clean = generate(make_runner(folder), [0], [PROMPTS[0]], steps=10)
    runner = make_runner(folder)
    generate(runner, [0, 1], [PROMPTS[2] * 2, PROMPTS[1]], steps=20)
    runner.release(0)
    with torch.inference_mode():
        runner.model.k_cache[:, :, :, 10:].normal_(std=100.0)
        runner.model.v_cache[:, :, :, 10:].normal_(std=100.0)
    assert generate(runner, [0], [PROMPTS[0]], steps=10) == clean


def test_seeded_sampling_is_reproducible(tiny_checkpoint):
    folder = tiny_checkpoint("llama")
    row = RowSampling(top_k=-1, top_p=1.0, temperature=1.5, seed=42)
    first = generate(make_runner(folder), [0], [PROMPTS[1]], steps=20, rows=[row])
    again = generate(make_runner(folder), [3], [PROMPTS[1]], steps=20, rows=[row])
    other = generate(make_runner(folder), [0], [PROMPTS[1]], steps=20, rows=[RowSampling(-1, 1.0, 1.5, 43)])
    assert first == again
    assert first != other


def test_host_sampling_gives_the_same_tokens_and_logprobs_when_asked(tiny_checkpoint):
    folder = tiny_checkpoint("llama")
    rows = [RowSampling(top_k=-1, top_p=0.95, temperature=1.0, seed=9), GREEDY]
    device_tokens = generate(make_runner(folder), [0, 1], PROMPTS[:2], steps=6, rows=rows)
    host = make_runner(folder, sampling={"on_device": False})
    out = host.prefill(PrefillBatch([0, 1], PROMPTS[:2], rows, num_logprobs=[3, None]))
    assert out.token_ids == [[device_tokens[0][0]], [device_tokens[1][0]]]
    assert out.logprobs[1] is None
    (lp,) = out.logprobs[0]
    ref = torch.log_softmax(hf_logits(transformers.AutoModelForCausalLM.from_pretrained(folder), PROMPTS[0])[-1], -1)
    assert lp.logprob == pytest.approx(float(ref[out.token_ids[0][0]]), abs=ATOL)
    assert list(lp.top) == ref.topk(3).indices.tolist()
    assert list(lp.top.values()) == pytest.approx(ref.topk(3).values.tolist(), abs=ATOL)


def test_capacity_and_info(tiny_checkpoint):
    runner = make_runner(tiny_checkpoint("qwen2"))
    cap = runner.capacity()
    assert (cap.max_num_seqs, cap.max_context_length, cap.max_model_len, cap.speculation_length) == (4, 32, 64, 0)
    assert cap.vocab_size == 96
    assert runner.info() == {
        "framework": "torch", "torch": torch.__version__, "device": "cpu", "dtype": "float32",
        "architecture": "Qwen2ForCausalLM",
    }


def test_sharded_weights_are_said_to_have_no_effect(tiny_checkpoint, caplog):
    """NxDI's pre-sharded weights mean nothing to one process: the runner says so and serves as before."""
    with caplog.at_level("WARNING", logger="neuronmodel_runtime.runners.torch_reference"):
        runner = make_runner(tiny_checkpoint("llama"), compile_cache={"sharded_weights": True})
    assert "compile_cache.sharded_weights has no effect on the torch reference runner" in caplog.text
    assert runner.capacity().vocab_size == 96


def test_bad_batches_are_rejected(tiny_checkpoint):
    runner = make_runner(tiny_checkpoint("llama"))
    with pytest.raises(ValueError, match="distinct"):
        runner.prefill(PrefillBatch([1, 1], [[1], [2]], [GREEDY, GREEDY]))
    with pytest.raises(ValueError, match="prompt lengths"):
        runner.prefill(PrefillBatch([0], [list(range(33))], [GREEDY]))
    with pytest.raises(ValueError, match="exceed max_model_len"):
        runner.decode(DecodeBatch([0], [1], [64], [GREEDY]))
    with pytest.raises(ValueError, match="temperature"):
        runner.prefill(PrefillBatch([0], [[1, 2]], [RowSampling(-1, 1.0, 0.0, None)]))
    with pytest.raises(RunnerError, match="load"):
        TorchReferenceRunner(RuntimeConfig(), "/nonexistent").capacity()


def test_prefill_groups_pad_only_similar_lengths():
    assert prefill_groups([5, 5, 5]) == [[0, 1, 2]]
    assert prefill_groups([30, 2, 29, 3]) == [[1, 3], [2, 0]]
    assert prefill_groups([1, 100]) == [[0], [1]]
