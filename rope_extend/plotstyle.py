"""The look every rope-extend plot shares, so a reader can tell each series apart in any of them.

- one (colour, marker, line style) per series, all three different from every other series': colours from the
  Okabe-Ito palette (distinguishable with the common colour-vision deficiencies, and in greyscale with the markers
  and line styles), black reserved for the reference series (the unpatched model, the original curve);
- heatmaps in a perceptually uniform, colour-blind-safe colormap (:data:`HEATMAP_CMAP`), never red-green;
- log axes ticked in plain numbers (``2k, 4k, 8k``; ``1, 1.25, 1.5, 2``), at least :data:`MIN_TICKS` of them.

Pure helpers on matplotlib Axes; nothing here draws a figure of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

# Okabe & Ito (2008), "Color Universal Design", without black (the reference series') and with yellow, the one
# that reads worst on white, last
PALETTE = ("#E69F00", "#56B4E9", "#009E73", "#D55E00", "#CC79A7", "#0072B2", "#F0E442")
MARKERS = ("s", "^", "D", "v", "P", "X", "<", ">", "p", "h")
DASHES = ("--", "-.", (0, (1, 1.5)), (0, (5, 1.5, 1, 1.5, 1, 1.5)), (0, (8, 2)), (0, (3, 1, 1, 1, 1, 1)),
          (0, (1, 3)))  # never solid: that is the reference's
REFERENCE = {"color": "black", "marker": "o", "ls": "-"}
HEATMAP_CMAP = "cividis"  # blue to yellow: readable with red-green colour blindness and in greyscale
COLORBLIND_SAFE_CMAPS = frozenset({"cividis", "viridis"})
MIN_TICKS = 4
BAND_ALPHA = 0.12  # a 95 % band's fill; its edges are drawn in the series' colour and line style


def series_style(i: int) -> dict:
    """``{color, marker, ls}`` of the *i*-th series after the reference: the first 7 differ from each other in all
    three, and no two of the first 70 share all three (7 colours and line styles, 10 markers)."""
    return {"color": PALETTE[i % len(PALETTE)], "marker": MARKERS[i % len(MARKERS)], "ls": DASHES[i % len(DASHES)]}


def styles_for(names: Iterable[str], reference: str | None = None) -> dict[str, dict]:
    """``{name: {color, marker, ls}}``: *reference* (when among *names*) in black, the others in order."""
    out, i = {}, 0
    for name in names:
        if name == reference:
            out[name] = dict(REFERENCE)
        else:
            out[name] = series_style(i)
            i += 1
    return out


def ink_on(value: float, cmap: str = HEATMAP_CMAP) -> str:
    """Black or white, whichever reads on the colormap's colour at *value* (in [0, 1])."""
    from matplotlib import colormaps

    r, g, b, _ = colormaps[cmap](min(max(value, 0.0), 1.0))
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.45 else "white"


def length_ticks(lo: float, hi: float, measured: Iterable[float] = (), min_ticks: int = MIN_TICKS) -> list[float]:
    """Ticks for a log-2 token-length axis spanning [lo, hi]: the measured lengths and the powers of two, then
    1.5 x and 1.25 / 1.75 x powers of two until there are *min_ticks*."""
    ticks = {float(m) for m in measured if lo <= m <= hi}
    for mantissas in ((1.0,), (1.5,), (1.25, 1.75)):
        for k in range(math.floor(math.log2(lo)) - 1, math.ceil(math.log2(hi)) + 1):
            ticks |= {m * 2.0**k for m in mantissas if lo <= m * 2.0**k <= hi}
        if len(ticks) >= min_ticks:
            break
    return sorted(ticks)


def value_ticks(lo: float, hi: float, min_ticks: int = MIN_TICKS) -> list[float]:
    """Plain ticks for a log axis spanning [lo, hi] (lo > 0): 1-2-5 per decade, finer until there are *min_ticks*;
    then finer ticks near an end left more than a factor 1.5 from its nearest tick (so a cluster of values at
    one end still has a number beside it)."""
    sets = ((1, 2, 5), (1, 1.5, 2, 3, 5, 7), (1, 1.25, 1.5, 1.75, 2, 2.5, 3, 4, 5, 6, 7, 8, 9),
            [1 + i / 20 for i in range(180)])

    def of(mantissas) -> list[float]:
        ticks = [m * 10.0**k for k in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
                 for m in mantissas]
        return sorted({round(t, 12) for t in ticks if lo <= t <= hi})

    n = next((i for i, mantissas in enumerate(sets) if len(of(mantissas)) >= min_ticks), len(sets) - 1)
    ticks, finer = of(sets[n]), of(sets[min(n + 1, len(sets) - 1)])
    if ticks and ticks[0] / lo > 1.5:
        ticks = [t for t in finer if t < ticks[0]][-1:] + ticks
    if ticks and hi / ticks[-1] > 1.5:
        ticks = ticks + [t for t in finer if t > ticks[-1]][:1]
    return ticks


def plain_log_axis(ax, axis: str = "x", ticks: list[float] | None = None,
                   fmt: Callable[[float], str] = lambda v: f"{v:g}") -> None:
    """Put *ticks* (default: :func:`value_ticks` over the current limits) on a log *axis*, labelled by *fmt*,
    with no minor labels."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    which = ax.xaxis if axis == "x" else ax.yaxis
    lo, hi = sorted(ax.get_xlim() if axis == "x" else ax.get_ylim())
    ticks = value_ticks(lo, hi) if ticks is None else ticks
    which.set_major_locator(FixedLocator(ticks))
    which.set_major_formatter(FuncFormatter(lambda v, _: fmt(v)))
    which.set_minor_locator(NullLocator())
    which.set_minor_formatter(NullFormatter())


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over *window* points (fewer at the start): what the loss did, not one batch's luck."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out
