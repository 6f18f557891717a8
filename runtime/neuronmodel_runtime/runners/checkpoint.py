"""Loading a Hugging Face checkpoint folder (config.json + safetensors) into `LlamaConfig` / `LlamaWeights`.

Reads both config dialects: transformers 4.x (`rope_theta`, `rope_scaling`) and 5.x (`rope_parameters`).
Every failure is a `RunnerError` that names the file or key and what to change.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any, Optional

import torch

from neuronmodel_runtime.runners.base import RunnerError
from neuronmodel_runtime.runners.llama import LayerWeights, LlamaConfig, LlamaWeights

log = logging.getLogger(__name__)

#: Architectures (config.json `architectures[0]`) the reference runner implements.
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """RuntimeConfig.dtype -> torch dtype; "auto" is float32 on CPU and bfloat16 on accelerators."""
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return _DTYPES[dtype]


def _rope(raw: dict[str, Any]) -> tuple[float, Optional[dict]]:
    """(rope_theta, scaling dict or None) from either config dialect."""
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type not in ("linear", "llama3"):
        raise RunnerError(f"config.json: rope type {rope_type!r} is not supported (supported: default, linear, llama3)")
    if rope_type == "linear":
        return theta, {"rope_type": rope_type, "factor": float(params["factor"])}
    return theta, {
        "rope_type": rope_type,
        "factor": float(params["factor"]),
        "low_freq_factor": float(params["low_freq_factor"]),
        "high_freq_factor": float(params["high_freq_factor"]),
        "original_max_position_embeddings": params.get(
            "original_max_position_embeddings", raw["max_position_embeddings"]
        ),
    }


def _sliding_window(raw: dict[str, Any], architecture: str) -> Optional[int]:
    """The attention window in tokens, or None for full attention (Qwen2 uses one only with use_sliding_window)."""
    if architecture == "Qwen2ForCausalLM" and not raw.get("use_sliding_window", False):
        return None
    return raw.get("sliding_window")


def read_config(model_dir: Path, max_model_len: int) -> LlamaConfig:
    """Parse `model_dir/config.json`.

    Raises:
        RunnerError: missing file, unsupported architecture or activation, or a sliding window shorter than
            max_model_len (the reference runner implements full attention only).
    """
    path = model_dir / "config.json"
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise RunnerError(f"cannot read {path}: {exc.strerror}; model must be a Hugging Face folder") from exc
    architecture = (raw.get("architectures") or ["?"])[0]
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise RunnerError(
            f"{path}: architecture {architecture!r} is not supported by the torch reference runner "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    if raw.get("hidden_act", "silu") != "silu":
        raise RunnerError(f"{path}: hidden_act {raw['hidden_act']!r} is not supported (only silu)")
    if raw.get("mlp_bias", False):
        raise RunnerError(
            f"{path}: mlp_bias is true, and the torch reference runner does not implement MLP biases (attention "
            "biases it does): this checkpoint cannot be served with framework torch"
        )
    if raw.get("quantization_config"):
        method = raw["quantization_config"].get("quant_method", "?")
        raise RunnerError(
            f"{path}: the checkpoint is quantized (quantization_config.quant_method {method!r}); the torch reference "
            "runner loads unquantized (float32, bfloat16, float16) checkpoints only"
        )
    window = _sliding_window(raw, architecture)
    if window is not None and max_model_len > window:
        raise RunnerError(
            f"{path}: sliding_window is {window} tokens but max_model_len is {max_model_len}; the reference runner "
            f"implements full attention only, so set max_model_len <= {window}"
        )
    try:
        theta, scaling = _rope(raw)
        heads = raw["num_attention_heads"]
        return LlamaConfig(
            architecture=architecture,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=raw.get("max_position_embeddings", max_model_len),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        )
    except KeyError as exc:
        raise RunnerError(f"{path}: required key {exc.args[0]!r} is missing") from None


def _weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / name for name in shards]
    single = model_dir / "model.safetensors"
    if single.exists():
        return [single]
    raise RunnerError(
        f"{model_dir}: no model.safetensors or model.safetensors.index.json (only safetensors weights are supported)"
    )


def read_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint, by name, on the CPU in its stored dtype."""
    from safetensors import SafetensorError, safe_open

    tensors: dict[str, torch.Tensor] = {}
    files = _weight_files(model_dir)
    for number, path in enumerate(files, start=1):
        if not path.exists():
            raise RunnerError(f"{path}: shard listed in model.safetensors.index.json is missing")
        log.info("loading weights %d/%d: %s (%.0f MB)", number, len(files), path.name, path.stat().st_size / 2**20)
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for name in f.keys():
                    tensors[name] = f.get_tensor(name)
        except SafetensorError as exc:
            raise RunnerError(f"{path}: not a complete safetensors file ({exc}): a download or conversion cut short, "
                              "or a damaged disk; re-download or re-convert the model") from None
    return tensors


def build_weights(
    config: LlamaConfig, tensors: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype
) -> LlamaWeights:
    """Fuse and move the checkpoint's tensors (transformers' names) into `LlamaWeights`.

    Consumes `tensors`: every tensor must be used, or be a known harmless leftover (see `_drop_harmless`),
    because a dropped tensor (an MLP bias, a layer beyond num_hidden_layers, a quantization scale) loads fine
    and silently gives wrong outputs.

    Raises:
        RunnerError: a required tensor is missing, or tensors are left unused.
    """

    def take(name: str) -> torch.Tensor:
        if name not in tensors:
            raise RunnerError(f"checkpoint has no tensor {name!r} (is it a {config.architecture} checkpoint?)")
        return tensors.pop(name).to(device=device, dtype=dtype)

    def maybe(name: str) -> Optional[torch.Tensor]:
        return take(name) if name in tensors else None

    layers = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        q, k, v = (take(f"{p}self_attn.{n}_proj.weight") for n in ("q", "k", "v"))
        biases = [maybe(f"{p}self_attn.{n}_proj.bias") for n in ("q", "k", "v")]
        qkv_bias = None
        if any(b is not None for b in biases):
            sizes = (q.shape[0], k.shape[0], v.shape[0])
            qkv_bias = torch.cat([b if b is not None else q.new_zeros(n) for b, n in zip(biases, sizes)])
        layers.append(
            LayerWeights(
                input_norm=take(f"{p}input_layernorm.weight"),
                qkv=torch.cat((q, k, v)),
                qkv_bias=qkv_bias,
                o=take(f"{p}self_attn.o_proj.weight"),
                o_bias=maybe(f"{p}self_attn.o_proj.bias"),
                post_norm=take(f"{p}post_attention_layernorm.weight"),
                gate_up=torch.cat((take(f"{p}mlp.gate_proj.weight"), take(f"{p}mlp.up_proj.weight"))),
                down=take(f"{p}mlp.down_proj.weight"),
            )
        )
    stored_embed = tensors.get("model.embed_tokens.weight")
    embed = take("model.embed_tokens.weight")
    tied = config.tie_word_embeddings or "lm_head.weight" not in tensors
    if tied and not config.tie_word_embeddings:
        raise RunnerError("checkpoint has no tensor 'lm_head.weight' and tie_word_embeddings is false")
    weights = LlamaWeights(
        embed=embed, layers=layers, norm=take("model.norm.weight"), lm_head=embed if tied else take("lm_head.weight")
    )
    _drop_harmless(tensors, stored_embed)
    if tensors:
        raise _unused_tensors_error(config, sorted(tensors))
    return weights


def _drop_harmless(tensors: dict[str, torch.Tensor], stored_embed: torch.Tensor) -> None:
    """Remove the leftovers that lose nothing: rotary inverse frequencies (buffers that old transformers versions
    saved; recomputed from the config) and a tied model's lm_head.weight when it equals the embedding."""
    for name in [n for n in tensors if n.endswith("rotary_emb.inv_freq")]:
        del tensors[name]
    head = tensors.get("lm_head.weight")
    if head is not None and head.shape == stored_embed.shape and torch.equal(head.to(stored_embed.dtype), stored_embed):
        del tensors["lm_head.weight"]


_MLP_BIAS = re.compile(r"\.mlp\.(gate|up|down)_proj\.bias$")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
#: Last name components of the quantization parameters of GPTQ, AWQ, FP8 (compressed-tensors, DeepSeek) and
#: bitsandbytes checkpoints.
_QUANTIZATION = {"qweight", "qzeros", "scales", "g_idx", "weight_scale", "weight_scale_inv", "input_scale", "absmax",
                 "quant_map", "SCB"}


def _why_unused(name: str, config: LlamaConfig) -> str:
    """Why the forward does not consume tensor `name`, as specifically as its name tells."""
    if _MLP_BIAS.search(name):
        return "the torch reference runner does not implement MLP biases (config.json mlp_bias)"
    layer = _LAYER.search(name)
    if layer and int(layer.group(1)) >= config.num_layers:
        return f"the checkpoint has more layers than config.json num_hidden_layers ({config.num_layers})"
    if name.rsplit(".", 1)[-1] in _QUANTIZATION or ".quant_state." in name:
        return "they are quantization parameters, and the torch reference runner loads unquantized checkpoints only"
    if name == "lm_head.weight":
        return (
            "tie_word_embeddings is true but lm_head.weight differs from model.embed_tokens.weight (set "
            "tie_word_embeddings to false in config.json if the model has its own head)"
        )
    return f"the torch reference runner's {config.architecture} forward does not use them"


def _unused_tensors_error(config: LlamaConfig, names: list[str]) -> RunnerError:
    shown = ", ".join(repr(n) for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    reasons = "; ".join(sorted({_why_unused(n, config) for n in names}))
    noun = "tensor" if len(names) == 1 else "tensors"
    return RunnerError(
        f"{len(names)} checkpoint {noun} would be left unused ({shown}), which gives wrong outputs: {reasons}"
    )


__all__ = ["SUPPORTED_ARCHITECTURES", "build_weights", "read_config", "read_tensors", "resolve_dtype"]
