"""Loading Hugging Face folders: both config dialects, sharded weights, dtype, and clear errors."""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from neuronmodel_runtime.config import RuntimeConfig  # noqa: E402
from neuronmodel_runtime.runners.base import RunnerError  # noqa: E402
from neuronmodel_runtime.runners.checkpoint import build_weights, read_config, read_tensors, resolve_dtype  # noqa: E402
from neuronmodel_runtime.runners.llama import rope_inv_freq  # noqa: E402
from neuronmodel_runtime.runners.torch_reference import TorchReferenceRunner  # noqa: E402


def copy_with_config(src, dst, **changes):
    """A copy of checkpoint `src` whose config.json has `changes` applied (None deletes a key)."""
    shutil.copytree(src, dst)
    raw = json.loads((dst / "config.json").read_text())
    raw.update(changes)
    (dst / "config.json").write_text(json.dumps({k: v for k, v in raw.items() if v is not None}))
    return dst


def load(folder, **fields):
    config = RuntimeConfig(**{"framework": "torch", "max_model_len": 64, "max_context_length": 32, **fields})
    runner = TorchReferenceRunner(config, str(folder))
    runner.load()
    return runner


def test_transformers_4_config_dialect_reads_the_same(tiny_checkpoint, tmp_path):
    folder = tiny_checkpoint("llama3")
    v5 = read_config(folder, 64)
    rope = json.loads((folder / "config.json").read_text())["rope_parameters"]
    legacy = {k: v for k, v in rope.items() if k != "rope_theta"}
    old = copy_with_config(folder, tmp_path / "old", rope_parameters=None, rope_theta=rope["rope_theta"],
                           rope_scaling={**legacy, "type": legacy.pop("rope_type")})
    assert read_config(old, 64) == v5
    assert v5.rope_scaling["rope_type"] == "llama3"
    default = read_config(tiny_checkpoint("llama"), 64)
    assert default.rope_scaling is None
    plain = rope_inv_freq(v5.__class__(**{**v5.__dict__, "rope_scaling": None}))
    assert not torch.allclose(rope_inv_freq(v5), plain)  # the scaling changes the low frequencies


def test_sharded_checkpoint_loads_like_the_single_file(tiny_checkpoint, tmp_path):
    folder = tiny_checkpoint("qwen2")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    ids = torch.tensor([[5, 9, 2, 77, 31]])
    with torch.inference_mode():
        a = load(folder).model.forward(ids, [0], [0])
        b = load(tmp_path / "sharded").model.forward(ids, [0], [0])
    assert torch.equal(a, b)


def test_dtype_auto_is_float32_on_cpu_and_bfloat16_on_accelerators(tiny_checkpoint):
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("float16", torch.device("cpu")) == torch.float16
    runner = load(tiny_checkpoint("llama"), dtype="bfloat16")
    assert runner.model.weights.embed.dtype == torch.bfloat16 and runner.model.k_cache.dtype == torch.bfloat16
    with torch.inference_mode():
        assert runner.model.forward(torch.tensor([[1, 2, 3]]), [0], [0]).isfinite().all()


def test_tied_embeddings_share_one_tensor(tiny_checkpoint):
    weights = load(tiny_checkpoint("qwen2")).model.weights
    assert weights.lm_head is weights.embed
    untied = load(tiny_checkpoint("llama")).model.weights
    assert untied.lm_head is not untied.embed


@pytest.mark.parametrize(
    "changes, fields, message",
    [
        (dict(architectures=["GPT2LMHeadModel"]), {}, "architecture 'GPT2LMHeadModel' is not supported"),
        (dict(hidden_act="gelu"), {}, "hidden_act 'gelu'"),
        (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}), {}, "rope type 'yarn'"),
        (dict(sliding_window=32), {}, "set max_model_len <= 32"),
        (dict(num_hidden_layers=None), {}, "required key 'num_hidden_layers' is missing"),
        (dict(rope_parameters={"rope_type": "llama3", "factor": 8.0}), {}, "required key 'low_freq_factor'"),
        (dict(sliding_window=None), dict(max_model_len=512), "max_position_embeddings 256"),
        ({}, dict(parallelism={"tensor_parallel_degree": 2}),
         "tensor_parallel_degree 2 on framework torch runs 2 processes"),
        (dict(mlp_bias=True), {}, "mlp_bias is true"),
        (dict(quantization_config={"quant_method": "fp8"}), {}, "quantized .*fp8"),
    ],
)
def test_unsupported_checkpoints_fail_with_a_clear_error(tiny_checkpoint, tmp_path, changes, fields, message):
    folder = copy_with_config(tiny_checkpoint("mistral"), tmp_path / "m", **changes)
    with pytest.raises(RunnerError, match=message):
        load(folder, **fields)


def test_qwen2_sliding_window_counts_only_when_enabled(tiny_checkpoint, tmp_path):
    folder = copy_with_config(tiny_checkpoint("qwen2"), tmp_path / "q", sliding_window=16, use_sliding_window=False)
    load(folder)
    enabled = copy_with_config(folder, tmp_path / "q2", use_sliding_window=True)
    with pytest.raises(RunnerError, match="sliding_window is 16"):
        load(enabled)


def test_missing_files_and_tensors_are_named(tiny_checkpoint, tmp_path):
    with pytest.raises(RunnerError, match="does not exist"):
        load(tmp_path / "nowhere")
    folder = copy_with_config(tiny_checkpoint("llama"), tmp_path / "noweights")
    (folder / "model.safetensors").unlink()
    with pytest.raises(RunnerError, match="no model.safetensors"):
        load(folder)
    (tmp_path / "noconfig").mkdir()
    with pytest.raises(RunnerError, match="config.json"):
        load(tmp_path / "noconfig")
    untied = copy_with_config(tiny_checkpoint("qwen2"), tmp_path / "untied", tie_word_embeddings=False)
    with pytest.raises(RunnerError, match="lm_head.weight"):
        load(untied)


def biased_llama(tmp_path, **flags):
    """A tiny Llama checkpoint with random (not zero) biases where `flags` (attention_bias, mlp_bias) put them."""
    torch.manual_seed(5)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      initializer_range=0.15, tie_word_embeddings=False, **flags)
    model = transformers.LlamaForCausalLM(config).eval()
    for name, param in model.named_parameters():
        if name.endswith(".bias"):
            torch.nn.init.normal_(param, std=0.5)
    folder = tmp_path / "biased"
    model.save_pretrained(folder)
    return folder, model


def test_attention_biases_are_implemented_and_match_transformers(tmp_path):
    folder, hf = biased_llama(tmp_path, attention_bias=True)
    ids = torch.tensor([[5, 9, 2, 77, 31]])
    with torch.inference_mode():
        ours = load(folder).model.forward(ids, [0], [0])
        assert (ours - hf(ids).logits).abs().max() < 1e-4


def test_mlp_biases_are_refused_and_never_silently_dropped(tmp_path):
    folder, _ = biased_llama(tmp_path, attention_bias=True, mlp_bias=True)
    with pytest.raises(RunnerError, match="mlp_bias is true.*does not implement MLP biases"):
        load(folder)
    # A config that hides them: the biases are still in the checkpoint, so loading would give wrong logits.
    hidden = copy_with_config(folder, tmp_path / "hidden", mlp_bias=False)
    named = r"6 checkpoint tensors .*'model\.layers\.0\.mlp\.down_proj\.bias'.*does not implement MLP biases"
    with pytest.raises(RunnerError, match=named):
        load(hidden)


def build(folder, extra=(), drop=()):
    """build_weights over `folder`'s tensors with `extra` (name -> tensor) added and `drop` removed."""
    tensors = read_tensors(folder)
    tensors.update(dict(extra))
    for name in drop:
        del tensors[name]
    return build_weights(read_config(folder, 64), tensors, torch.device("cpu"), torch.float32)


def test_unused_tensors_are_an_error_that_names_them_and_why(tiny_checkpoint):
    folder = tiny_checkpoint("llama")
    extra = {f"model.layers.{i}.self_attn.q_proj.weight": torch.zeros(64, 64) for i in (2, 3)}
    with pytest.raises(RunnerError, match=r"2 checkpoint tensors .*'model\.layers\.2\..*more layers .* \(2\)"):
        build(folder, extra)
    extra = {f"model.layers.{i}.mlp.{n}_proj.weight_scale": torch.ones(1) for i in range(2) for n in ("up", "down")}
    with pytest.raises(RunnerError, match=r"4 checkpoint tensors .* and 1 more\), .*quantization parameters"):
        build(folder, extra)
    with pytest.raises(RunnerError, match=r"1 checkpoint tensor .*'model\.vision_tower\.weight'.*Llama.* not use"):
        build(folder, {"model.vision_tower.weight": torch.zeros(3)})


def test_known_harmless_leftovers_are_ignored(tiny_checkpoint):
    # Rotary inverse-frequency buffers, saved by old transformers versions: recomputed from the config.
    inv_freq = {f"model.layers.{i}.self_attn.rotary_emb.inv_freq": torch.ones(8) for i in range(2)}
    build(tiny_checkpoint("llama"), inv_freq)
    # A tied model's head saved beside the embedding: the same matrix, so nothing is lost.
    tied = tiny_checkpoint("qwen2")
    embed = read_tensors(tied)["model.embed_tokens.weight"]
    weights = build(tied, {"lm_head.weight": embed.clone()})
    assert weights.lm_head is weights.embed
    with pytest.raises(RunnerError, match="tie_word_embeddings is true but lm_head.weight differs"):
        build(tied, {"lm_head.weight": embed + 1})
