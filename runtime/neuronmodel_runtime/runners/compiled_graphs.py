"""The reference model as fixed-shape compiled graphs, as Neuron compiles them (`RuntimeConfig.compile`).

Neuron runs a model only in the shapes it was compiled for; so does `FixedShapeModel`, with `torch.compile`
(inductor, `dynamic=False`, one full graph per shape) over the same `LlamaModel` weights and KV cache, at the shapes
`buckets.graph_shapes` lists:

- decode: graphs `[n, 1]` over the first n slots, row i in KV line i (NxDI's token generation), one per
  token-generation bucket and batch bucket n. A graph attends over the first b positions of its n lines only, and a
  step runs the smallest token-generation bucket that holds every row's position (NxDI's
  `token_generation_buckets`, made by the same rule as the context buckets over the line: powers of two from 128,
  then the whole line) and the smallest batch bucket that holds its highest slot (`buckets.batch_buckets`: 1, 4,
  16, ... then max_num_seqs; the scheduler hands out the lowest free slot, so one client decodes one row, not
  max_num_seqs; the full batch is NxDI's shape). A slot of the bucket without a row this step gets a filler row
  (token 0) at its next free position, as the NxDI runner sends them: its own next step writes that position before
  anything reads it (see `_filler_position`); a filler past the bucket writes there all the same and reads nothing
  it keeps. The slots past the batch bucket are not touched.
- prefill: one graph per context-encoding bucket `[1, b]` (NxDI's rule, `buckets.context_buckets`: powers of two up
  to max_context_length, from 128 on Neuron; from `PREFILL_MIN_BUCKET` here, where a chat prompt of a few dozen
  tokens padded to 128 would cost four times its compute), one prompt per call, right-padded to the smallest bucket
  that holds it; up to BATCH_PREFILL_MAX_BUCKET also one graph `[max_num_seqs, b]` for prompts arriving together
  (NxDI compiles context encoding at batch 1: the reference runner goes further on the CPU);
  the pads sit after the prompt, so causal attention never lets a real token see them, and the logits are taken at
  the last real token only.
- verify (scored speculation): graphs at `[max_num_seqs, k+1]` per token-generation bucket, at the full batch only:
  each speculating row feeds its last token and its drafts (padded to k+1), the other slots are fillers. The draft
  model uses the same graphs to catch up on several tokens at once, and the decode and prefill graphs otherwise.

Every decode and verify graph attends over its buckets' part of the KV cache (`[n, KV, b, hd]` read in place,
masked by position), as a compiled Neuron graph does, where eager decoding reads only the positions written so far.
The line is `max_model_len + k` long (`buckets.cache_length`): a verify row writes k+1 positions (pads included) and
a filler row's pads need room at the end of the line.

In float32 on the CPU the linear layers run on oneDNN with each weight packed once at load (`packed_linear`), and the
attention over whole lines is written so that inductor fuses it into kernels reading each line once
(`_line_attention`).

Sampling stays outside the graphs (`SlotSampler`): the graphs return logits. Each graph gets its own copy of the
Python code object, so dynamo keeps exactly one compiled entry per graph (no recompile limit shared between
graphs or models), and serving runs under `fail_on_recompile`: a shape that was not compiled at load is an error,
never a silent compile. What is kept of a compile, and how a cache hit is told from a compile: `graph_artifacts`.
"""

from __future__ import annotations

import logging
import time
import types
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from neuronmodel_runtime.runners.buckets import (
    PREFILL_MIN_BUCKET,
    batch_buckets,
    cache_length,
    context_buckets,
    decode_graph,
    generation_buckets,
    graph_shapes,
)
from neuronmodel_runtime.runners.llama import LlamaModel, _rotate, rms_norm
from neuronmodel_runtime.runners.packed_linear import can_pack, pack_weights, packed_linear

log = logging.getLogger(__name__)

#: The compiler's stance while serving: a call the compiled graphs do not cover raises instead of compiling.
COMPILED_STANCE = "fail_on_recompile"


@dataclass(frozen=True)
class Traced:
    """What a graph function receives: the model, and whether its linear layers run on packed weights."""

    model: LlamaModel
    packed: bool


def _linear(t: Traced, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    return packed_linear(x, weight, bias) if t.packed else F.linear(x, weight, bias)


# --- the graphs ------------------------------------------------------------------------------------------------
# Plain functions of (model, tensors): compiled once per shape, each from its own code object (`_own_code`).


def _line_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention of `[B, T, H, hd]` queries over whole KV lines `[B, KV, L, hd]`, masked by `[B, 1, T, L]`; returns
    `[B, H, T, hd]`, softmax in float32.

    The G = H / KV query heads of a KV head are grouped against it (transformers' repeat_kv order), so GQA needs no
    copy of the lines, and both products are written as broadcast sums, which inductor fuses into kernels that read
    each line once (measured on SmolLM2's decode shapes: 1.6x faster than two batched matmuls, 1.4x than SDPA)."""
    batch, length, heads, hd = q.shape
    kv_heads, line = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    qg = q.transpose(1, 2).reshape(batch, kv_heads, group * length, hd)  # [B, KV, G*T, hd]
    scores = (qg[:, :, :, None, :] * keys[:, :, None]).sum(-1).float() * (hd ** -0.5)  # [B, KV, G*T, L]
    allowed = mask.expand(batch, group, length, line).reshape(batch, 1, group * length, line)
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1).to(q.dtype)  # [B, KV, G*T, L]
    out = (probs[..., None] * values[:, :, None]).sum(-2)  # [B, KV, G*T, hd]
    return out.reshape(batch, heads, length, hd)


def _decoder(t: Traced, tokens: torch.Tensor, slots: torch.Tensor, pos: torch.Tensor, fresh: bool,
             line: int = 0) -> torch.Tensor:
    """`[B, T]` tokens of lines `slots` `[B]` at positions `pos` `[B, T]` -> hidden states `[B, T, D]`.

    fresh: every row starts at position 0 (prefill): attend causally over this call's K/V; otherwise row i is line
    i (decode, verify) and attends over the first `line` positions of its line (a token-generation bucket), masked to
    those at or before each token's own.
    """
    model = t.model
    cfg, w = model.config, model.weights
    batch, length = tokens.shape
    heads, kv_heads, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    cos, sin = model.cos[pos][:, :, None], model.sin[pos][:, :, None]  # [B, T, 1, hd]
    slot_bt = slots[:, None].expand(batch, length)  # [B, T]
    mask = None
    if not fresh:
        mask = (torch.arange(line, device=tokens.device) <= pos[:, :, None])[:, None]  # [B, 1, T, line]
    x = F.embedding(tokens, w.embed)  # [B, T, D]
    for i, layer in enumerate(w.layers):
        h = rms_norm(x, layer.input_norm, cfg.rms_norm_eps)
        qkv = _linear(t, h, layer.qkv, layer.qkv_bias)  # [B, T, (H + 2KV) * hd]
        qk = _rotate(qkv[..., : (heads + kv_heads) * hd].view(batch, length, heads + kv_heads, hd), cos, sin)
        q, k = qk[:, :, :heads], qk[:, :, heads:]  # [B, T, H, hd], [B, T, KV, hd]
        v = qkv[..., (heads + kv_heads) * hd :].view(batch, length, kv_heads, hd)  # [B, T, KV, hd]
        # NOTE: written through the whole [layers, S, KV, L, hd] cache with the layer as an index, not through the
        # view k_cache[i]: inductor then updates the cache in place; writing into the view makes it copy the whole
        # cache every step (measured: 6x slower decode on the tiny model).
        layer_bt = torch.full_like(slot_bt, i)
        model.k_cache[layer_bt, slot_bt, :, pos] = k
        model.v_cache[layer_bt, slot_bt, :, pos] = v
        if fresh:
            attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=True, enable_gqa=heads != kv_heads)  # [B, H, T, hd]
        else:
            assert mask is not None
            # rows are lines 0..B-1 (a batch bucket): a static view of the cache, no gather
            attn = _line_attention(q, model.k_cache[i, :batch, :, :line], model.v_cache[i, :batch, :, :line], mask)
        x = x + _linear(t, attn.transpose(1, 2).reshape(batch, length, heads * hd), layer.o, layer.o_bias)
        gate, up = _linear(t, rms_norm(x, layer.post_norm, cfg.rms_norm_eps), layer.gate_up).chunk(2, dim=-1)
        x = x + _linear(t, F.silu(gate) * up, layer.down)
    return x


def _logits(t: Traced, hidden: torch.Tensor) -> torch.Tensor:
    """`LlamaModel.logits` through `_linear`."""
    w = t.model.weights
    return _linear(t, rms_norm(hidden, w.norm, t.model.config.rms_norm_eps), w.lm_head)


def _prefill_graph(t: Traced, tokens: torch.Tensor, slot: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """P prompts right-padded to their bucket: tokens `[P, b]` into lines `slot` `[P]` at 0..b-1; logits at each
    row's last real token `last` `[P]`: `[P, V]`."""
    rows, length = tokens.shape
    pos = torch.arange(length, device=tokens.device)[None].expand(rows, length)  # [P, b]
    hidden = _decoder(t, tokens, slot, pos, fresh=True)  # [P, b, D]
    return _logits(t, hidden[torch.arange(rows, device=tokens.device), last])  # [P, V]


def _decode_graph(t: Traced, tokens: torch.Tensor, positions: torch.Tensor, line: int) -> torch.Tensor:
    """The first n slots, in slot order: tokens `[n, 1]` at positions `[n, 1]` of line i, attending over its first
    `line` positions -> logits `[n, V]`."""
    slots = torch.arange(tokens.shape[0], device=tokens.device)
    return _logits(t, _decoder(t, tokens, slots, positions, fresh=False, line=line)[:, 0])


def _verify_graph(t: Traced, tokens: torch.Tensor, start: torch.Tensor, line: int) -> torch.Tensor:
    """Every slot: tokens `[S, W]` at start[i] .. start[i]+W-1 of line i, attending over its first `line` positions
    -> logits at every position `[S, W, V]`."""
    slots = torch.arange(tokens.shape[0], device=tokens.device)
    pos = start[:, None] + torch.arange(tokens.shape[1], device=tokens.device)  # [S, W]
    return _logits(t, _decoder(t, tokens, slots, pos, fresh=False, line=line))


def _own_code(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A copy of `fn` with its own code object. Dynamo keeps compiled entries per code object (and gives up after
    `recompile_limit` of them): one code object per graph keeps every graph a single, first-try cache entry."""
    code = fn.__code__.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


class FixedShapeModel:
    """A `LlamaModel` served only through its compiled fixed-shape graphs.

    The model's KV cache must be `max_model_len + verify_width - 1` positions long (`cache_length`). Also a
    `spec_decode.draft.SlotModel` (`last_logits`), so a draft model runs through its own graphs too.
    """

    def __init__(self, model: LlamaModel, max_context_length: int, max_model_len: int, verify_width: int = 0,
                 name: str = "model", pack: Optional[bool] = None):
        if model.max_len != cache_length(max_model_len, verify_width):
            raise ValueError(f"the KV cache holds {model.max_len} positions, the graphs need "
                             f"{cache_length(max_model_len, verify_width)}")
        self.model = model
        self.name = name
        self.num_slots = model.num_slots
        self.max_model_len = max_model_len
        self.max_context_length = max_context_length
        self.buckets = context_buckets(max_context_length, PREFILL_MIN_BUCKET)
        self.lines = generation_buckets(model.max_len)  # the decode / verify graphs' token-generation buckets
        self.batches = batch_buckets(self.num_slots)  # the decode graphs' batch buckets
        self.verify_width = verify_width  # k+1; 0 = no verify graph
        self.device, self.dtype, self.config = model.device, model.dtype, model.config
        # linear layers on oneDNN-packed weights (float32 on the CPU; None: wherever that is possible)
        self.packed = can_pack(self.device, self.dtype) if pack is None else pack
        self._traced = Traced(model, self.packed)
        self._next: dict[int, int] = {}  # slot -> 1 + the highest position a real token of it was written at
        self._graphs: dict[str, Callable[..., torch.Tensor]] = {}
        self.compile_seconds = 0.0

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def shapes(self) -> dict[str, list[int]]:
        """Graph name -> token shape it was compiled for (`graph_shapes`)."""
        return graph_shapes(self.num_slots, self.max_context_length, self.model.max_len, self.verify_width)

    # --- compile -----------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def compile(self) -> None:
        """Compile every graph and run each once (warm-up), so that serving never compiles.

        The warm-up writes junk K/V (token 0) into the lines; harmless, as every position is written before it
        is read."""
        started = time.perf_counter()
        torch._dynamo.mark_static_address(self.model.k_cache)
        torch._dynamo.mark_static_address(self.model.v_cache)
        if self.packed:
            pack_weights(self.model.weights, self.num_slots)
        kinds = {"decode": _decode_graph, "verify": _verify_graph, "prefill": _prefill_graph,
                 "batchprefill": _prefill_graph}
        dev = self.device
        for graph, shape in self.shapes().items():
            kind, size = graph.split("_")[:2]  # decode_<line>[_b<batch>]: the batch is the shape's
            fn = _own_code(kinds[kind], f"{self.name}_{graph}_graph")
            self._graphs[graph] = torch.compile(fn, dynamic=False, fullgraph=True)
            tokens = torch.zeros(shape, dtype=torch.int64, device=dev)
            if kind == "decode":
                self._graphs[graph](self._traced, tokens, torch.ones(shape, dtype=torch.int64, device=dev), int(size))
            elif kind == "verify":
                self._graphs[graph](self._traced, tokens, torch.zeros(shape[0], dtype=torch.int64, device=dev),
                                    int(size))
            else:
                slot, last = (torch.zeros(shape[0], dtype=torch.int64, device=dev) for _ in range(2))  # distinct
                self._graphs[graph](self._traced, tokens, slot, last)
            log.info("%s: graph %s %s ready after %.1f s", self.name, graph, shape, time.perf_counter() - started)
        self.compile_seconds = time.perf_counter() - started

    def line_bucket(self, needed: int) -> int:
        """The smallest token-generation bucket that holds `needed` positions (every real row's, fillers aside)."""
        return next(b for b in self.lines if needed <= b)

    def batch_bucket(self, needed: int) -> int:
        """The smallest decode batch bucket that holds the first `needed` slots."""
        return next(n for n in self.batches if needed <= n)

    def _run(self, graph: str, *inputs: Any) -> torch.Tensor:
        if graph not in self._graphs:
            raise RuntimeError(f"{self.name}: graph {graph} was not compiled (call compile() first)")
        with torch.compiler.set_stance(COMPILED_STANCE):  # serving never compiles
            return self._graphs[graph](self._traced, *inputs)

    # --- the fixed-shape calls ---------------------------------------------------------------------------------

    def bucket(self, length: int) -> int:
        """The smallest context-encoding bucket that holds `length` tokens."""
        for b in self.buckets:
            if length <= b:
                return b
        raise ValueError(f"a prompt of {length} tokens exceeds max_context_length {self.max_context_length}")

    def prefill(self, slot: int, prompt: Sequence[int]) -> torch.Tensor:
        """One prompt into `slot` at positions 0..n-1 (right-padded to its bucket): `[V]` logits at its last token."""
        if len(prompt) < 1:
            raise ValueError("a prompt needs at least one token")
        b = self.bucket(len(prompt))
        return self._prefill_call(f"prefill_{b}", 1, b, [slot], [prompt])[0]

    def prefill_all(self, slots: Sequence[int], prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        """Prompts into their slots: `[N, V]` logits at each one's last token. The prompts of one bucket that fill
        more than half of the slots go in one full-batch call (`batchprefill_<b>`); its spare rows repeat the first
        prompt, writing the same K/V into the same line; the others go one per call."""
        logits: list[Optional[torch.Tensor]] = [None] * len(prompts)
        by_bucket: dict[int, list[int]] = {}
        for i, prompt in enumerate(prompts):
            by_bucket.setdefault(self.bucket(len(prompt)), []).append(i)
        for b, rows in by_bucket.items():
            if f"batchprefill_{b}" in self._graphs and 2 * len(rows) > self.num_slots:
                batch = self._prefill_call(f"batchprefill_{b}", self.num_slots, b, [slots[i] for i in rows],
                                           [prompts[i] for i in rows])
                for r, i in enumerate(rows):
                    logits[i] = batch[r]
            else:
                for i in rows:
                    logits[i] = self.prefill(slots[i], prompts[i])
        return torch.stack([row for row in logits if row is not None])

    def _prefill_call(self, graph: str, rows: int, b: int, slots: Sequence[int], prompts: Sequence[Sequence[int]]
                      ) -> torch.Tensor:
        """One call of prefill graph `graph` (`[rows, b]`) on `len(slots)` prompts, padded with repeats of the
        first."""
        pad = rows - len(prompts)
        slots, prompts = [*slots, *[slots[0]] * pad], [*prompts, *[prompts[0]] * pad]
        tokens = torch.zeros((rows, b), dtype=torch.int64)
        for r, prompt in enumerate(prompts):
            tokens[r, : len(prompt)] = torch.tensor(list(prompt), dtype=torch.int64)
        dev = self.device
        logits = self._run(graph, tokens.to(dev), torch.tensor(slots, device=dev),
                           torch.tensor([len(p) - 1 for p in prompts], device=dev))
        for slot, prompt in zip(slots, prompts):
            self._next[slot] = len(prompt)
        return logits[: rows - pad]

    def decode(self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """One token per row at its position, in one call over the first n slots, n the smallest batch bucket that
        holds the highest one: `[B, V]` logits in row order."""
        self._check_room(positions, 1)
        batch = self.batch_bucket(max(slots) + 1)
        batch_tokens = torch.zeros((batch, 1), dtype=torch.int64)
        batch_pos = torch.tensor([[self._filler_position(s)] for s in range(batch)], dtype=torch.int64)
        rows = torch.tensor(list(slots), dtype=torch.int64)
        batch_tokens[rows, 0] = torch.tensor(list(tokens), dtype=torch.int64)
        batch_pos[rows, 0] = torch.tensor(list(positions), dtype=torch.int64)
        line = self.line_bucket(max(positions) + 1)
        logits = self._run(decode_graph(line, batch, self.num_slots), batch_tokens.to(self.device),
                           batch_pos.to(self.device), line)  # [n, V]
        for slot, position in zip(slots, positions):
            self._next[slot] = position + 1
        return logits[rows.to(self.device)]

    def verify(self, slots: Sequence[int], fed: Sequence[Sequence[int]], start: Sequence[int]) -> torch.Tensor:
        """Rows of 1..W tokens each at start[i].. of their slot, all slots in one full-batch call: `[B, W, V]` logits
        in row order (positions past a row's own tokens are pads: their logits are unused)."""
        width = self.verify_width
        if not width:
            raise RuntimeError(f"{self.name}: no verify graph (compiled without speculation)")
        if not all(1 <= len(f) <= width for f in fed):
            raise ValueError(f"rows of {[len(f) for f in fed]} tokens must hold 1..{width}")
        self._check_room(start, width)
        full_tokens = torch.zeros((self.num_slots, width), dtype=torch.int64)
        full_start = torch.tensor([self._filler_position(s) for s in range(self.num_slots)], dtype=torch.int64)
        for slot, row, position in zip(slots, fed, start):
            full_tokens[slot, : len(row)] = torch.tensor(list(row), dtype=torch.int64)
            full_start[slot] = position
        line = self.line_bucket(max(start) + width)
        logits = self._run(f"verify_{line}", full_tokens.to(self.device), full_start.to(self.device), line)
        for slot, row, position in zip(slots, fed, start):
            self._next[slot] = position + len(row)
        return logits[torch.tensor(list(slots), device=self.device)]

    def last_logits(self, tokens: torch.Tensor, slots: Sequence[int], start_pos: Sequence[int]) -> torch.Tensor:
        """`SlotModel`: feed `[B, T]` tokens at start_pos of each slot's line, `[B, V]` logits at the last one.

        Through the graphs: rows starting at 0 are prefilled (up to max_context_length tokens, one call each), the
        rest is fed in calls of every pending row, one token per row through the decode graph, several through the
        verify graph (up to k+1 at a time)."""
        rows = [list(map(int, t)) for t in tokens.tolist()]
        out = torch.empty((len(rows), self.vocab_size), dtype=self.dtype, device=self.device)
        pending: dict[int, tuple[list[int], int]] = {}  # row -> (tokens still to feed, their start)
        for i, (row, start) in enumerate(zip(rows, start_pos)):
            if start == 0:
                n = min(len(row), self.max_context_length)
                logits = self.prefill(slots[i], row[:n])
                if n == len(row):
                    out[i] = logits
                    continue
                row, start = row[n:], n
            pending[i] = (row, int(start))
        while pending:
            ids = sorted(pending)
            step = 1 if all(len(pending[i][0]) == 1 for i in ids) or not self.verify_width else self.verify_width
            fed = [pending[i][0][:step] for i in ids]
            starts = [pending[i][1] for i in ids]
            if step == 1:
                logits = self.decode([slots[i] for i in ids], [f[0] for f in fed], starts)  # [R, V]
            else:
                logits = self.verify([slots[i] for i in ids], fed, starts)  # [R, W, V]
            for r, i in enumerate(ids):
                rest, start = pending[i][0][step:], pending[i][1] + step
                if rest:
                    pending[i] = (rest, start)
                    continue
                del pending[i]
                out[i] = logits[r] if step == 1 else logits[r, len(fed[r]) - 1]
        return out

    def release(self, slot: int) -> None:
        self._next.pop(slot, None)

    def _check_room(self, positions: Sequence[int], width: int) -> None:
        if any(p + width > self.model.max_len or p < 0 for p in positions):
            raise ValueError(f"positions {list(positions)} (+{width}) exceed the KV line of {self.model.max_len}")

    def _filler_position(self, slot: int) -> int:
        """Where a slot without a row this call may be written harmlessly (all W positions of a verify row).

        Its next position: the slot's own next call writes there (and after) before reading it, and every real
        position it holds is below. Positions from max_model_len - 1 on are never read by a later call (a row reads
        only positions up to its own, which is below max_model_len, and writes its own first), so clamping there
        keeps a filler row inside the line; a free slot's next position is 0.
        """
        return min(self._next.get(slot, 0), self.max_model_len - 1)


__all__ = ["COMPILED_STANCE", "FixedShapeModel", "Traced"]
