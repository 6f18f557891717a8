"""The bucket rule: which lengths a Neuron model is compiled for, shared by both sides of the contract.

Neuron compiles fixed shapes, so a prompt is padded to the smallest compiled length (bucket) that holds it. Both
libraries make their buckets the same way, powers of two from a smallest one and then the largest length itself, and
differ only in where the powers stop:

- NxDI (`modules/autobucketing.generate_buckets`, its context-encoding and token-generation buckets): below
  2**round(log2(largest)), so no bucket sits just below the largest one: 300 -> [128, 300], 700 -> [128, 256, 700];
- transformers-neuronx (`utils.power_of_two_bucket_sizes`, what an int n_positions becomes; the TNx runner makes its
  context_length_estimate the same way): every power of two below the largest: 300 -> [128, 256, 300].

The runtime's runners compile with it (runners/buckets.py); the operator passes NxDI's buckets to vLLM Neuron's
NxDI line (`context_encoding_buckets`), so both engines compile the same prompt shapes.
"""

from __future__ import annotations

import math

#: NxDI's smallest context-encoding bucket (`generate_buckets(128, max_context_length)`), and TNx's smallest bucket.
MIN_CONTEXT_BUCKET = 128


def doubling(smallest: int, below: int) -> list[int]:
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
    return doubling(smallest, 2 ** round(math.log2(max_context_length))) + [max_context_length]  # never [.., 512, 513]


__all__ = ["MIN_CONTEXT_BUCKET", "context_buckets", "doubling"]
