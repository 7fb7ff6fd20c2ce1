"""Interval code against known cases: published Wilson values, an independent implementation, and coverage of
the bootstrap and paired intervals on synthetic data whose true mean / difference is known."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest

from rope_extend.eval.stats import (
    NO_INTERVAL,
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
    assert bootstrap_mean_interval([3.0]) == (None, None)  # one unit: nothing to resample (issue 66 item 10)
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


def test_one_unit_has_no_interval():
    """issue 66 item 10: a paired difference from one pair with partial credit printed ``+0 [+0, +0]``, certainty
    from n = 1. A bootstrap of one unit has no interval; the difference says so and is never significant, and the
    sentence counts it apart from the differences whose interval includes 0."""
    est, lo, hi = paired_bootstrap_interval([0.5], [0.5])
    assert (est, lo, hi) == (0.0, None, None)
    one = Difference("niah_multivalue/filler accuracy at 384", "yarn-x2", "unpatched", est, lo, hi, 1, False)
    assert one.text() == f"+0 ({NO_INTERVAL})" and NO_INTERVAL == "n = 1: no interval"
    assert not one.significant and "[" not in one.text()
    assert significance_sentence([one]) == ("None of the 1 paired differences has an interval (each is from one "
                                            "pair, n = 1: no interval): these samples cannot tell the variants apart.")
    two = Difference("loss at 2k on pydoc_topics", "yarn-x2", "unpatched", 0.01, -0.02, 0.04, 16, True)
    assert significance_sentence([two, one]) == (
        "None of the 2 paired differences is significant at 95 % (every interval includes 0; 1 is from one pair, "
        "n = 1: no interval): the variants cannot be told apart on these samples.")
    sig = Difference("loss at 16k on pydoc_topics", "yarn-x2", "unpatched", -1.0, -1.1, -0.9, 128, True)
    assert significance_sentence([sig, two, one]).endswith(
        "; of the other 2, 1 are within noise (their intervals include 0) and 1 is from one pair, n = 1: no interval.")
    # two pairs: an interval again, from the resampled pairs (each resample's mean is one of 0, 0.25, 0.5)
    est, lo, hi = paired_bootstrap_interval([1.0, 0.5], [0.5, 0.5])
    assert est == 0.25 and lo == 0.0 and hi == 0.5


def test_report_and_card_print_no_interval_from_one_pair(tmp_path):
    """tests/data/eval-smoke is what `rope-extend eval smollm2 --suite smoke --spec method=yarn,factor=2` wrote: at 256
    tokens niah_multivalue is one prompt per variant, both with partial credit (0.5), and its paired difference read
    ``+0 [+0, +0]`` in report.md. Now the report's table, its sentence and the summary (terminal, card) say
    ``n = 1: no interval``; a perplexity of one block has none in the card's model-index either."""
    from pathlib import Path

    import torch

    from rope_extend.eval.card_section import CardEval
    from rope_extend.eval.perplexity import perplexity_metrics
    from rope_extend.eval.report import summary_tables
    from rope_extend.eval.runner import run_records, write_outputs

    meta, records = run_records(Path(__file__).parent / "data" / "eval-smoke")
    pair = [r for r in records if r["case_id"] == "niah_multivalue/filler/L256/s0"]
    assert [r["metrics"]["score"] for r in pair] == [0.5, 0.5]
    report = write_outputs(records, tmp_path, plots=False, meta=meta).read_text()
    row = next(line for line in report.splitlines() if line.startswith("| niah_multivalue/filler accuracy at 256 |"))
    assert row == "| niah_multivalue/filler accuracy at 256 | yarn-x2 | +0 (n = 1: no interval) | 1 | no |"
    assert "[+0, +0]" not in report
    sentence = ("; of the other 9, 8 are within noise (their intervals include 0) and 1 is from one pair, "
                "n = 1: no interval.")
    assert sentence in report and sentence in " ".join(summary_tables(records).split())
    # a perplexity of one 128-token block (127 losses): its cells and the card's model-index say there is no interval
    losses = torch.tensor([2.0 + 0.01 * (i % 7) for i in range(127)])
    one = {**records[0], "length": 128, "case_id": "perplexity/pydoc_topics/L128",
           "metrics": {**perplexity_metrics(losses, block_size=128), "text": "pydoc_topics"}}
    assert "ppl_ci" not in one["metrics"]
    assert f"| 128 | {one['metrics']['ppl']:.2f} (n = 1: no interval) |" in summary_tables([one])
    (result,) = CardEval([one], suite="smoke", variant="unpatched").results("m")
    assert result.metric_args["interval_95"] == NO_INTERVAL and result.metric_args["n"] == 1
