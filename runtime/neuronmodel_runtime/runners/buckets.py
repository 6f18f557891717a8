"""Which lengths the Neuron runners and the compiled reference runner are compiled for.

The rule itself, NxDI's and transformers-neuronx's, is the contract's (config/buckets.py: the operator passes it to
vLLM Neuron too). The compiled reference runner follows NxDI's rule; its graphs' shapes are `graph_shapes`.
"""

from __future__ import annotations

from neuronmodel_runtime.config.buckets import MIN_CONTEXT_BUCKET, context_buckets, doubling

#: Context buckets up to this size also get a full-batch prefill graph `[max_num_seqs, b]`: prompts arriving
#: together are prefilled in one call when they fill more than half of it (measured on SmolLM2, float32, 2 cores:
#: one [16, 64] call costs what 9 [1, 64] calls do; larger buckets are compute-bound, where batching gains little).
BATCH_PREFILL_MAX_BUCKET = 128
#: The compiled reference runner's decode batch buckets grow by this factor (1, 4, 16, ...) up to max_num_seqs: a
#: step decodes the smallest that holds its highest slot, so one client on 32 slots pays for 1 row, not 32.
BATCH_BUCKET_FACTOR = 4
#: The compiled reference runner's smallest prefill bucket: prompts are padded to a power of two from here, so a
#: 30-token chat prompt costs a 32-token prefill, not a 128-token one (measured on SmolLM2 at 16 concurrent chats:
#: the prefills were 40% of the run's runner time at 128).
PREFILL_MIN_BUCKET = 32


def tnx_buckets(largest: int, smallest: int = MIN_CONTEXT_BUCKET) -> list[int]:
    """TNx's buckets (`utils.power_of_two_bucket_sizes(smallest, largest)`): every power of two from `smallest` below
    `largest`, then `largest` itself."""
    return doubling(smallest, largest) + [largest]


def generation_buckets(line_length: int) -> list[int]:
    """The token-generation buckets over a KV line of `line_length` positions: NxDI's rule for
    `token_generation_buckets` (`generate_buckets(128, max_length)`), the context buckets' rule over the line."""
    return context_buckets(line_length)


def batch_buckets(num_slots: int) -> list[int]:
    """The decode graphs' batch sizes: powers of BATCH_BUCKET_FACTOR below `num_slots`, then `num_slots` itself
    (32 -> [1, 4, 16, 32]). The scheduler hands out the lowest free slot, so the bucket follows the concurrency."""
    sizes, size = [], 1
    while size < num_slots:
        sizes.append(size)
        size *= BATCH_BUCKET_FACTOR
    return sizes + [num_slots]


def decode_graph(line: int, batch: int, num_slots: int) -> str:
    """A decode graph's name: `decode_<line>` at the full batch, `decode_<line>_b<batch>` below it."""
    return f"decode_{line}" if batch == num_slots else f"decode_{line}_b{batch}"


def cache_length(max_model_len: int, verify_width: int) -> int:
    """KV positions per line the reference runner's graphs need: max_model_len, plus k scratch positions for a
    verify row's pads."""
    return max_model_len + max(verify_width - 1, 0)


def graph_shapes(num_slots: int, max_context_length: int, line_length: int, verify_width: int) -> dict[str, list[int]]:
    """The compiled reference runner's graphs: name -> the token shape it is compiled for: per token-generation
    bucket b (the KV positions they attend over) `decode_<b>` per batch bucket (`decode_graph`) and `verify_<b>` at
    the full batch, `prefill_<b>` per context bucket, and `batchprefill_<b>` (every slot's row) per context bucket up
    to BATCH_PREFILL_MAX_BUCKET when there are several slots."""
    lines = generation_buckets(line_length)
    prompts = context_buckets(max_context_length, PREFILL_MIN_BUCKET)
    shapes = {decode_graph(b, n, num_slots): [n, 1] for b in lines for n in batch_buckets(num_slots)}
    shapes.update({f"prefill_{b}": [1, b] for b in prompts})
    if num_slots > 1:
        shapes.update({f"batchprefill_{b}": [num_slots, b] for b in prompts if b <= BATCH_PREFILL_MAX_BUCKET})
    if verify_width:
        shapes.update({f"verify_{b}": [num_slots, verify_width] for b in lines})
    return shapes


__all__ = ["BATCH_BUCKET_FACTOR", "BATCH_PREFILL_MAX_BUCKET", "MIN_CONTEXT_BUCKET", "PREFILL_MIN_BUCKET",
           "batch_buckets", "cache_length", "context_buckets", "decode_graph", "generation_buckets", "graph_shapes",
           "tnx_buckets"]
