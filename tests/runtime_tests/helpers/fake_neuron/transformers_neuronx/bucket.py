"""Mirrors src/transformers_neuronx/bucket.py (0.13.x, 1ade6d7): how n_positions / context_length_estimate / batch_size
become the compiled buckets, and how a size picks its bucket."""

import bisect
from typing import List, Optional, Union


def token_sizes(buckets_or_size: Union[List[int], int]) -> List[int]:
    """A list is taken as the buckets; an int N doubles from 128 up to N (utils.power_of_two_bucket_sizes)."""
    if isinstance(buckets_or_size, list):
        return sorted(buckets_or_size)
    sizes, size = [], 128
    while size < buckets_or_size:
        sizes.append(size)
        size *= 2
    return sizes + [buckets_or_size]


def context_sizes(buckets_or_size, token_buckets: Optional[List[int]] = None) -> List[int]:
    """A list is the context buckets; an int is one bucket (0 disables context encoding); None is half of each token
    bucket."""
    if isinstance(buckets_or_size, list):
        return sorted(buckets_or_size)
    if isinstance(buckets_or_size, int):
        return [] if buckets_or_size <= 0 else [buckets_or_size]
    if token_buckets is not None and buckets_or_size is None:
        return [b // 2 for b in token_buckets]
    raise NotImplementedError(f"Prompt bucket config {buckets_or_size} not supported")


def batch_sizes(batch_size) -> List[int]:
    if isinstance(batch_size, int):
        return [batch_size]
    if isinstance(batch_size, list):
        return sorted(batch_size)
    raise TypeError("batch_size must be list of ints or int type")


def find(buckets: Optional[List[int]], size: int) -> Optional[int]:
    """The smallest bucket >= size; past the largest, the largest (callers assert the fit)."""
    if not buckets:
        return None
    return buckets[bisect.bisect_left(buckets, size, hi=len(buckets) - 1)]
