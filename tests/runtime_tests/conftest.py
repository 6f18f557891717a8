"""Shared fixtures of the runtime tests (fixtures only)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import pytest

if TYPE_CHECKING:
    from runtime_tests.helpers.full_disk import SmallVolume


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Factory: kind -> folder of a tiny random Hugging Face checkpoint, saved once per session (fixed seed).

    Kinds: "llama" (GQA, untied head), "qwen2" (q/k/v bias, tied embeddings), "llama3" (Llama-3 rope scaling,
    explicit head_dim), "mistral" (sliding window wider than any test's max_model_len).
    """
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    common = dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=112,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.15,  # peaked logits: greedy parity is not decided by near-ties
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    kinds = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, dict(tie_word_embeddings=False)),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, dict(tie_word_embeddings=True)),
        "llama3": (
            transformers.LlamaConfig,
            transformers.LlamaForCausalLM,
            dict(
                head_dim=8,
                tie_word_embeddings=True,
                rope_parameters=dict(
                    rope_type="llama3",
                    rope_theta=10000.0,
                    factor=8.0,
                    low_freq_factor=1.0,
                    high_freq_factor=4.0,
                    original_max_position_embeddings=16,
                ),
            ),
        ),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, dict(sliding_window=128)),
    }
    made: dict[str, Path] = {}

    def make(kind: str) -> Path:
        if kind not in made:
            config_cls, model_cls, extra = kinds[kind]
            torch.manual_seed(1234)
            model = model_cls(config_cls(**common, **extra)).eval()
            if kind == "qwen2":  # random (not zero) biases, so that their loading is tested
                for layer in model.model.layers:
                    for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                        torch.nn.init.normal_(proj.bias, std=0.5)
            folder = tmp_path_factory.mktemp(f"tiny-{kind}")
            model.save_pretrained(folder)
            made[kind] = folder
        return made[kind]

    return make


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The embedded default model's real byte-level BPE tokenizer (skips when the model is not converted)."""
    transformers = pytest.importorskip("transformers")
    from neuronmodel_runtime.config import default_model_path

    folder = default_model_path()
    if not (folder / "tokenizer.json").is_file():
        pytest.skip("run scripts/fetch_default_model.py first")
    return transformers.AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """Tests use tiny models: one intra-op thread is as fast, and immune to a busy machine's thread contention."""
    torch = pytest.importorskip("torch")
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def small_volume(tmp_path: Path) -> Iterator[Callable[[str, int], "SmallVolume"]]:
    """Factory: (name, size) -> a folder under tmp_path with room for `size` bytes (helpers/full_disk.py: a real
    tmpfs where this process may mount one, else ENOSPC injected at Python's file writes); undone at the end."""
    from runtime_tests.helpers.full_disk import SmallVolume

    volumes: list[SmallVolume] = []

    def make(name: str, size: int) -> SmallVolume:
        volumes.append(SmallVolume(tmp_path / name, size))
        return volumes[-1]

    yield make
    for volume in reversed(volumes):
        volume.close()
