"""Interval code against known cases: published Wilson values, an independent implementation, and coverage of
the bootstrap and paired intervals on synthetic data whose true mean / difference is known."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest

from rope_extend.eval.stats import (
    Difference,
    block_means,
    block_sizes,
    bootstrap_mean_interval,
    newcombe_paired_interval,
    paired_bootstrap_interval,
    significance_sentence,
    wilson_interval,
)

# Newcombe (1998), "Two-sided confidence intervals for the single proportion", Stat Med 17:857, Table I, method 3.
PUBLISHED_WILSON = [
    ((81, 263), (0.2553, 0.3662)),
    ((15, 148), (0.0624, 0.1605)),
    ((0, 20), (0.0, 0.1611)),
    ((1, 29), (0.0061, 0.1718)),
]


@pytest.mark.parametrize(("kn", "expected"), PUBLISHED_WILSON)
def test_wilson_published_values(kn, expected):
    lo, hi = wilson_interval(*kn)
    assert (round(lo, 4), round(hi, 4)) == expected


@pytest.mark.parametrize("n", [1, 5, 10, 37])
def test_wilson_matches_scipy_and_closed_forms(n):
    z2 = 1.959963984540054**2
    for k in range(n + 1):
        ref = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        lo, hi = wilson_interval(k, n)
        assert lo == pytest.approx(ref.low, abs=1e-12) and hi == pytest.approx(ref.high, abs=1e-12)
    assert wilson_interval(0, n) == pytest.approx((0.0, z2 / (n + z2)))  # upper bound at 0/n in closed form
    assert wilson_interval(n, n)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="successes=3, n=2"):
        wilson_interval(3, 2)


def test_wilson_level():
    lo90, hi90 = wilson_interval(3, 10, level=0.90)
    lo95, hi95 = wilson_interval(3, 10)
    assert lo95 < lo90 < 0.3 < hi90 < hi95


def test_block_means_and_sizes():
    x = list(range(10))
    means, sizes = block_means(x, 4)
    assert means == [1.5, 5.5, 8.5] and sizes == [4, 4, 2]
    assert block_sizes(10, 4, 3) == sizes
    # the weighted mean of block means is the plain mean
    assert np.average(means, weights=sizes) == pytest.approx(np.mean(x))


def _ar1(rng, n, phi, mu):
    """Autocorrelated series with mean mu (like token losses within a text)."""
    e = rng.normal(size=n)
    y = np.empty(n)
    y[0] = e[0] / math.sqrt(1 - phi * phi)
    for i in range(1, n):
        y[i] = phi * y[i - 1] + e[i]
    return mu + y


def test_block_bootstrap_covers_the_known_mean_and_token_bootstrap_does_not():
    """On correlated data with a known mean, 64-value blocks keep ~95 % coverage; resampling single values
    (what a naive per-token bootstrap does) is far too narrow. This is why perplexity uses blocks."""
    rng = np.random.default_rng(1)
    mu, reps, hit_block, hit_token = 2.0, 300, 0, 0
    for r in range(reps):
        y = _ar1(rng, 4096, 0.8, mu)
        means, sizes = block_means(y, 64)
        lo, hi = bootstrap_mean_interval(means, sizes, resamples=500, seed=r)
        hit_block += lo <= mu <= hi
        lo, hi = bootstrap_mean_interval(y[:1024], resamples=300, seed=r)  # single values, no blocks
        hit_token += lo <= mu <= hi
    assert 0.88 <= hit_block / reps <= 0.99
    assert hit_token / reps < 0.80


def test_bootstrap_is_deterministic_and_weighted():
    vals, w = [1.0, 2.0] * 20 + [10.0], [100] * 40 + [1]
    assert bootstrap_mean_interval(vals, w) == bootstrap_mean_interval(vals, w)
    lo_w, hi_w = bootstrap_mean_interval(vals, w)
    lo_u, hi_u = bootstrap_mean_interval(vals)
    assert hi_w < hi_u  # the 1-token block barely moves the weighted mean
    assert bootstrap_mean_interval([3.0]) == (3.0, 3.0)
    with pytest.raises(ValueError, match="positive"):
        bootstrap_mean_interval([1.0, 2.0], [1, 0])


def test_paired_bootstrap_cancels_shared_noise():
    """Two variants read the same passages: the passage effect cancels in the paired interval."""
    rng = np.random.default_rng(2)
    passage = rng.normal(0, 1.0, size=128)  # shared by both variants
    a = passage + rng.normal(0, 0.05, size=128)
    b = passage + 0.1 + rng.normal(0, 0.05, size=128)  # true difference +0.1
    est, lo, hi = paired_bootstrap_interval(b, a)
    assert lo <= 0.1 <= hi and lo > 0  # significant and covers the truth
    ulo, uhi = bootstrap_mean_interval(b)
    vlo, vhi = bootstrap_mean_interval(a)
    assert (hi - lo) < 0.2 * min(uhi - ulo, vhi - vlo)
    with pytest.raises(ValueError, match="same length"):
        paired_bootstrap_interval([1.0], [1.0, 2.0])


def test_newcombe_paired_coverage_and_symmetry():
    rng = np.random.default_rng(3)
    n, reps = 30, 400
    for p_ref, p_var, rho_share in [(0.5, 0.5, 0.5), (0.3, 0.6, 0.3), (0.8, 0.9, 0.6)]:
        hits = 0
        for _ in range(reps):
            shared = rng.random(n) < rho_share
            u = rng.random(n)
            ref = np.where(shared, u < p_ref, rng.random(n) < p_ref)
            var = np.where(shared, u < p_var, rng.random(n) < p_var)
            _, lo, hi = newcombe_paired_interval(var.tolist(), ref.tolist())
            hits += lo <= p_var - p_ref <= hi
        assert hits / reps >= 0.92, (p_ref, p_var, hits / reps)
    # same discordant counts both ways -> estimate 0, symmetric interval
    a, b = [1, 1, 0, 0, 1, 0], [1, 0, 1, 0, 1, 0]
    est, lo, hi = newcombe_paired_interval(a, b)
    assert est == 0 and lo == pytest.approx(-hi)
    # 10/10 vs 0/10: significant; identical outcomes: not
    assert newcombe_paired_interval([1] * 10, [0] * 10)[1] > 0
    est, lo, hi = newcombe_paired_interval([1] * 10, [1] * 10)
    assert est == 0 and lo < 0 < hi or (lo, hi) == (0.0, 0.0)


def test_significance_sentence():
    diffs = [
        Difference("loss at 16k on pydoc_topics", "yarn-x2", "unpatched", -1.0, -1.1, -0.9, 128, True),
        Difference("passkey accuracy at 16k", "yarn-x2", "unpatched", 0.2, -0.1, 0.5, 10, False),
        Difference("loss at 2k on pydoc_topics", "linear-x2", "unpatched", 0.9, 0.8, 1.0, 16, True),
    ]
    s = significance_sentence(diffs)
    assert s.startswith("2 of 3 paired differences are significant")
    assert "yarn-x2 is better than unpatched on loss at 16k on pydoc_topics" in s
    assert "linear-x2 is worse than unpatched on loss at 2k" in s
    assert "passkey" not in s and "other 1 are within noise" in s
    assert significance_sentence(diffs[1:2]).startswith("None of the 1 paired differences")
