"""Uncertainty for evaluation numbers: Wilson intervals, block bootstrap, paired differences.

Choices (and why):

* **Accuracy** (passkey, needles): the Wilson score interval. Unlike the normal approximation it stays inside
  [0, 1] and keeps close to its nominal coverage at the small n (10-20 prompts per cell) a CPU run can afford;
  at 0/n or n/n it still gives a useful one-sided bound (0/10 -> [0, 0.28]).
* **Perplexity**: a bootstrap over *contiguous blocks* of token losses from the same forward pass (default
  128 tokens). Neighbouring token losses are correlated (same sentence, same topic, repeated phrases), so
  resampling single tokens would understate the spread; blocks of a few sentences keep that dependence inside
  a block. It costs no extra forward pass. It measures how much the number depends on *which passages* of this
  text were read, not how it varies over other kinds of text: that is why each corpus is reported separately.
  The interval is a percentile interval on the mean loss; perplexity's interval is ``exp`` of it.
* **Differences on the same samples** (a variant vs the unpatched model, same text positions or same prompts):
  paired intervals, which cancel what the samples share. Perplexity: the same block bootstrap on per-block
  loss differences. Binary retrieval: Newcombe's hybrid score interval for paired proportions (method 10 of
  Newcombe 1998), built from the two Wilson intervals and the correlation of the pairs; fractional scores
  (multi-value recall) use a paired bootstrap over prompts.

A difference is called significant when its 95 % interval excludes 0. Every interval holds its own estimate
(a percentile interval of a skewed resample can otherwise fall just beside it in the last bits, and a plot's error
bar would be negative).

**One unit, no interval.** A bootstrap of one block (or one pair of prompts) resamples that unit every time: an
interval of width 0 that claims certainty from a single observation (a one-pair difference printed
``+0 [+0, +0]``). The bootstrap functions return ``None`` for its limits and every report, card and plot says
:data:`NO_INTERVAL` instead. The Wilson and Newcombe intervals are analytic and stay wide at n = 1 (1/1 retrieved:
[0.21, 1]), so they are kept.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95
RESAMPLES = 2000
SEED = 0
NO_INTERVAL = "n = 1: no interval"  # what is printed where a bootstrap had one unit to resample


def interval_text(lo: float | None, hi: float | None, fmt: str = "{:.2f}") -> str:
    """``[lo, hi]`` in *fmt*, or :data:`NO_INTERVAL` where there is none (``None`` limits: one unit)."""
    if lo is None or hi is None:
        return NO_INTERVAL
    return f"[{fmt.format(lo)}, {fmt.format(hi)}]"


def _z(level: float) -> float:
    from statistics import NormalDist

    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be in (0, 1), got {level}")
    return NormalDist().inv_cdf(0.5 + level / 2)


def wilson_interval(successes: float, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval for a proportion ``successes / n`` (``successes`` may be fractional, e.g. a summed
    recall). ``n = 0`` gives ``(0, 1)``: no information."""
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    z = _z(level)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return min(lo, p), max(hi, p)


def _weighted_means(values: np.ndarray, weights: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.size, size=(resamples, values.size))
    w = weights[idx]
    return (values[idx] * w).sum(axis=1) / w.sum(axis=1)


def bootstrap_mean(
    values: Sequence[float],
    weights: Sequence[float] | None = None,
    *,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float | None, float | None]:
    """``(mean, lo, hi)``: the (weighted) mean and its percentile bootstrap interval, resampling the given units
    (blocks) with replacement; the interval always holds the mean. One unit: ``(mean, None, None)``, no interval
    (see :data:`NO_INTERVAL`).

    ``weights`` are the units' sizes (tokens per block) so a short last block counts for what it holds.
    Deterministic for a given ``seed``.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("bootstrap needs at least one value")
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != v.shape or (w <= 0).any():
        raise ValueError(f"weights must be positive, one per value ({v.size}), got {w.shape}")
    mean = float((v * w).sum() / w.sum())
    if v.size == 1:
        return mean, None, None
    means = _weighted_means(v, w, resamples, seed)
    a = (1 - level) / 2
    lo, hi = np.quantile(means, [a, 1 - a])
    return mean, min(float(lo), mean), max(float(hi), mean)


def bootstrap_mean_interval(values: Sequence[float], weights: Sequence[float] | None = None,
                            **kwargs) -> tuple[float | None, float | None]:
    """The interval of :func:`bootstrap_mean` alone (``(None, None)`` from one unit)."""
    return bootstrap_mean(values, weights, **kwargs)[1:]


def block_means(losses: Sequence[float], block_size: int) -> tuple[list[float], list[int]]:
    """Means and sizes of contiguous blocks of ``block_size`` values (the last block may be shorter)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    x = np.asarray(losses, dtype=np.float64)
    means, sizes = [], []
    for s in range(0, x.size, block_size):
        chunk = x[s : s + block_size]
        means.append(float(chunk.mean()))
        sizes.append(int(chunk.size))
    return means, sizes


def block_sizes(n_values: int, block_size: int, n_blocks: int) -> list[int]:
    """Sizes of the ``n_blocks`` blocks :func:`block_means` makes from ``n_values`` values."""
    sizes = [block_size] * n_blocks
    if n_blocks:
        sizes[-1] = n_values - block_size * (n_blocks - 1)
    return sizes


@dataclass(frozen=True)
class Difference:
    """``estimate`` = (variant - reference) on the same samples, with its paired interval ``[lo, hi]`` (``None``
    when a bootstrap had one pair: no interval, never significant)."""

    what: str  # e.g. "loss at 16k on pydoc_topics"
    variant: str
    reference: str
    estimate: float
    lo: float | None
    hi: float | None
    n: int  # paired units (blocks or prompts)
    lower_is_better: bool

    @property
    def has_interval(self) -> bool:
        return self.lo is not None and self.hi is not None

    @property
    def significant(self) -> bool:
        return self.has_interval and (self.lo > 0 or self.hi < 0)

    def text(self) -> str:
        """``+0.12 [+0.05, +0.2]``, or ``+0 (n = 1: no interval)``."""
        if not self.has_interval:
            return f"{self.estimate:+.3g} ({NO_INTERVAL})"
        return f"{self.estimate:+.3g} {interval_text(self.lo, self.hi, '{:+.3g}')}"

    @property
    def better(self) -> bool:
        return (self.estimate < 0) == self.lower_is_better


def paired_bootstrap_interval(
    variant: Sequence[float],
    reference: Sequence[float],
    weights: Sequence[float] | None = None,
    *,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float | None, float | None]:
    """(mean difference, lo, hi) of ``variant - reference`` over paired units, resampling the pairs (one pair:
    ``(difference, None, None)``, no interval)."""
    a, b = np.asarray(variant, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired samples must have the same length, got {a.size} and {b.size}")
    return bootstrap_mean(a - b, weights, level=level, resamples=resamples, seed=seed)


def newcombe_paired_interval(
    variant: Sequence[bool], reference: Sequence[bool], level: float = LEVEL
) -> tuple[float, float, float]:
    """(p_variant - p_reference, lo, hi) for binary outcomes on the same prompts: Newcombe (1998) method 10.

    With ``e`` = both right, ``f`` = only the variant right, ``g`` = only the reference right, ``h`` = both wrong,
    the difference is ``(f - g) / n``; its limits combine the Wilson intervals of the two marginal proportions
    with the phi correlation of the pairs (phi is taken as 0 when a margin is empty).
    """
    if len(variant) != len(reference):
        raise ValueError(f"paired samples must have the same length, got {len(variant)} and {len(reference)}")
    n = len(variant)
    if n == 0:
        return 0.0, -1.0, 1.0
    pairs = list(zip(map(bool, variant), map(bool, reference)))
    e = sum(a and b for a, b in pairs)
    f = sum(a and not b for a, b in pairs)
    g = sum(b and not a for a, b in pairs)
    h = n - e - f - g
    p1, p2 = (e + f) / n, (e + g) / n
    l1, u1 = wilson_interval(e + f, n, level)
    l2, u2 = wilson_interval(e + g, n, level)
    denom = (e + f) * (g + h) * (e + g) * (f + h)
    phi = (e * h - f * g) / math.sqrt(denom) if denom > 0 else 0.0
    d1 = (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2
    d2 = (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2
    est = p1 - p2
    return est, max(-1.0, est - math.sqrt(max(d1, 0.0))), min(1.0, est + math.sqrt(max(d2, 0.0)))


def significance_sentence(differences: Sequence[Difference], limit: int = 6) -> str:
    """One sentence saying which differences are significant (95 % interval excludes 0), best-supported first."""
    if not differences:
        return "No paired comparisons were available."
    sig = [d for d in differences if d.significant]
    total = len(differences)
    bare = sum(not d.has_interval for d in differences)
    single = f"{bare} {'is' if bare == 1 else 'are'} from one pair, {NO_INTERVAL}"
    if not sig:
        if bare == total:
            return (f"None of the {total} paired differences has an interval (each is from one pair, {NO_INTERVAL}): "
                    "these samples cannot tell the variants apart.")
        return (f"None of the {total} paired differences is significant at 95 % (every interval includes 0"
                + (f"; {single}" if bare else "") + "): the variants cannot be told apart on these samples.")

    def strength(d: Difference) -> float:
        half = (d.hi - d.lo) / 2 or 1e-12
        return abs(d.estimate) / half

    sig.sort(key=strength, reverse=True)
    parts = [f"{d.variant} is {'better' if d.better else 'worse'} than {d.reference} on {d.what} ({d.text()})"
             for d in sig[:limit]]
    more = f", and {len(sig) - limit} more" if len(sig) > limit else ""
    others = total - len(sig)
    rest = f"; the other {others} are within noise (their intervals include 0)"
    if bare:
        rest = f"; of the other {others}, {others - bare} are within noise (their intervals include 0) and {single}"
    return f"{len(sig)} of {total} paired differences are significant at 95 %: " + "; ".join(parts) + more + rest + "."
