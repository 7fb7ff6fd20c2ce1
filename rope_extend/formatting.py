"""How token counts are written in every report, table and plot: `fmt_tokens`, in thousands of 1024 tokens; and
elapsed times and ETAs in progress lines: `fmt_clock`.

One function, so a length reads the same in `report.md`, the tune report and the plots' labels; each place keeps how
fine its k steps are (`quantum`), which is what told the four copies this replaced apart.
"""

from __future__ import annotations


def fmt_tokens(n: float, quantum: float | None = 0.25) -> str:
    """A token count (or a position) in thousands of 1024 tokens: "2k" is 2048.

    quantum q: a count n >= 1024 that is a whole number of q·1024 tokens is written in k (q = 1, the eval report's
    tables: 2k, 12k; q = 0.5, the tune report: 1.5k; q = 0.25, the plots' length axes: 1.25k), any other count as it
    is (512, 3000; an int as its digits, a float with `:g`).
    quantum None: every n in k to 3 significant digits, 0 as "0" (the plots' position axes: 0.5k, 2.93k).
    """
    k = n / 1024
    if quantum is None:
        return f"{k:.3g}k" if n else "0"
    if n >= 1024 and abs(k / quantum - round(k / quantum)) < 1e-9:
        return f"{int(k)}k" if k == int(k) else f"{k:g}k"
    return str(n) if isinstance(n, int) else f"{n:g}"


def fmt_clock(seconds: float) -> str:
    """Seconds as ``h:mm:ss`` (progress lines' elapsed time and ETA)."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
