"""The report's PNG plots: one builder per plot, each returning a matplotlib ``Figure`` (``None`` without data).

What a reader needs to trust a plot is drawn in, whatever the records hold:

- every variant is visible: it keeps one colour, marker and line style in every plot (colour-blind-safe, from
  :mod:`rope_extend.plotstyle`), and a variant whose numbers equal an earlier variant's says so in its legend
  entry (``dynamic-yarn-x2 (= unpatched at 2k, 8k; = yarn-x2 at 16k)``), found by comparing the numbers, not
  names (and drawn hollow and larger over the one it equals); curves too close to tell apart get a panel of their
  paired differences;
- markers sit at the measured values: their data coordinates are the measured length (or bucket centre) and
  number; variants at one x stand side by side, nudged in display space by at most :data:`NUDGE_REACH` marker
  sizes (:func:`nudge_points`): at the tick of the length they were measured at, on any axis;
- bands are light fills with edges in their variant's colour and line style, and the legend says so; length axes
  are log-2 with plain labels (2k, 4k, 8k), at least four of them;
- measured points are markers; the thin dotted lines between them only link a variant's points (nothing was
  measured in between, and the legend says so);
- the legend lists what is drawn, every line of it, reference lines too (the original window, the retrieval
  ceiling) and only where they fall inside the axes (a window beyond every measured length is said in the legend's
  title, not listed as a line); legends sit outside the axes, never over the data;
- several panels (texts, retrieval tasks) are laid out in a grid of at most :data:`GRID_COLUMNS` columns;
- retrieval points from fewer than :data:`MIN_N_FOR_BARS` prompts are labelled ``k/n`` instead of carrying a
  Wilson bar that spans most of [0, 1];
- a heatmap cell with no prompt reads "not run"; the colormap is cividis, never red-green;
- a plot without the unpatched model's numbers says so (no before/after), and records pooled from other eval
  folders (``rope-extend eval-report OUT --compare DIR``) are named with their folder.

Figures are built on :class:`matplotlib.figure.Figure`, not pyplot: building one (in a test, in a thread) leaves
no global state and nothing to close. A variant's markers carry its name as ``gid`` (reference lines: ``window``,
``ceiling``; guides: ``link``; band edges: ``band``; a difference panel's lines: ``<variant>:difference``),
which is how tests find what was drawn; their data are the measured values, the nudge is in their transform.
:func:`make_plots` writes the PNGs the report links.
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
MARKER_SIZE = 7.0  # points
POSITION_MARKER = 4.5  # the loss-by-position markers (many per curve): smaller
NUDGE_STEP = 0.55  # markers of several series at one x stand this many marker sizes apart ...
NUDGE_REACH = 1.0  # ... the outermost at most this many marker sizes from that x
GRID_COLUMNS = 2  # panels per row: a figure that stays readable embedded in a page
WINDOW_STYLE = {"color": "0.35", "ls": "--", "lw": 1, "zorder": 0.5}  # behind the points
CEILING_STYLE = {"color": "0.45", "ls": ":", "lw": 1.6}
LINK_STYLE = {"ls": ":", "lw": 1, "alpha": 0.7}  # the line between measured points: a guide, not a measurement
LINK_NOTE = "markers: at the measured lengths{};\ndotted: a guide between them (not across the window)"
BAND_LABEL = "a series' 95 % band: light fill between thin lines in its style"


def _link_note(variants: int) -> str:
    return LINK_NOTE.format(",\nside by side within a marker's width" if variants > 1 else "")


def nudge_points(i: int, n: int, size: float = MARKER_SIZE) -> float:
    """The sideways offset, in points, of the *i*-th of *n* series' markers at one x: :data:`NUDGE_STEP` marker
    sizes apart (closer when there are many), centred on x and never more than :data:`NUDGE_REACH` marker sizes
    from it: markers that coincide stand side by side, at the measured x within a marker's size."""
    if n < 2:
        return 0.0
    step = min(NUDGE_STEP * size, 2 * NUDGE_REACH * size / (n - 1))
    return (i - (n - 1) / 2) * step


def _nudged(ax, i: int, n: int, size: float = MARKER_SIZE):
    """The transform that draws data coordinates at :func:`nudge_points` of the *i*-th of *n* series (display
    space: the same on a log axis as on a linear one; the artists' data stay the measured values). Matplotlib
    does not count what such artists span in the axes' data limits: :func:`_claim` does."""
    from matplotlib.transforms import ScaledTranslation

    return ax.transData + ScaledTranslation(nudge_points(i, n, size) / 72, 0, ax.figure.dpi_scale_trans)


def _claim(ax, xs, *ys) -> None:
    """Count the points ``(xs, y)`` of every *ys* series in the axes' data limits and rescale (what a nudged
    artist spans: its markers, its bars' ends, its band's edges)."""
    points = [(x, y) for values in ys for x, y in zip(xs, values) if y is not None and not math.isnan(y)]
    if points:
        ax.update_datalim(points)
        ax.autoscale_view()


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


def _describe_panels(panels: list[str]):
    """Words for a set of ``(panel, length)`` keys: the lengths alone where every panel has the same ones, the
    lengths in each panel for a few panels, else how many of the points."""
    def describe(keys, all_keys) -> str:
        by_panel = defaultdict(set)
        for t, L in keys:
            by_panel[t].add(L)
        if len(panels) == 1 or len({frozenset(s) for s in by_panel.values()}) == 1 and len(by_panel) == len(panels):
            return _describe_lengths(next(iter(by_panel.values())), {L for _, L in all_keys})
        if len(by_panel) <= 2:
            return "; ".join(f"{_describe_lengths(s, [])} in {t}" for t, s in by_panel.items())
        return f"at {len(keys)} of its {len(all_keys)} points"

    return describe


def _label(style: dict, note: str | None) -> str:
    return f"{style['label']} ({note})" if note else style["label"]


def _link(ax, lengths, ys, color, orig, transform) -> None:
    """Dotted guide lines between a variant's measured points (drawn through its nudged markers), broken at the
    original window: behaviour changes there, so a line across it would read as a measurement nobody made."""
    segment: list[tuple] = []
    for i, (L, y) in enumerate(zip(lengths, ys)):
        if segment and orig and lengths[i - 1] <= orig < L:
            if len(segment) > 1:
                ax.plot(*zip(*segment), color=color, gid="link", transform=transform, **LINK_STYLE)
            segment = []
        segment.append((L, y))
    if len(segment) > 1:
        ax.plot(*zip(*segment), color=color, gid="link", transform=transform, **LINK_STYLE)


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


def _window(ax, orig, handles: dict) -> bool:
    """The original window as a dashed line (and its legend entry) where it falls inside the x limits (set them
    first); returns whether it was drawn."""
    lo, hi = sorted(ax.get_xlim())
    if not orig or not lo < orig < hi:
        return False
    line = ax.axvline(orig, gid="window", **WINDOW_STYLE)
    handles.setdefault(f"original window ({fmt_tokens(orig, quantum=1)} tokens)", line)
    return True


def _window_note(orig, drawn: bool, what: str = "length") -> str | None:
    """The legend title's line for a window no panel shows: every measured *what* lies inside it."""
    if not orig or drawn:
        return None
    return f"every {what} inside the original {fmt_tokens(orig, quantum=1)}-token window\n(not drawn: off this axis)"


def _title(*lines: str | None) -> str | None:
    return "\n".join(line for line in lines if line) or None


def _panels(fig, n: int):
    """*n* axes in a grid of at most :data:`GRID_COLUMNS` columns (the unused cells removed), row by row."""
    cols = min(n, GRID_COLUMNS)
    rows = -(-n // cols)
    grid = fig.subplots(rows, cols, squeeze=False)
    for ax in grid.flat[n:]:
        ax.remove()
    return list(grid.flat[:n])


def _grid_size(n: int, width: float, height: float) -> tuple[float, float]:
    """The figure size of :func:`_panels`' grid for *n* panels of *width* x *height* inches, plus the legend."""
    cols = min(n, GRID_COLUMNS)
    return 1.8 + width * cols, 0.4 + height * -(-n // cols)


def _length_axis(ax, lengths) -> None:
    """Log-2 length axis with plain labels (2k, 4k, 8k, 12k, 16k): the measured lengths and enough powers of two
    between them for at least four ticks."""
    ax.set_xscale("log", base=2)
    measured = sorted(set(lengths))
    margin = 1.6 if len(measured) == 1 else 1.15
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


LEGEND_COLUMNS = 52  # characters per legend line: a long note wraps instead of widening the figure


def _outside_legend(fig, handles: dict, title: str | None = None) -> None:
    """One legend for the figure, right of the axes (``save`` crops with ``bbox_inches="tight"``); labels wrapped
    at :data:`LEGEND_COLUMNS` characters, continuation lines indented."""
    import textwrap

    labels = ["\n".join(textwrap.wrap(label, LEGEND_COLUMNS, subsequent_indent="  ", break_on_hyphens=False))
              for label in handles]
    fig.legend(list(handles.values()), labels, loc="center left", bbox_to_anchor=(1.0, 0.5),
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


def _band(ax, xs, band, st, transform) -> bool:
    """A 95 % band: a light fill with edges in the series' colour and line style, so overlapping bands stay apart;
    a bucket without an interval (one block: ``(None, None)``) is a gap. Returns whether any of it was drawn."""
    lo = [math.nan if a is None else a for a, _ in band]
    hi = [math.nan if b is None else b for _, b in band]
    if all(math.isnan(a) for a in lo):
        return False
    ax.fill_between(xs, lo, hi, color=st["color"], alpha=BAND_ALPHA, lw=0, transform=transform)
    for edge in (lo, hi):
        ax.plot(xs, edge, color=st["color"], ls=st["ls"], lw=0.7, alpha=0.55, gid="band", transform=transform)
    _claim(ax, xs, lo, hi)
    return True


def _band_handle():
    """The legend's entry for the bands: a light fill between two thin lines, as drawn."""
    from matplotlib.patches import Patch

    return Patch(facecolor="0.5", alpha=2 * BAND_ALPHA, edgecolor="0.2", lw=0.7, ls="--")


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
    (when the records carry block losses and a bucket holds more than one block); each marker at its bucket's
    centre. When some curves lie within :data:`CLOSE` of the panel's height of each other everywhere, a second
    panel shows their differences from one of them (paired on the same blocks, with 95 % bands), where the top
    panel cannot tell them apart."""
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
    _position_axis(ax, max(lengths))
    handles: dict = {}
    banded = False
    n = len(longest)
    for i, (v, r) in enumerate(longest.items()):
        st, m = styles[v], r["metrics"]
        xs, ys = list(series[v]), list(series[v].values())
        label = _label(st, notes.get(v)) + ("" if len(lengths) == 1 else f", {fmt_tokens(r['length'], quantum=1)} tokens")
        hides = v in notes  # drawn over an equal variant: hollow and larger, so the one below shows through
        at = _nudged(ax, i, n, POSITION_MARKER)
        size = 1.5 * POSITION_MARKER if hides else POSITION_MARKER
        (line,) = ax.plot(xs, ys, color=st["color"], marker=st["marker"], ls=st["ls"], lw=1.3, ms=size,
                          mfc="none" if hides else st["color"], mew=1.2, gid=v, transform=at)
        handles[label] = line
        _claim(ax, xs, ys)
        if "block_losses" in m and not _copies_earlier(series, v):  # an equal variant's band is drawn already
            banded |= _band(ax, xs, [bootstrap_mean_interval(_bucket_blocks(m, b) or [b["loss"]])
                                     for b in m["buckets"]], st, at)
        if diff_ax is not None and v in [ref, *cluster]:
            base = longest[ref]["metrics"]
            dat = _nudged(diff_ax, i, n, POSITION_MARKER)
            dys = [y - series[ref][x] for x, y in series[v].items()]
            (dline,) = diff_ax.plot(xs, dys, color=st["color"], marker=st["marker"], ls=st["ls"], lw=1.3,
                                    ms=size, mfc="none" if hides else st["color"], mew=1.2,
                                    gid=f"{v}:difference", transform=dat)
            _claim(diff_ax, xs, dys)
            paired = "block_losses" in m and "block_losses" in base and m["block_size"] == base["block_size"]
            if paired and v != ref and not _copies_earlier({w: series[w] for w in (ref, v)}, v):
                banded |= _band(diff_ax, xs, [bootstrap_mean_interval(_bucket_blocks(m, b, base) or [0.0])
                                              for b in m["buckets"]], st, dat)
    drawn = _window(ax, orig, handles)
    if banded:
        handles[BAND_LABEL] = _band_handle()
    bands = " (95 % band)" if banded else ""
    ax.set_ylabel("mean next-token loss" + bands)
    size = f"{fmt_tokens(next(iter(lengths)), quantum=1)} tokens" if len(lengths) == 1 else "longest run of each variant"
    ax.set_title(f"Loss vs position ({size} of {text})")
    bottom = ax
    if diff_ax is not None:
        if drawn:
            diff_ax.axvline(orig, gid="window", **WINDOW_STYLE)
        others = [v for v in longest if v not in (ref, *cluster)]
        diff_ax.set_ylabel(f"loss − {ref}" + (" (paired 95 % band)" if bands else ""))
        diff_ax.set_title(f"Curves the panel above cannot tell apart, as differences from {ref}"
                          + (f" ({', '.join(others)}: off this scale)" if others else ""), fontsize=9)
        bottom = diff_ax
    bottom.set_xlabel("token position (marker: mean loss over the bucket around it, at its centre)")
    _outside_legend(fig, handles, title=_window_note(orig, drawn, "position"))
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

    notes = coincidences(series, _describe_panels(texts))
    fig = _new_figure(_grid_size(len(texts), 5.2, 4.2))
    axes = _panels(fig, len(texts))
    variant_handles: dict = {}
    handles: dict = {}  # reference lines, listed after the variants
    drawn = False
    for ax, t in zip(axes, texts):
        _length_axis(ax, [r["length"] for r in ppl if text_of(r) == t])
        for i, v in enumerate(variants):
            pts = sorted((r["length"], r["metrics"]) for r in ppl if r["variant"] == v and text_of(r) == t)
            if not pts:
                continue
            st, at = styles[v], _nudged(ax, i, len(variants))
            xs = [L for L, _ in pts]
            ys = [m["ppl"] for _, m in pts]
            err = None
            if all("ppl_ci" in m for _, m in pts):
                # (records written before intervals were made to hold their estimate can miss it in the last bits)
                err = [[max(0.0, y - m["ppl_ci"][0]) for y, (_, m) in zip(ys, pts)],
                       [max(0.0, m["ppl_ci"][1] - y) for y, (_, m) in zip(ys, pts)]]
            _link(ax, xs, ys, st["color"], orig, at)
            hides = v in notes
            bars = ax.errorbar(xs, ys, yerr=err, color=st["color"], marker=st["marker"], ls="none",
                               ms=MARKER_SIZE * (1.3 if hides else 1), capsize=3, elinewidth=1,
                               mfc="none" if hides else st["color"], mew=1.3, transform=at)
            bars.lines[0].set_gid(v)  # the markers: what tests (and SVG readers) find a variant by
            _claim(ax, xs, ys, *([[y - e for y, e in zip(ys, err[0])], [y + e for y, e in zip(ys, err[1])]]
                                 if err else []))
            variant_handles.setdefault(_label(st, notes.get(v)), bars)
        drawn |= _window(ax, orig, handles)
        log = _log_y(ax)
        ax.set_xlabel(LENGTH_LABEL)
        says = [s for s, on in (("95 % interval", any("ppl_ci" in r["metrics"] for r in ppl)), ("log scale", log)) if on]
        ax.set_ylabel("perplexity" + (f" ({', '.join(says)})" if says else ""))
        ax.set_title(t)
    _outside_legend(fig, variant_handles | handles, title=_title(_link_note(len(variants)), _window_note(orig, drawn)))
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
    fig = _new_figure((6.5, 3.8))
    ax = fig.subplots()
    _length_axis(ax, [r["length"] for r in ent])
    handles: dict = {}
    for i, v in enumerate(variants):
        st, pts, at = styles[v], sorted(series[v].items()), _nudged(ax, i, len(variants))
        xs, ys = [L for L, _ in pts], [y for _, y in pts]
        _link(ax, xs, ys, st["color"], orig, at)
        hides = v in notes
        (dots,) = ax.plot(xs, ys, color=st["color"], marker=st["marker"], ls="none",
                          ms=MARKER_SIZE * (1.3 if hides else 1), mfc="none" if hides else st["color"], mew=1.3,
                          gid=v, transform=at)
        handles[_label(st, notes.get(v))] = dots
        _claim(ax, xs, ys)
    drawn = _window(ax, orig, handles)
    ax.set_xlabel(LENGTH_LABEL)
    ax.set_ylabel("mean attention entropy (nats)")
    _outside_legend(fig, handles, title=_title(_link_note(len(variants)), _window_note(orig, drawn)))
    return fig


def _counts(ax, points: list[tuple[float, float, str, str]]) -> None:
    """The labels ``k/n`` beside points too small for a Wilson bar, above each point (below at the top of the
    axis): *points* are ``(x, y, label, colour)``; variants whose markers share an x, a y and a label share one
    label (in grey), so labels never pile on top of each other."""
    at: dict[tuple, list[str]] = defaultdict(list)
    for x, y, label, color in points:
        at[(x, y, label)].append(color)
    for (x, y, label), colors in at.items():
        ax.annotate(label, (x, y), xytext=(0, -11 if y > 0.9 else 7), textcoords="offset points", ha="center",
                    fontsize=6.5, color=colors[0] if len(colors) == 1 else "0.25")


def retrieval_accuracy(records: list[dict]):
    """Accuracy vs length per retrieval task, one panel per task in a grid: 95 % Wilson bars from
    :data:`MIN_N_FOR_BARS` prompts on, the count ``k/n`` beside the point below that; the ceiling (the unpatched
    model at its longest length inside the window) as a dotted line beyond the window, where the window is on the
    axis."""
    recs = probe_records(records)
    if not recs:
        return None
    cells = probe_cells(recs)
    orig = original_of(records)
    styles = variant_styles(records)
    ceil = ceilings(records)
    tasks = list(dict.fromkeys(task_label(r) for r in recs))
    variants = variants_of(recs)
    series = {v: {(k, L): accuracy(s.values())[0] for (k, vv, L), s in cells.items() if vv == v} for v in variants}
    notes = coincidences(series, _describe_panels(tasks))
    fig = _new_figure(_grid_size(len(tasks), 4.8, 3.6))
    axes = _panels(fig, len(tasks))
    variant_handles: dict = {}
    handles: dict = {}  # reference lines, listed after the variants
    drawn = False
    for ax, t in zip(axes, tasks):
        lengths = sorted({L for (k, _, L) in cells if k == t})
        _length_axis(ax, lengths)
        on = [v for v in variants if any(k == t and vv == v for (k, vv, _) in cells)]
        counts = []
        for i, v in enumerate(on):
            st, at = styles[v], _nudged(ax, i, len(on))
            pts = sorted((L, accuracy(s.values()), sum(s.values())) for (k, vv, L), s in cells.items()
                         if k == t and vv == v)
            xs, ys = [L for L, _, _ in pts], [a for _, (a, _, _, _), _ in pts]
            big = [n >= MIN_N_FOR_BARS for _, (_, _, _, n), _ in pts]
            err = [[(a - lo) if b else 0 for (_, (a, lo, _, _), _), b in zip(pts, big)],
                   [(hi - a) if b else 0 for (_, (a, _, hi, _), _), b in zip(pts, big)]]
            _link(ax, xs, ys, st["color"], orig, at)
            hides = v in notes  # drawn over an equal variant: hollow and larger, so the one below shows through
            bars = ax.errorbar(xs, ys, yerr=err if any(big) else None, color=st["color"], marker=st["marker"],
                               ls="none", ms=MARKER_SIZE * (1.3 if hides else 1), capsize=3, elinewidth=1, mew=1.3,
                               mfc="none" if hides else st["color"], transform=at)
            bars.lines[0].set_gid(v)
            _claim(ax, xs, ys)
            variant_handles.setdefault(_label(st, notes.get(v)), bars)
            counts += [(x, y, f"{k:g}/{n}", st["color"])
                       for x, y, (_, (_, _, _, n), k), b in zip(xs, ys, pts, big) if not b]
        _counts(ax, counts)
        window = _window(ax, orig, handles)
        drawn |= window
        c = ceil.get(t)
        ceiling = ""
        if c and window:  # drawn where it is read: beyond the window
            scores = [x for s in c["depths"].values() for x in s]
            line = ax.hlines(sum(scores) / len(scores), orig, ax.get_xlim()[1], gid="ceiling", **CEILING_STYLE)
            handles.setdefault("ceiling: unpatched at its longest length inside the window", line)
            ceiling = f"; ceiling {sum(scores):g}/{len(scores)} at {fmt_tokens(c['length'], quantum=1)}"
        ax.set_ylim(-0.1, 1.1)
        ns = sorted({len(s) for (k, _, _), s in cells.items() if k == t})
        small = ns[0] < MIN_N_FOR_BARS
        ax.set_title(f"{t}\nn = {'/'.join(map(str, ns))} prompts per point"
                     + (" (counts k/n shown)" if small else " (95 % Wilson bars)") + ceiling, fontsize=9)
        ax.set_xlabel(LENGTH_LABEL, fontsize=8)
        if axes.index(ax) % GRID_COLUMNS == 0:  # the grid's left column
            ax.set_ylabel("accuracy (found / prompts)")
    _outside_legend(fig, variant_handles | handles,
                    title=_title(_link_note(len(variant_handles)), _window_note(orig, drawn)))
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
