"""The bucket rule: which lengths a Neuron model (and the compiled reference runner) is compiled for.

Neuron compiles fixed shapes, so a prompt is padded to the smallest compiled length (bucket) that holds it. Both
libraries make their buckets the same way, powers of two from a smallest one and then the largest length itself, and
differ only in where the powers stop:

- NxDI (`modules/autobucketing.generate_buckets`, its context-encoding and token-generation buckets): below
  2**round(log2(largest)), so no bucket sits just below the largest one: 300 -> [128, 300], 700 -> [128, 256, 700];
- transformers-neuronx (`utils.power_of_two_bucket_sizes`, what an int n_positions becomes; the TNx runner makes its
  context_length_estimate the same way): every power of two below the largest: 300 -> [128, 256, 300].

The compiled reference runner follows NxDI's rule; its graphs' shapes are `graph_shapes`.
"""

from __future__ import annotations

import math

#: NxDI's smallest context-encoding bucket (`generate_buckets(128, max_context_length)`), and TNx's smallest bucket.
MIN_CONTEXT_BUCKET = 128
#: Context buckets up to this size also get a full-batch prefill graph `[max_num_seqs, b]`: prompts arriving
#: together are prefilled in one call when they fill more than half of it (measured on SmolLM2, float32, 2 cores:
#: one [16, 64] call costs what 9 [1, 64] calls do; larger buckets are compute-bound, where batching gains little).
BATCH_PREFILL_MAX_BUCKET = 128
#: The compiled reference runner's smallest prefill bucket: prompts are padded to a power of two from here, so a
#: 30-token chat prompt costs a 32-token prefill, not a 128-token one (measured on SmolLM2 at 16 concurrent chats:
#: the prefills were 40% of the run's runner time at 128).
PREFILL_MIN_BUCKET = 32


def _doubling(smallest: int, below: int) -> list[int]:
    """smallest, 2 * smallest, 4 * smallest, ... while below `below`."""
    sizes, size = [], smallest
    while size < below:
        sizes.append(size)
        size *= 2
    return sizes


def context_buckets(max_context_length: int, smallest: int = MIN_CONTEXT_BUCKET) -> list[int]:
    """NxDI's buckets (`modules/autobucketing.generate_buckets(smallest, max_context_length)`): powers of two from
    `smallest` (a power of two) below 2**round(log2(max_context_length)), then max_context_length itself; just
    [max_context_length] when it is the smaller."""
    if smallest >= max_context_length:
        return [max_context_length]
    return _doubling(smallest, 2 ** round(math.log2(max_context_length))) + [max_context_length]  # never [.., 512, 513]


def tnx_buckets(largest: int, smallest: int = MIN_CONTEXT_BUCKET) -> list[int]:
    """TNx's buckets (`utils.power_of_two_bucket_sizes(smallest, largest)`): every power of two from `smallest` below
    `largest`, then `largest` itself."""
    return _doubling(smallest, largest) + [largest]


def generation_buckets(line_length: int) -> list[int]:
    """The token-generation buckets over a KV line of `line_length` positions: NxDI's rule for
    `token_generation_buckets` (`generate_buckets(128, max_length)`), the context buckets' rule over the line."""
    return context_buckets(line_length)


def cache_length(max_model_len: int, verify_width: int) -> int:
    """KV positions per line the reference runner's graphs need: max_model_len, plus k scratch positions for a
    verify row's pads."""
    return max_model_len + max(verify_width - 1, 0)


def graph_shapes(num_slots: int, max_context_length: int, line_length: int, verify_width: int) -> dict[str, list[int]]:
    """The compiled reference runner's graphs: name -> the token shape it is compiled for: `decode_<b>` and
    `verify_<b>` per token-generation bucket b (the KV positions they attend over), `prefill_<b>` per context bucket,
    and `batchprefill_<b>` (every slot's row) per context bucket up to BATCH_PREFILL_MAX_BUCKET when there are several
    slots."""
    lines = generation_buckets(line_length)
    prompts = context_buckets(max_context_length, PREFILL_MIN_BUCKET)
    shapes = {f"decode_{b}": [num_slots, 1] for b in lines}
    shapes.update({f"prefill_{b}": [1, b] for b in prompts})
    if num_slots > 1:
        shapes.update({f"batchprefill_{b}": [num_slots, b] for b in prompts if b <= BATCH_PREFILL_MAX_BUCKET})
    if verify_width:
        shapes.update({f"verify_{b}": [num_slots, verify_width] for b in lines})
    return shapes


__all__ = ["BATCH_PREFILL_MAX_BUCKET", "MIN_CONTEXT_BUCKET", "PREFILL_MIN_BUCKET", "cache_length", "context_buckets",
           "generation_buckets", "graph_shapes", "tnx_buckets"]
