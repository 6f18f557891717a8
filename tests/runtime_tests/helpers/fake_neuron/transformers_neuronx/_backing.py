"""The fake's device: our reference Llama-family implementation (`neuronmodel_runtime.runners.checkpoint` and
`runners.llama.LlamaModel`), float32 on the CPU, whatever `amp` the model was built with. Not a module of the real
library: what the fake's models compute with.

An EAGLE draft (config.json `is_eagle: true`, an `fc` projection over [token embedding, previous hidden]) runs the
draft's decoder layers without the pre-attention norm (`has_pre_attention_norm=False`) and without the final norm
(llama/model.py skips ln_f for `is_eagle_draft`), as TNx builds it.
"""

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from neuronmodel_runtime.runners.checkpoint import build_weights, read_config, read_tensors
from neuronmodel_runtime.runners.llama import LlamaModel, _rotate, rms_norm


def read_hf_config(path: str) -> SimpleNamespace:
    """config.json as attributes (what AutoConfig.from_pretrained gives the real classes)."""
    return SimpleNamespace(**json.loads((Path(path) / "config.json").read_text()))


def has_weights(path: str) -> bool:
    folder = Path(path)
    return any((folder / name).exists() for name in ("model.safetensors", "model.safetensors.index.json",
                                                      "pytorch_model.bin", "pytorch_model.bin.index.json"))


def load_model(path: str, num_slots: int, max_len: int) -> LlamaModel:
    folder = Path(path)
    config = read_config(folder, max_len)
    weights = build_weights(config, read_tensors(folder), torch.device("cpu"), torch.float32)
    return LlamaModel(config, weights, num_slots, max_len)


def load_eagle_draft(path: str, num_slots: int, max_len: int) -> "EagleDraft":
    folder = Path(path)
    config = read_config(folder, max_len)
    tensors = read_tensors(folder)
    fc_weight = tensors.pop("model.fc.weight").float()
    fc_bias = tensors.pop("model.fc.bias").float() if "model.fc.bias" in tensors else None
    ones = torch.ones(config.hidden_size)
    for i in range(config.num_layers):  # unused: the draft has no pre-attention norm
        tensors.setdefault(f"model.layers.{i}.input_layernorm.weight", ones)
    tensors.setdefault("model.norm.weight", ones)  # unused: no final norm in an EAGLE draft
    weights = build_weights(config, tensors, torch.device("cpu"), torch.float32)
    return EagleDraft(config, weights, num_slots, max_len, fc_weight, fc_bias)


def run_layers(model: LlamaModel, x: torch.Tensor, slots: Sequence[int], start_pos: Sequence[int],
               pre_attention_norm: bool = True) -> torch.Tensor:
    """LlamaModel.hidden_states from input embeddings `x` [B, T, D] (optionally without the pre-attention norm)."""
    cfg, w = model.config, model.weights
    batch, length, _ = x.shape
    slot_t = torch.tensor([int(s) for s in slots], dtype=torch.int64)
    pos = torch.tensor([int(p) for p in start_pos])[:, None] + torch.arange(length)  # [B, T]
    key_len = int(pos.max()) + 1
    if key_len > model.max_len:
        raise ValueError(f"positions up to {key_len - 1} exceed the compiled n_positions {model.max_len}")
    slot_bt = slot_t[:, None].expand(batch, length)
    cos, sin = model.cos[pos][:, :, None], model.sin[pos][:, :, None]
    mask = (torch.arange(key_len) <= pos[:, :, None])[:, None]  # [B, 1, T, key_len]
    heads, kv_heads, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    for i, layer in enumerate(w.layers):
        h = rms_norm(x, layer.input_norm, cfg.rms_norm_eps) if pre_attention_norm else x
        qkv = F.linear(h, layer.qkv, layer.qkv_bias)
        qk = _rotate(qkv[..., : (heads + kv_heads) * hd].view(batch, length, heads + kv_heads, hd), cos, sin)
        q, k = qk[:, :, :heads], qk[:, :, heads:]
        v = qkv[..., (heads + kv_heads) * hd :].view(batch, length, kv_heads, hd)
        k_line, v_line = model.k_cache[i], model.v_cache[i]
        k_line[slot_bt, :, pos] = k
        v_line[slot_bt, :, pos] = v
        keys = k_line[:, :, :key_len].index_select(0, slot_t)
        values = v_line[:, :, :key_len].index_select(0, slot_t)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask,
                                              enable_gqa=heads != kv_heads)
        x = x + F.linear(attn.transpose(1, 2).reshape(batch, length, heads * hd), layer.o, layer.o_bias)
        gate, up = F.linear(rms_norm(x, layer.post_norm, cfg.rms_norm_eps), layer.gate_up).chunk(2, dim=-1)
        x = x + F.linear(F.silu(gate) * up, layer.down)
    return x


def target_with_hidden(model: LlamaModel, tokens: torch.Tensor, slots: Sequence[int],
                       start_pos: Sequence[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(logits [B, T, V], final-normed hidden [B, T, D]): what an `is_eagle_target` model returns."""
    hidden = rms_norm(model.hidden_states(tokens, slots, start_pos), model.weights.norm, model.config.rms_norm_eps)
    return F.linear(hidden, model.weights.lm_head), hidden


class EagleDraft(LlamaModel):
    """An EAGLE draft: fc([embed(token), prev_hidden]) -> decoder layers (no pre-attention norm) -> lm_head."""

    def __init__(self, config, weights, num_slots, max_len, fc_weight: torch.Tensor, fc_bias: Optional[torch.Tensor]):
        super().__init__(config, weights, num_slots, max_len)
        self.fc_weight, self.fc_bias = fc_weight, fc_bias

    def eagle_forward(self, tokens: torch.Tensor, prev_hidden: torch.Tensor, slots: Sequence[int],
                      start_pos: Sequence[int]) -> Tuple[torch.Tensor, torch.Tensor]:
        """tokens [B, T], prev_hidden [B, T, D] -> (logits [B, T, V], hidden [B, T, D])."""
        x = torch.cat([F.embedding(tokens.to(torch.int64), self.weights.embed), prev_hidden.float()], dim=-1)
        x = F.linear(x, self.fc_weight, self.fc_bias)
        hidden = run_layers(self, x, slots, start_pos, pre_attention_norm=False)
        return F.linear(hidden, self.weights.lm_head), hidden
