"""Statistics for the distribution tests (no scipy in the environment: the chi-square tail from the regularised
incomplete gamma function), and their significance level."""

from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

#: Each distribution check fails correct code with this probability (the seeds are fixed, so a given build passes or
#: fails deterministically).
ALPHA = 1e-4


def chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for X ~ chi-square(dof): Q(dof/2, x/2), by its series (small x) or continued fraction (Numerical
    Recipes)."""
    if x <= 0:
        return 1.0
    a, z = dof / 2.0, x / 2.0
    log_prefix = -z + a * math.log(z) - math.lgamma(a)
    if z < a + 1.0:  # series for the lower function P(a, z)
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-16:
            n += 1.0
            term *= z / n
            total += term
        return max(0.0, 1.0 - total * math.exp(log_prefix))
    tiny = 1e-300  # modified Lentz for the upper function Q(a, z)
    b = z + 1.0 - a
    c, d = 1.0 / tiny, 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        h *= d * c
        if abs(d * c - 1.0) < 1e-16:
            break
    return math.exp(log_prefix) * h


def goodness_of_fit(samples: Sequence, probs: dict, min_expected: float = 5.0) -> dict:
    """Pearson chi-square of `samples` against exact cell probabilities; cells expected below `min_expected` are
    pooled (smallest first) into one cell. Returns chi2, dof, p and the samples that fall outside the support."""
    n = len(samples)
    observed = Counter(samples)
    impossible = {c: m for c, m in observed.items() if probs.get(c, 0.0) <= 0.0}
    cells = sorted((p * n, observed.get(c, 0)) for c, p in probs.items() if p > 0.0)  # (expected, observed)
    pooled_e = pooled_o = 0.0
    kept = []
    for e, o in cells:
        if pooled_e < min_expected and e < min_expected:
            pooled_e, pooled_o = pooled_e + e, pooled_o + o
        else:
            kept.append((e, o))
    if pooled_e > 0:
        if pooled_e < min_expected and kept:  # too small to stand alone: merge into the smallest kept cell
            e, o = kept.pop(0)
            pooled_e, pooled_o = pooled_e + e, pooled_o + o
        kept.append((pooled_e, pooled_o))
    chi2 = sum((o - e) ** 2 / e for e, o in kept)
    dof = max(len(kept) - 1, 1)
    return {"chi2": chi2, "dof": dof, "p": chi2_sf(chi2, dof), "impossible": impossible, "n": n}
