"""A compact Llama-family decoder (Llama, Mistral, Qwen2) over a static, slot-indexed KV cache.

Plain tensors and `torch.nn.functional`, no `nn.Module` tree: one layer is about fifteen kernel launches, and
nothing in Python runs per batch row. q/k/v and gate/up are fused into one matmul each at load time.

One general forward serves prefill, decode and speculative verification: row b feeds `tokens[b, :T]` at
positions `start[b] .. start[b]+T-1` of KV line `slots[b]`, writes their K/V there, and attends causally over
positions `0 .. start[b]+t` of that line. A position is always written before it is first read (the write
happens in the same call, before attention), so stale K/V from an earlier sequence in the slot, or padding
written past a short prompt, is never attended to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LlamaConfig:
    """The architecture facts the forward needs, parsed from a Hugging Face config.json (see checkpoint.py)."""

    architecture: str  # e.g. "LlamaForCausalLM"
    vocab_size: int  # rows of the embedding and of the LM head
    hidden_size: int  # model width D
    intermediate_size: int  # SwiGLU width I
    num_layers: int  # decoder layers
    num_heads: int  # query heads H
    num_kv_heads: int  # key/value heads (GQA), divides H
    head_dim: int  # per-head width (may differ from D / H)
    rms_norm_eps: float  # RMSNorm epsilon
    rope_theta: float  # RoPE base
    rope_scaling: Optional[dict]  # rope_type ("linear" | "llama3") and its parameters; None = plain RoPE
    max_position_embeddings: int  # longest position the checkpoint supports
    tie_word_embeddings: bool  # LM head shares the embedding matrix


@dataclass
class LayerWeights:
    """One decoder layer's parameters, fused for fewer matmuls. Shapes are (out, in), as F.linear wants."""

    input_norm: torch.Tensor  # [D]
    qkv: torch.Tensor  # [(H + 2*KV) * hd, D]: q, k, v projections stacked
    qkv_bias: Optional[torch.Tensor]  # [(H + 2*KV) * hd] (Qwen2 and attention_bias models), else None
    o: torch.Tensor  # [D, H * hd]
    o_bias: Optional[torch.Tensor]  # [D] (attention_bias models), else None
    post_norm: torch.Tensor  # [D]
    gate_up: torch.Tensor  # [2 * I, D]: gate and up projections stacked
    down: torch.Tensor  # [D, I]


@dataclass
class LlamaWeights:
    """All parameters, on the model's device and dtype."""

    embed: torch.Tensor  # [V, D]
    layers: list[LayerWeights]  # one per decoder layer
    norm: torch.Tensor  # [D] final RMSNorm
    lm_head: torch.Tensor  # [V, D]; the same tensor as `embed` when tied


def rope_inv_freq(config: LlamaConfig) -> torch.Tensor:
    """`[hd/2]` float32 inverse frequencies, with linear or Llama-3 scaling (as transformers computes them)."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling or {}
    rope_type = scaling.get("rope_type", "default")
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type != "llama3":
        return inv_freq
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32, cast back before the weight (as transformers does)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE, transformers' rotate-half convention. x: [B, T, heads, hd]; cos, sin: [B, T, 1, hd]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LlamaModel:
    """Weights, RoPE tables and the static KV cache `[slots, KV, max_len, hd]` per layer, plus the forward."""

    def __init__(self, config: LlamaConfig, weights: LlamaWeights, num_slots: int, max_len: int,
                 reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None):
        """`reduce`: tensor parallelism (runners/tensor_parallel.py): `config` and `weights` are this rank's shard,
        and `reduce` sums a rank's partial attention and MLP outputs over the group (an all-reduce, in place)."""
        self.config = config
        self.weights = weights
        self.reduce = reduce or (lambda partial: partial)
        self.num_slots = num_slots
        self.max_len = max_len
        self.device = weights.embed.device
        self.dtype = weights.embed.dtype
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), rope_inv_freq(config))  # [L, hd/2]
        angles = torch.cat((freqs, freqs), dim=-1)  # [L, hd]
        self.cos = angles.cos().to(self.device, self.dtype)  # [L, hd]
        self.sin = angles.sin().to(self.device, self.dtype)  # [L, hd]
        shape = (config.num_layers, num_slots, config.num_kv_heads, max_len, config.head_dim)
        # NOTE: zeros, not empty: masked-out entries still enter SDPA's matmuls, and NaN * 0 would be NaN.
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)  # [layers, S, KV, L, hd]
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)  # [layers, S, KV, L, hd]

    def hidden_states(
        self, tokens: torch.Tensor, slots: Sequence[int], start_pos: Sequence[int]
    ) -> torch.Tensor:
        """Run the decoder over `tokens`, writing their K/V into the slots' lines.

        Args:
            tokens: `[B, T]` int64 token ids (right padding allowed: its K/V lands past the real tokens).
            slots: B distinct KV lines.
            start_pos: B positions of `tokens[:, 0]` (tokens already in each line).

        Returns:
            `[B, T, D]` hidden states before the final norm (feed the wanted positions to `logits`).

        Raises:
            ValueError: a row would run past the cache's `max_len`.
        """
        cfg, w = self.config, self.weights
        batch, length = tokens.shape
        slots, start_pos = [int(s) for s in slots], [int(p) for p in start_pos]
        key_len = max(start_pos) + length  # attend over positions 0..key_len-1 at most
        if key_len > self.max_len:
            raise ValueError(f"positions up to {key_len - 1} exceed max_model_len {self.max_len}")
        fresh = all(p == 0 for p in start_pos)  # every row starts empty: attend to this call's K/V directly
        consecutive = slots == list(range(slots[0], slots[0] + batch))
        run = slice(slots[0], slots[0] + batch) if consecutive else None
        dev = self.device
        slot_t = torch.tensor(slots, dtype=torch.int64, device=dev)  # [B]
        pos = torch.tensor(start_pos, device=dev)[:, None] + torch.arange(length, device=dev)  # [B, T]
        slot_bt = slot_t[:, None].expand(batch, length)  # [B, T]
        cos, sin = self.cos[pos][:, :, None], self.sin[pos][:, :, None]  # [B, T, 1, hd]
        mask = (torch.arange(key_len, device=dev) <= pos[:, :, None])[:, None]  # [B, 1, T, key_len]
        heads, kv_heads, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

        x = F.embedding(tokens.to(dev), w.embed)  # [B, T, D]
        for i, layer in enumerate(w.layers):
            h = rms_norm(x, layer.input_norm, cfg.rms_norm_eps)
            qkv = F.linear(h, layer.qkv, layer.qkv_bias)  # [B, T, (H + 2KV) * hd]
            qk = _rotate(qkv[..., : (heads + kv_heads) * hd].view(batch, length, heads + kv_heads, hd), cos, sin)
            q, k = qk[:, :, :heads], qk[:, :, heads:]  # [B, T, H, hd], [B, T, KV, hd]
            v = qkv[..., (heads + kv_heads) * hd :].view(batch, length, kv_heads, hd)  # [B, T, KV, hd]
            k_line, v_line = self.k_cache[i], self.v_cache[i]  # [S, KV, L, hd]
            k_line[slot_bt, :, pos] = k  # advanced indices first: the target is [B, T, KV, hd]
            v_line[slot_bt, :, pos] = v
            if fresh:
                keys, values = k.transpose(1, 2), v.transpose(1, 2)  # [B, KV, T, hd]
            elif run is not None:  # consecutive slots: a view of the lines, no copy
                keys = k_line[run, :, :key_len]  # [B, KV, key_len, hd]
                values = v_line[run, :, :key_len]
            else:
                keys = k_line[:, :, :key_len].index_select(0, slot_t)  # [B, KV, key_len, hd]
                values = v_line[:, :, :key_len].index_select(0, slot_t)
            attn = F.scaled_dot_product_attention(
                q.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=heads != kv_heads
            )  # [B, H, T, hd]
            x = x + self.reduce(F.linear(attn.transpose(1, 2).reshape(batch, length, heads * hd), layer.o,
                                         layer.o_bias))
            gate, up = F.linear(rms_norm(x, layer.post_norm, cfg.rms_norm_eps), layer.gate_up).chunk(2, dim=-1)
            x = x + self.reduce(F.linear(F.silu(gate) * up, layer.down))
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head. hidden: `[..., D]` -> `[..., V]` in the model dtype."""
        return F.linear(rms_norm(hidden, self.weights.norm, self.config.rms_norm_eps), self.weights.lm_head)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def last_logits(self, tokens: torch.Tensor, slots: Sequence[int], start_pos: Sequence[int]) -> torch.Tensor:
        """Logits at the last fed position only: `[B, T]` tokens -> `[B, V]` (prefill of one group, drafting)."""
        return self.logits(self.hidden_states(tokens, slots, start_pos)[:, -1])

    def forward(self, tokens: torch.Tensor, slots: Sequence[int], start_pos: Sequence[int]) -> torch.Tensor:
        """Logits at every fed position: `[B, T]` tokens -> `[B, T, V]` (speculative verification needs them all)."""
        return self.logits(self.hidden_states(tokens, slots, start_pos))


__all__ = ["LayerWeights", "LlamaConfig", "LlamaModel", "LlamaWeights", "rms_norm", "rope_inv_freq"]
