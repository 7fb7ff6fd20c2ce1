"""The report's PNG plots: one builder per plot, each returning a matplotlib ``Figure`` (``None`` without data).

What a reader needs to trust a plot is drawn in, whatever the records hold:

- every variant is visible: it keeps one colour, marker and line style in every plot (colour-blind-safe, from
  :mod:`rope_extend.plotstyle`), points at the same length are dodged sideways, and a variant whose numbers equal
  an earlier variant's says so in its legend entry (``dynamic-yarn-x2 (= unpatched at 2k, 8k; = yarn-x2 at
  16k)``), found by comparing the numbers, not names; curves too close to tell apart get a panel of their paired
  differences;
- bands are light fills with edges in their variant's colour and line style; length axes are log-2 with plain
  labels (2k, 4k, 8k), at least four of them;
- measured points are markers; the thin dotted lines between them only link a variant's points (nothing was
  measured in between, and the x label says so);
- every line is in a legend, reference lines too (the original window, the unpatched baseline, the retrieval
  ceiling), and legends sit outside the axes, never over the data;
- retrieval points from fewer than :data:`MIN_N_FOR_BARS` prompts are labelled ``k/n`` instead of carrying a
  Wilson bar that spans most of [0, 1];
- a heatmap cell with no prompt reads "not run"; the colormap is cividis, never red-green;
- a plot without the unpatched model's numbers says so (no before/after), and records pooled from other eval
  folders (``rope-extend eval-report OUT --compare DIR``) are named with their folder.

Figures are built on :class:`matplotlib.figure.Figure`, not pyplot: building one (in a test, in a thread) leaves
no global state and nothing to close. A variant's markers carry its name as ``gid`` (reference lines: ``window``,
``ceiling``; guides: ``link``; band edges: ``band``; a difference panel's lines: ``<variant>:difference``),
which is how tests find what was drawn. :func:`make_plots` writes the PNGs the
report links.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from ..formatting import fmt_tokens
from ..plotstyle import (
    BAND_ALPHA,
    HEATMAP_CMAP,
    ink_on,
    length_ticks,
    plain_log_axis,
    styles_for,
    value_ticks,
)
from .report import (
    accuracy,
    ceilings,
    haystack_of,
    original_of,
    perplexity_records,
    probe_cells,
    probe_records,
    task_label,
    text_of,
    texts_of,
    variants_of,
)
from .stats import bootstrap_mean_interval
from .variants import BASELINE

MIN_N_FOR_BARS = 5  # below this many prompts per point, a Wilson bar says less than the count k/n does
DPI = 110
WINDOW_STYLE = {"color": "0.35", "ls": "--", "lw": 1, "zorder": 0.5}  # behind the points
CEILING_STYLE = {"color": "0.45", "ls": ":", "lw": 1.6}
LINK_STYLE = {"ls": ":", "lw": 1, "alpha": 0.7}  # the line between measured points: a guide, not a measurement
LINK_NOTE = "markers: measured lengths{};\ndotted: a guide between them (not across the window)"


def _link_note(variants: int) -> str:
    return LINK_NOTE.format(", dodged sideways" if variants > 1 else "")


# ---------------------------------------------------------------- shared pieces


def variant_styles(records: list[dict]) -> dict[str, dict]:
    """``{variant: {color, marker, ls, label}}``: one look per variant in every plot of a report."""
    variants = variants_of(records)
    styles = styles_for([BASELINE] * (BASELINE in variants) + [v for v in variants if v != BASELINE], BASELINE)
    return {v: {**st, "label": f"{v} (baseline)" if v == BASELINE else v} for v, st in styles.items()}


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def coincidences(series: dict[str, dict], describe) -> dict[str, str]:
    """``{variant: "= other at ..."}`` for every variant whose value at some x equals an earlier variant's there.

    *series* is ``{variant: {x: y}}`` in drawing order (a later variant is drawn over an earlier one and hides
    it where they are equal, so the later one's legend entry carries the note); ``describe(xs, all_xs)`` words
    a set of x values. Each point is attributed to the first earlier variant it equals.
    """
    notes = {}
    order = list(series)
    for i, v in enumerate(order):
        equal: dict[str, list] = defaultdict(list)
        for x, y in series[v].items():
            for w in order[:i]:
                if x in series[w] and _same(y, series[w][x]):
                    equal[w].append(x)
                    break
        if equal:
            notes[v] = "; ".join(f"= {w} {describe(xs, list(series[v]))}" for w, xs in equal.items())
    return notes


def _copies_earlier(series: dict[str, dict], v: str) -> bool:
    """Whether variant *v* equals an earlier variant of *series* at every x."""
    order = list(series)
    return any(series[w].keys() == series[v].keys() and all(_same(y, series[w][x]) for x, y in series[v].items())
               for w in order[:order.index(v)])


def _describe_lengths(xs, all_xs) -> str:
    if len(xs) == len(all_xs) > 1:
        return "at every length"
    return "at " + ", ".join(fmt_tokens(x, quantum=1) for x in sorted(xs))


def _describe_positions(orig):
    def describe(xs, all_xs) -> str:
        xs, all_xs = set(xs), sorted(all_xs)
        if xs == set(all_xs):
            return "at every position"
        if orig and xs == {x for x in all_xs if x > orig}:
            return f"beyond {fmt_tokens(orig, quantum=1)}"
        if orig and xs == {x for x in all_xs if x <= orig}:
            return f"inside {fmt_tokens(orig, quantum=1)}"
        runs: list[list[float]] = []  # consecutive buckets, worded as the token ranges they cover
        for i, x in enumerate(all_xs):
            if x in xs:
                if runs and all_xs.index(runs[-1][-1]) == i - 1:
                    runs[-1].append(x)
                else:
                    runs.append([x])
        if len(runs) > 3 or len(all_xs) < 2:
            return f"at {len(xs)} of {len(all_xs)} positions"
        half = (all_xs[1] - all_xs[0]) / 2
        return "over " + ", ".join(f"{fmt_tokens(r[0] - half, quantum=None)}–{fmt_tokens(r[-1] + half, quantum=None)}"
                                   for r in runs)

    return describe


def _label(style: dict, note: str | None) -> str:
    return f"{style['label']} ({note})" if note else style["label"]


def _dodge(xs_all: list[float], n: int, width: float = 0.8):
    """``dodge(i, x)``: the multiplicative offset (log axis) of the *i*-th of *n* variants at length *x*, spreading
    them over *width* of the gap to the nearest other length there (in octaves, at most one), centred on *x*: points
    at the same length stand side by side, and never reach a neighbouring length's."""
    xs = sorted(set(xs_all))
    near = {x: min([abs(math.log2(y / x)) for y in xs if y != x] + [1.0]) for x in xs}

    def dodge(i: int, x: float) -> float:
        gap = near.get(x, min(near.values(), default=1.0))
        return 2 ** ((i - (n - 1) / 2) * min(gap, 1.0) * width / max(n, 1))

    return dodge


def _spread(dodge, n: int, xs) -> float:
    """The largest outward offset factor of *dodge* over lengths *xs* (for the axis margins)."""
    return max((dodge(n - 1, x) for x in xs), default=1.0)


def _link(ax, lengths, xs, ys, color, orig) -> None:
    """Dotted guide lines between a variant's measured points, broken at the original window: behaviour
    changes there, so a line across it would read as a measurement nobody made."""
    segment: list[tuple] = []
    for i, (L, x, y) in enumerate(zip(lengths, xs, ys)):
        if segment and orig and lengths[i - 1] <= orig < L:
            if len(segment) > 1:
                ax.plot(*zip(*segment), color=color, gid="link", **LINK_STYLE)
            segment = []
        segment.append((x, y))
    if len(segment) > 1:
        ax.plot(*zip(*segment), color=color, gid="link", **LINK_STYLE)


def _log_y(ax) -> bool:
    """A log y axis labelled in plain numbers (10, 15, 20, 30), not powers of ten, when the values span a factor
    of 3 or more (a linear axis reads better below that); returns whether it is log."""
    lo, hi = ax.dataLim.y0, ax.dataLim.y1  # what was drawn, error bars included (the limits add margins below 0)
    if lo <= 0 or hi / lo < 3:
        return False
    lo, hi = lo / 1.08, hi * 1.08
    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    plain_log_axis(ax, "y", value_ticks(lo, hi))
    return True


def _window(ax, orig, handles: dict) -> None:
    if orig:
        line = ax.axvline(orig, gid="window", **WINDOW_STYLE)
        handles.setdefault(f"original window ({fmt_tokens(orig, quantum=1)} tokens)", line)


def _length_axis(ax, lengths, spread: float = 1.0) -> None:
    """Log-2 length axis with plain labels (2k, 4k, 8k, 12k, 16k): the measured lengths and enough powers of two
    between them for at least four ticks; *spread* (the largest dodge factor) widens the margins."""
    ax.set_xscale("log", base=2)
    measured = sorted(set(lengths))
    margin = (1.6 if len(measured) == 1 else 1.15) * spread
    lo, hi = measured[0] / margin, measured[-1] * margin
    ax.set_xlim(lo, hi)
    plain_log_axis(ax, "x", length_ticks(lo, hi, measured), fmt_tokens)


LENGTH_LABEL = "context length (tokens, log scale; markers at the measured lengths)"


def _position_axis(ax, length: int) -> None:
    """Token positions in k (1k = 1024), at most about ten ticks."""
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    step = 1024
    while length / step > 10:
        step *= 2
    if length >= step:
        ax.xaxis.set_major_locator(MultipleLocator(step))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: fmt_tokens(x, quantum=None)))
    ax.set_xlim(0, length)


def _outside_legend(fig, handles: dict, title: str | None = None) -> None:
    """One legend for the figure, right of the axes (``save`` crops with ``bbox_inches="tight"``)."""
    fig.legend(list(handles.values()), list(handles), loc="center left", bbox_to_anchor=(1.0, 0.5),
               fontsize=8, title=title, title_fontsize=8, alignment="left", frameon=False)


def _new_figure(figsize):
    from matplotlib.figure import Figure

    return Figure(figsize=figsize, layout="constrained")


# ---------------------------------------------------------------- the plots


CLOSE = 0.08  # curves closer than this fraction of the loss panel's height at every point read as one line


def _bucket_blocks(m: dict, bucket: dict, other: dict | None = None) -> list[float]:
    """The block losses inside *bucket* (minus *other*'s on the same blocks, for a paired difference)."""
    bs, blocks = m["block_size"], m["block_losses"]
    inside = [i for i in range(len(blocks)) if bucket["start"] <= i * bs + bs / 2 < bucket["end"]]
    if other is not None:
        return [blocks[i] - other["block_losses"][i] for i in inside]
    return [blocks[i] for i in inside]


def _band(ax, xs, band, st) -> None:
    """A 95 % band: a light fill with edges in the series' colour and line style, so overlapping bands stay apart."""
    lo, hi = [a for a, _ in band], [b for _, b in band]
    ax.fill_between(xs, lo, hi, color=st["color"], alpha=BAND_ALPHA, lw=0)
    for edge in (lo, hi):
        ax.plot(xs, edge, color=st["color"], ls=st["ls"], lw=0.7, alpha=0.55, gid="band")


def close_cluster(series: dict[str, dict], tolerance: float) -> tuple[str | None, list[str]]:
    """``(reference, members)``: the largest group of variants whose curves lie within *tolerance* of one
    reference variant's at every common x (the reference is the variant with the most such neighbours, the
    first on a tie); ``(None, [])`` when no two curves are that close."""
    def close(v, w):
        common = series[v].keys() & series[w].keys()
        return bool(common) and all(abs(series[v][x] - series[w][x]) <= tolerance for x in common)

    best, members = None, []
    for v in series:
        near = [w for w in series if w != v and close(v, w)]
        if len(near) > len(members):
            best, members = v, near
    return best, members


def loss_vs_position(records: list[dict]):
    """Loss by position in each variant's longest sequence of the first text, with a 95 % band per bucket
    (when the records carry block losses); markers dodged sideways inside their bucket. When some curves lie
    within :data:`CLOSE` of the panel's height of each other everywhere, a second panel shows their differences
    from one of them (paired on the same blocks, with 95 % bands), where the top panel cannot tell them apart."""
    ppl = perplexity_records(records)
    if not ppl:
        return None
    text = texts_of(ppl)[0]
    ppl = [r for r in ppl if text_of(r) == text]
    orig = original_of(records)
    styles = variant_styles(records)
    longest = {v: max((r for r in ppl if r["variant"] == v), key=lambda r: r["length"]) for v in variants_of(ppl)}
    lengths = {r["length"] for r in longest.values()}
    series = {v: {(b["start"] + b["end"]) / 2: b["loss"] for b in r["metrics"]["buckets"]} for v, r in longest.items()}
    notes = coincidences(series, _describe_positions(orig))
    values = [y for s in series.values() for y in s.values()]
    ref, cluster = close_cluster(series, CLOSE * (max(values) - min(values)))
    fig = _new_figure((8.5, 6.8 if ref else 4.5))
    if ref:
        ax, diff_ax = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    else:
        ax, diff_ax = fig.subplots(), None
    handles: dict = {}
    n = len(longest)
    for i, (v, r) in enumerate(longest.items()):
        st, m = styles[v], r["metrics"]
        width = min((b["end"] - b["start"] for b in m["buckets"]), default=0)
        shift = (i - (n - 1) / 2) * width * 0.5 / max(n, 1)  # inside the bucket the point stands for
        xs, ys = [x + shift for x in series[v]], list(series[v].values())
        label = _label(st, notes.get(v)) + ("" if len(lengths) == 1 else f", {fmt_tokens(r['length'], quantum=1)} tokens")
        hides = v in notes  # drawn over an equal variant: hollow and larger, so the one below shows through
        (line,) = ax.plot(xs, ys, color=st["color"], marker=st["marker"], ls=st["ls"], lw=1.3, ms=7 if hides else 4.5,
                          mfc="none" if hides else st["color"], mew=1.2, gid=v)
        handles[label] = line
        if "block_losses" in m and not _copies_earlier(series, v):  # an equal variant's band is drawn already
            _band(ax, xs, [bootstrap_mean_interval(_bucket_blocks(m, b) or [b["loss"]]) for b in m["buckets"]], st)
        if diff_ax is not None and v in [ref, *cluster]:
            base = longest[ref]["metrics"]
            dys = [y - series[ref][x] for x, y in series[v].items()]
            (dline,) = diff_ax.plot(xs, dys, color=st["color"], marker=st["marker"], ls=st["ls"], lw=1.3,
                                    ms=7 if hides else 4.5, mfc="none" if hides else st["color"], mew=1.2,
                                    gid=f"{v}:difference")
            paired = "block_losses" in m and "block_losses" in base and m["block_size"] == base["block_size"]
            if paired and v != ref and not _copies_earlier({w: series[w] for w in (ref, v)}, v):
                _band(diff_ax, xs, [bootstrap_mean_interval(_bucket_blocks(m, b, base) or [0.0])
                                    for b in m["buckets"]], st)
    _window(ax, orig, handles)
    _position_axis(ax, max(lengths))
    bands = " (95 % band)" if any("block_losses" in r["metrics"] for r in ppl) else ""
    ax.set_ylabel("mean next-token loss" + bands)
    size = f"{fmt_tokens(next(iter(lengths)), quantum=1)} tokens" if len(lengths) == 1 else "longest run of each variant"
    ax.set_title(f"Loss vs position ({size} of {text})")
    bottom = ax
    if diff_ax is not None:
        if orig:
            diff_ax.axvline(orig, gid="window", **WINDOW_STYLE)
        others = [v for v in longest if v not in (ref, *cluster)]
        diff_ax.set_ylabel(f"loss − {ref}" + (" (paired 95 % band)" if bands else ""))
        diff_ax.set_title(f"Curves the panel above cannot tell apart, as differences from {ref}"
                          + (f" ({', '.join(others)}: off this scale)" if others else ""), fontsize=9)
        bottom = diff_ax
    bottom.set_xlabel("token position (marker: mean loss over the bucket around it, dodged inside the bucket)")
    _outside_legend(fig, handles)
    _name_sources(fig, ppl)
    return fig


def perplexity_vs_length(records: list[dict]):
    """Perplexity at each measured length with 95 % error bars (when recorded), one panel per text."""
    ppl = perplexity_records(records)
    if not ppl:
        return None
    texts = texts_of(ppl)
    variants = variants_of(ppl)
    orig = original_of(records)
    styles = variant_styles(records)
    series = {v: {(text_of(r), r["length"]): r["metrics"]["ppl"] for r in ppl if r["variant"] == v} for v in variants}

    def describe(keys, all_keys) -> str:
        by_text = defaultdict(set)
        for t, L in keys:
            by_text[t].add(L)
        if len(texts) == 1 or len({frozenset(s) for s in by_text.values()}) == 1 and len(by_text) == len(texts):
            return _describe_lengths(next(iter(by_text.values())), {L for _, L in all_keys})
        return "; ".join(f"{t} {_describe_lengths(s, [])}" for t, s in by_text.items())

    notes = coincidences(series, describe)
    dodge = _dodge([r["length"] for r in ppl], len(variants))
    fig = _new_figure((1.5 + 5.2 * len(texts), 4.4))
    axes = fig.subplots(1, len(texts), squeeze=False)[0]
    variant_handles: dict = {}
    handles: dict = {}  # reference lines, listed after the variants
    for ax, t in zip(axes, texts):
        for i, v in enumerate(variants):
            pts = sorted((r["length"], r["metrics"]) for r in ppl if r["variant"] == v and text_of(r) == t)
            if not pts:
                continue
            st = styles[v]
            xs = [L * dodge(i, L) for L, _ in pts]
            ys = [m["ppl"] for _, m in pts]
            err = None
            if all("ppl_ci" in m for _, m in pts):
                # (records written before intervals were made to hold their estimate can miss it in the last bits)
                err = [[max(0.0, y - m["ppl_ci"][0]) for y, (_, m) in zip(ys, pts)],
                       [max(0.0, m["ppl_ci"][1] - y) for y, (_, m) in zip(ys, pts)]]
            _link(ax, [L for L, _ in pts], xs, ys, st["color"], orig)
            bars = ax.errorbar(xs, ys, yerr=err, color=st["color"], marker=st["marker"], ls="none", ms=6,
                               capsize=3, elinewidth=1, mfc="none" if v in notes else st["color"], mew=1.3)
            bars.lines[0].set_gid(v)  # the markers: what tests (and SVG readers) find a variant by
            variant_handles.setdefault(_label(st, notes.get(v)), bars)
        _window(ax, orig, handles)
        lengths = [r["length"] for r in ppl if text_of(r) == t]
        _length_axis(ax, lengths, _spread(dodge, len(variants), lengths))
        log = _log_y(ax)
        ax.set_xlabel(LENGTH_LABEL)
        says = [s for s, on in (("95 % interval", any("ppl_ci" in r["metrics"] for r in ppl)), ("log scale", log)) if on]
        ax.set_ylabel("perplexity" + (f" ({', '.join(says)})" if says else ""))
        ax.set_title(t)
    _outside_legend(fig, variant_handles | handles, title=_link_note(len(variants)))
    _name_sources(fig, ppl, [] if BASELINE in variants else
                  [f"no {BASELINE} (before) numbers in these records: each variant alone, no before/after"])
    return fig


def _name_sources(fig, records: list[dict], first: list[str] = ()) -> None:
    """The figure's title: *first*, then where records pooled from other eval folders came from."""
    heading = [*first, *_sources(records)]
    if heading:
        fig.suptitle("\n".join(heading), fontsize=9)


def _sources(records: list[dict]) -> list[str]:
    """"unpatched, yarn-x2 from eval/reports/smollm2-paper" for the records pooled from other eval folders
    (:func:`rope_extend.eval.runner.compare_records` marks them with their ``source``)."""
    by: dict[str, list] = defaultdict(list)
    for r in records:
        if r.get("source") and r["variant"] not in by[r["source"]]:
            by[r["source"]].append(r["variant"])
    return [f"{', '.join(vs)}: records of {src} (same cases)" for src, vs in by.items()]


def passkey_heatmap(records: list[dict]):
    """Accuracy per depth x length, each cell labelled k/n; a cell with no prompt reads "not run"."""
    pk = [r for r in records if r["kind"] == "passkey"]
    if not pk:
        return None
    variants = variants_of(pk)
    hays = list(dict.fromkeys(haystack_of(r) for r in pk))
    lengths = sorted({r["length"] for r in pk})
    depths = sorted({r["depth"] for r in pk})
    fig = _new_figure((2.4 + 2.6 * len(variants), 0.9 + len(hays) * (0.9 + 0.45 * max(len(depths), 3))))
    axes = fig.subplots(len(hays), len(variants), squeeze=False)
    im = None
    blank = False
    for ax, (h, v) in zip(axes.flat, [(h, v) for h in hays for v in variants]):
        grid = [[float("nan")] * len(lengths) for _ in depths]
        cell = defaultdict(list)
        for r in pk:
            if r["variant"] == v and haystack_of(r) == h:
                cell[(r["depth"], r["length"])].append(r["metrics"]["score"])
        for (d, L), s in cell.items():
            grid[depths.index(d)][lengths.index(L)] = sum(s) / len(s)
        ax.set_facecolor("0.93")
        im = ax.imshow(grid, vmin=0, vmax=1, cmap=HEATMAP_CMAP, aspect="auto", origin="upper")
        for di, d in enumerate(depths):
            for li, L in enumerate(lengths):
                s = cell.get((d, L))
                if s:
                    ax.text(li, di, f"{sum(s):g}/{len(s)}", ha="center", va="center", fontsize=8,
                            color=ink_on(sum(s) / len(s)))
                else:
                    blank = True
                    ax.text(li, di, "not run", ha="center", va="center", fontsize=7, color="0.4", style="italic")
        ax.set_xticks(range(len(lengths)), [fmt_tokens(L, quantum=1) for L in lengths], rotation=45)
        ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths] if v == variants[0] else [])
        ax.set_title(f"{v} ({h})", fontsize=9)
        ax.set_xlabel("length")
        if v == variants[0]:
            ax.set_ylabel("needle depth")
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="accuracy")
    _name_sources(fig, pk, ["Passkey retrieval: cells read found/prompts"
                            + ("; grey \"not run\": no prompt at that depth and length for that variant" if blank
                               else "")])
    return fig


def attention_entropy(records: list[dict]):
    """Mean attention entropy at each measured length."""
    ent = [r for r in records if r["kind"] == "entropy"]
    if not ent:
        return None
    variants = variants_of(ent)
    orig = original_of(records)
    styles = variant_styles(records)
    series = {v: {r["length"]: r["metrics"]["mean_entropy"] for r in ent if r["variant"] == v} for v in variants}
    notes = coincidences(series, _describe_lengths)
    dodge = _dodge([r["length"] for r in ent], len(variants))
    fig = _new_figure((6.5, 3.8))
    ax = fig.subplots()
    handles: dict = {}
    for i, v in enumerate(variants):
        st, pts = styles[v], sorted(series[v].items())
        xs, ys = [L * dodge(i, L) for L, _ in pts], [y for _, y in pts]
        _link(ax, [L for L, _ in pts], xs, ys, st["color"], orig)
        (dots,) = ax.plot(xs, ys, color=st["color"], marker=st["marker"], ls="none", ms=6,
                          mfc="none" if v in notes else st["color"], mew=1.3, gid=v)
        handles[_label(st, notes.get(v))] = dots
    _window(ax, orig, handles)
    lengths = [r["length"] for r in ent]
    _length_axis(ax, lengths, _spread(dodge, len(variants), lengths))
    ax.set_xlabel(LENGTH_LABEL)
    ax.set_ylabel("mean attention entropy (nats)")
    _outside_legend(fig, handles, title=_link_note(len(variants)))
    return fig


def retrieval_accuracy(records: list[dict]):
    """Accuracy vs length per retrieval task: 95 % Wilson bars from :data:`MIN_N_FOR_BARS` prompts on, the
    count ``k/n`` beside the point below that; the ceiling (the unpatched model at its longest length inside
    the window) as a dotted line."""
    recs = probe_records(records)
    if not recs:
        return None
    cells = probe_cells(recs)
    orig = original_of(records)
    styles = variant_styles(records)
    ceil = ceilings(records)
    tasks = list(dict.fromkeys(task_label(r) for r in recs))
    variants = variants_of(recs)
    fig = _new_figure((1.5 + 5.2 * len(tasks), 4.0))
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    variant_handles: dict = {}
    handles: dict = {}  # reference lines, listed after the variants
    for ax, t in zip(axes, tasks):
        lengths = sorted({L for (k, _, L) in cells if k == t})
        drawn = [v for v in variants if any(k == t and vv == v for (k, vv, _) in cells)]
        dodge = _dodge(lengths, len(drawn))
        for i, v in enumerate(drawn):
            st = styles[v]
            pts = sorted((L, accuracy(s.values()), sum(s.values())) for (k, vv, L), s in cells.items()
                         if k == t and vv == v)
            xs, ys = [L * dodge(i, L) for L, _, _ in pts], [a for _, (a, _, _, _), _ in pts]
            big = [n >= MIN_N_FOR_BARS for _, (_, _, _, n), _ in pts]
            err = [[(a - lo) if b else 0 for (_, (a, lo, _, _), _), b in zip(pts, big)],
                   [(hi - a) if b else 0 for (_, (a, _, hi, _), _), b in zip(pts, big)]]
            _link(ax, [L for L, _, _ in pts], xs, ys, st["color"], orig)
            bars = ax.errorbar(xs, ys, yerr=err if any(big) else None, color=st["color"], marker=st["marker"],
                               ls="none", ms=6, capsize=3, elinewidth=1, mew=1.3)
            bars.lines[0].set_gid(v)
            variant_handles.setdefault(st["label"], bars)
            for x, y, (_, (_, _, _, n), k), b in zip(xs, ys, pts, big):
                if not b:  # the count, above the point (below at the top of the axis)
                    ax.annotate(f"{k:g}/{n}", (x, y), xytext=(0, -11 if y > 0.9 else 7), textcoords="offset points",
                                ha="center", fontsize=6.5, color=st["color"])
        _window(ax, orig, handles)
        _length_axis(ax, lengths, _spread(dodge, len(drawn), lengths))
        c = ceil.get(t)
        ceiling = ""
        if c:  # drawn where it is read: beyond the window
            scores = [x for s in c["depths"].values() for x in s]
            line = ax.hlines(sum(scores) / len(scores), orig, ax.get_xlim()[1], gid="ceiling", **CEILING_STYLE)
            handles.setdefault("ceiling: unpatched at its longest length inside the window", line)
            ceiling = f"; ceiling {sum(scores):g}/{len(scores)} at {fmt_tokens(c['length'], quantum=1)}"
        ax.set_ylim(-0.1, 1.1)
        ns = sorted({len(s) for (k, _, _), s in cells.items() if k == t})
        small = ns[0] < MIN_N_FOR_BARS
        ax.set_title(f"{t}\nn = {'/'.join(map(str, ns))} prompts per point"
                     + (" (counts k/n shown)" if small else " (95 % Wilson bars)") + ceiling, fontsize=9)
        ax.set_xlabel(LENGTH_LABEL)
    axes[0].set_ylabel("accuracy (found / prompts)")
    _outside_legend(fig, variant_handles | handles, title=_link_note(len(variant_handles)))
    _name_sources(fig, recs)
    return fig


PLOTS = (  # (title, file, builder)
    ("Loss vs position", "loss_vs_position.png", loss_vs_position),
    ("Perplexity vs context length", "perplexity_vs_length.png", perplexity_vs_length),
    ("Passkey accuracy (depth × length)", "passkey_heatmap.png", passkey_heatmap),
    ("Attention entropy vs length", "attention_entropy.png", attention_entropy),
    ("Retrieval accuracy vs length", "retrieval_accuracy.png", retrieval_accuracy),
)


def make_plots(records: list[dict], out_dir, failed: dict | None = None) -> dict[str, str]:
    """Write the PNGs that have data into *out_dir*; returns ``{title: filename}`` (empty without matplotlib,
    an optional extra). A plot that fails is left out and its error put in *failed* (``{title: reason}``): the
    records and the report never depend on a drawing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return {}
    out = Path(out_dir)
    written = {}
    for title, name, build in PLOTS:
        try:
            fig = build(records)
            if fig is not None:
                fig.savefig(out / name, dpi=DPI, bbox_inches="tight")
                written[title] = name
        except Exception as exc:  # any drawing error: the report is still written, naming it
            if failed is None:
                raise
            failed[title] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    return written
