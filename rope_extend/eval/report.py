"""Markdown report from evaluation records, every number with its uncertainty and sample size (plots: :mod:`.plots`).

Perplexity cells read ``ppl [lo, hi]`` (95 % block-bootstrap interval, computed when the record was written);
retrieval cells read ``acc [lo, hi] k/n`` (95 % Wilson interval); differences against the unpatched model are
paired (same text blocks, same prompts) and summarised in one generated sentence. A bootstrap from one unit (a
perplexity of one block, a difference of one pair) reads ``n = 1: no interval``. See :mod:`.stats`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

from ..formatting import fmt_tokens
from .stats import (
    NO_INTERVAL,
    Difference,
    block_sizes,
    interval_text,
    newcombe_paired_interval,
    paired_bootstrap_interval,
    significance_sentence,
    wilson_interval,
)
from .texts import DEFAULT_TEXT
from .variants import BASELINE, Window


def ci_note(records: list[dict]) -> str:
    """How the intervals in this report were computed (block size read from the records)."""
    sizes = sorted({r["metrics"]["block_size"] for r in perplexity_records(records) if "block_size" in r["metrics"]})
    blocks = "/".join(map(str, sizes)) or "128"
    old = sum("block_losses" not in r["metrics"] for r in perplexity_records(records))
    return (f"95 % intervals: perplexity from a bootstrap over contiguous {blocks}-token blocks of the same text "
            "(passages, not other texts: each text is reported on its own); accuracy from the Wilson score "
            "interval (k/n = prompts retrieved / prompts); differences are paired on the same blocks or prompts."
            + (f" {old} perplexity records predate block losses and have no interval (rerun to get one)." if old else ""))


def variants_of(records: list[dict]) -> list[str]:
    seen: list[str] = []
    for r in records:
        if r["variant"] not in seen:
            seen.append(r["variant"])
    if BASELINE in seen:
        seen.remove(BASELINE)
        seen.insert(0, BASELINE)
    return seen


def original_of(records: list[dict]) -> int | None:
    for r in records:
        if r.get("original_length"):
            return int(r["original_length"])
    return None


def len_label(n: int, orig: int | None) -> str:
    return fmt_tokens(n, quantum=1) + (" (beyond original)" if orig and n > orig else "")


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def perplexity_records(records):
    return [r for r in records if r["kind"] == "perplexity"]


def probe_records(records):
    return [r for r in records if r["kind"] not in ("perplexity", "entropy")]


def text_of(r: dict) -> str:
    return r["metrics"].get("text") or DEFAULT_TEXT


def texts_of(records: list[dict]) -> list[str]:
    out: list[str] = []
    for r in perplexity_records(records):
        if text_of(r) not in out:
            out.append(text_of(r))
    return out


def _ppl_cell(m: dict | None) -> str:
    if not m:
        return "–"
    if len(m.get("block_losses") or ()) == 1:  # one block: no interval (records before that carry [x, x])
        return f"{m['ppl']:.2f} ({NO_INTERVAL})"
    ci = m.get("ppl_ci")
    return f"{m['ppl']:.2f} {interval_text(*ci)}" if ci else f"{m['ppl']:.2f}"


# ---------------------------------------------------------------- retrieval cells


OLD_PROBE = "filler, old probe"  # records of the probe before the question's guard (needle could touch it)
FLAG_BELOW = 0.5  # a depth is flagged when the unpatched model inside its window retrieves less than this there


def haystack_of(r: dict) -> str:
    """The haystack a probe record was run on (records of the old probe format carry none)."""
    return r.get("haystack") or OLD_PROBE


def task_label(r: dict) -> str:
    """``task/haystack``: the unit retrieval is reported in (each haystack on its own, like the texts)."""
    return f"{r['kind']}/{haystack_of(r)}"


def probe_cells(records: list[dict]) -> dict[tuple, dict[str, float]]:
    """``{(task/haystack, variant, length): {case_id: score}}``."""
    cells: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in probe_records(records):
        cells[(task_label(r), r["variant"], r["length"])][r["case_id"]] = float(r["metrics"]["score"])
    return cells


def ceilings(records: list[dict]) -> dict[str, dict]:
    """Per ``task/haystack``: the unpatched model's retrieval at the largest length inside the original window
    (``{"length": L, "depths": {depth: [scores]}, "flagged": [depths whose format fails there]}``)."""
    orig = original_of(records)
    out: dict[str, dict] = {}
    if not orig:
        return out
    inside = [r for r in probe_records(records) if r["variant"] == BASELINE and r["length"] <= orig]
    for label in dict.fromkeys(task_label(r) for r in inside):
        recs = [r for r in inside if task_label(r) == label]
        L = max(r["length"] for r in recs)
        depths: dict = defaultdict(list)
        for r in recs:
            if r["length"] == L:
                depths[r["depth"]].append(float(r["metrics"]["score"]))
        flagged = [d for d, sc in depths.items() if sum(sc) / len(sc) < FLAG_BELOW]
        out[label] = {"length": L, "depths": dict(depths), "flagged": sorted(flagged, key=lambda d: (d is None, d))}
    return out


def _depth_label(d) -> str:
    return "–" if d is None else f"{d:.0%}"


def ceiling_table(records: list[dict]) -> str:
    """The unpatched model inside its window, per haystack and depth: k/n by length (the ceiling every
    beyond-window number reads against)."""
    orig = original_of(records)
    recs = [r for r in probe_records(records) if r["variant"] == BASELINE and orig and r["length"] <= orig]
    if not recs:
        return ""
    lengths = sorted({r["length"] for r in recs})
    by: dict = defaultdict(list)
    for r in recs:
        by[(task_label(r), r["depth"], r["length"])].append(float(r["metrics"]["score"]))
    rows = []
    for label in dict.fromkeys(task_label(r) for r in recs):
        depths = sorted({r["depth"] for r in recs if task_label(r) == label}, key=lambda d: (d is None, d))
        for d in depths + ["all"]:
            row = [label, "all depths" if d == "all" else _depth_label(d)]
            for L in lengths:
                sc = [x for (lb, dd, LL), v in by.items() if lb == label and LL == L and (d == "all" or dd == d)
                      for x in v]
                row.append(_acc_cell(sc) if d == "all" else (f"{sum(sc):g}/{len(sc)}" if sc else "–"))
            rows.append(row)
    return _table(["task/haystack", "depth"] + [fmt_tokens(L, quantum=1) for L in lengths], rows)


def beyond_window_table(records: list[dict]) -> str:
    """Every beyond-window retrieval cell next to its inside-window ceiling: accuracy over all depths and over
    the depths whose prompt format the unpatched model passes inside its window (flagged depths named)."""
    orig = original_of(records)
    recs = [r for r in probe_records(records) if orig and r["length"] > orig]
    if not recs:
        return ""
    ceil = ceilings(records)
    variants = variants_of(recs)
    rows = []
    for label in dict.fromkeys(task_label(r) for r in recs):
        c = ceil.get(label)
        for L in sorted({r["length"] for r in recs if task_label(r) == label}):
            if c is None:
                note, flagged = "not measured (run the unpatched model inside the window)", None
            else:
                allc = [x for v in c["depths"].values() for x in v]
                note = f"{fmt_tokens(c['length'], quantum=1)}: {sum(allc):g}/{len(allc)}"
                flagged = c["flagged"]
                note += "; flagged: " + (", ".join(_depth_label(d) for d in flagged) if flagged else "none")
            row = [label, fmt_tokens(L, quantum=1), note]
            for v in variants:
                sc = [r for r in recs if task_label(r) == label and r["length"] == L and r["variant"] == v]
                if not sc:
                    row.append("–")
                    continue
                cell = _acc_cell(float(r["metrics"]["score"]) for r in sc)
                if flagged:
                    ok = [float(r["metrics"]["score"]) for r in sc if r["depth"] not in flagged]
                    cell += f"; valid depths {_acc_cell(ok)}" if ok else "; no valid depth"
                row.append(cell)
            rows.append(row)
    return _table(["task/haystack", "length", "ceiling (unpatched inside the window)"] + variants, rows)


class Accuracy(NamedTuple):
    """A cell's accuracy: the mean score, its Wilson interval and the number of prompts."""

    mean: float
    lo: float
    hi: float
    n: int


def accuracy(scores) -> Accuracy:
    """(mean, Wilson lo, Wilson hi, n) of a cell's scores."""
    scores = list(scores)
    n = len(scores)
    lo, hi = wilson_interval(sum(scores), n)
    return Accuracy(sum(scores) / n if n else float("nan"), lo, hi, n)


def _acc_cell(scores) -> str:
    scores = list(scores)
    if not scores:
        return "–"
    a, lo, hi, n = accuracy(scores)
    k = sum(scores)
    count = f"{k:g}/{n}" if all(s in (0.0, 1.0) for s in scores) else f"n={n}"
    return f"{a:.2f} [{lo:.2f}, {hi:.2f}] {count}"


# ---------------------------------------------------------------- paired differences


def differences(records: list[dict], reference: str = BASELINE) -> list[Difference]:
    """Every variant vs *reference* on the same samples: loss per (text, length), accuracy per (task, length)."""
    out: list[Difference] = []
    ppl = {(r["variant"], text_of(r), r["length"]): r["metrics"] for r in perplexity_records(records)}
    for (v, text, L), m in ppl.items():
        ref = ppl.get((reference, text, L))
        if v == reference or ref is None or "block_losses" not in m or "block_losses" not in ref:
            continue
        if len(m["block_losses"]) != len(ref["block_losses"]):
            continue
        w = block_sizes(L - 1, m["block_size"], len(m["block_losses"]))
        est, lo, hi = paired_bootstrap_interval(m["block_losses"], ref["block_losses"], w)
        out.append(Difference(f"loss at {fmt_tokens(L, quantum=1)} on {text}", v, reference, est, lo, hi,
                              len(m["block_losses"]), lower_is_better=True))
    cells = probe_cells(records)
    for (task, v, L), scores in cells.items():
        ref = cells.get((task, reference, L))
        if v == reference or not ref:
            continue
        shared = sorted(set(scores) & set(ref))
        if not shared:
            continue
        a, b = [scores[c] for c in shared], [ref[c] for c in shared]
        if all(x in (0.0, 1.0) for x in a + b):
            est, lo, hi = newcombe_paired_interval(a, b)
        else:
            est, lo, hi = paired_bootstrap_interval(a, b)
        out.append(Difference(f"{task} accuracy at {fmt_tokens(L, quantum=1)}", v, reference, est, lo, hi, len(shared),
                              lower_is_better=False))
    return out


def differences_table(diffs: list[Difference]) -> str:
    if not diffs:
        return ""
    rows = [[d.what, d.variant, d.text(), str(d.n),
             ("**yes**, " + ("better" if d.better else "worse")) if d.significant else "no"]
            for d in diffs]
    return _table(["metric", "variant", "difference vs " + diffs[0].reference + " [95 % paired]", "pairs",
                   "significant"], rows)


# ---------------------------------------------------------------- tables


def entropy_table(records: list[dict]) -> str:
    """Mean attention entropy (nats, mean over layers) per length and variant."""
    recs = [r for r in records if r["kind"] == "entropy"]
    if not recs:
        return ""
    variants = variants_of(recs)
    by = {(r["variant"], r["length"]): r["metrics"]["mean_entropy"] for r in recs}
    rows = [[fmt_tokens(L, quantum=1)] + [f"{by[(v, L)]:.3f}" if (v, L) in by else "-" for v in variants]
            for L in sorted({r["length"] for r in recs})]
    return _table(["length"] + variants, rows)


def perplexity_table(records: list[dict], max_length: int | None = None, text: str | None = None) -> str:
    """Perplexity [95 % interval] by length, one table per text (or only *text*)."""
    recs = perplexity_records(records)
    if not recs:
        return ""
    variants = variants_of(recs)
    orig = original_of(recs)
    by = {(r["variant"], text_of(r), r["length"]): r["metrics"] for r in recs}
    parts = []
    for t in [text] if text else texts_of(recs):
        lengths = sorted({r["length"] for r in recs if text_of(r) == t and (max_length is None or r["length"] <= max_length)})
        rows = [[len_label(L, orig)] + [_ppl_cell(by.get((v, t, L))) for v in variants] for L in lengths]
        parts.append(f"Text `{t}`:\n\n" + _table(["length"] + variants, rows))
    return "\n\n".join(parts)


def position_table(records: list[dict]) -> str:
    recs = perplexity_records(records)
    if not recs:
        return ""
    text = texts_of(recs)[0]
    recs = [r for r in recs if text_of(r) == text]
    L = max(r["length"] for r in recs)
    variants = variants_of(recs)
    by = {r["variant"]: r["metrics"]["buckets"] for r in recs if r["length"] == L}
    spans = [(b["start"], b["end"]) for b in by.get(variants[0]) or next(iter(by.values()))]
    rows = []
    for a, b in spans:
        row = [f"{a}–{b}"]
        for v in variants:
            hit = [x for x in by.get(v, []) if x["start"] == a and x["end"] == b]
            row.append(f"{hit[0]['loss']:.3f}" if hit else "–")
        rows.append(row)
    return f"Mean next-token loss by position in the {fmt_tokens(L, quantum=1)}-token sequence of `{text}`:\n\n" + _table(
        ["positions"] + variants, rows
    )


def probe_table(records: list[dict], max_length: int | None = None) -> str:
    """Accuracy [95 % Wilson interval] and k/n per task, length and variant."""
    recs = probe_records(records)
    if not recs:
        return ""
    cells = probe_cells(recs)
    variants = variants_of(recs)
    orig = original_of(recs)
    kinds = list(dict.fromkeys(task_label(r) for r in recs))
    rows = []
    for k in kinds:
        for L in sorted({r["length"] for r in recs if task_label(r) == k}):
            if max_length is not None and L > max_length:
                continue
            rows.append([k, len_label(L, orig)] + [_acc_cell(cells.get((k, v, L), {}).values()) for v in variants])
    return _table(["task/haystack", "length"] + variants, rows)


def short_context_section(records: list[dict]) -> str:
    """Regression check inside the original window: metrics and change vs the unpatched model."""
    orig = original_of(records)
    if not orig:
        return ""
    parts = []
    ppl = [r for r in perplexity_records(records) if r["length"] <= orig]
    if ppl:
        variants = variants_of(ppl)
        by = {(r["variant"], text_of(r), r["length"]): r["metrics"] for r in ppl}
        rows = []
        for t in texts_of(ppl):
            for L in sorted({r["length"] for r in ppl if text_of(r) == t}):
                base = by.get((BASELINE, t, L))
                row = [t, fmt_tokens(L, quantum=1)]
                for v in variants:
                    m = by.get((v, t, L))
                    cell = _ppl_cell(m)
                    if m and base and v != BASELINE:
                        cell += f" ({100 * (m['ppl'] / base['ppl'] - 1):+.1f}%)"
                    row.append(cell)
                rows.append(row)
        parts.append("Perplexity [95 % interval] (change vs unpatched):\n\n" + _table(["text", "length"] + variants, rows))
    probes = probe_table(records, max_length=orig)
    if probes:
        parts.append("Retrieval accuracy [95 % Wilson interval]:\n\n" + probes)
    if not parts:
        return "_No cases inside the original window were evaluated._"
    return "\n\n".join(parts)


def summary_tables(records: list[dict]) -> str:
    """Compact markdown (perplexity, retrieval, differences) for model cards and the terminal."""
    orig = original_of(records)
    out = []
    if orig:
        out.append(f"Original context window: {orig} tokens. {ci_note(records)}")
    t = perplexity_table(records)
    if t:
        out.append("**Perplexity [95 % interval] by context length**\n\n" + t)
    t = probe_table(records)
    if t:
        out.append("**Retrieval accuracy [95 % interval] k/n (passkey / needle)**\n\n" + t)
    t = beyond_window_table(records)
    if t:
        out.append("**Retrieval beyond the window against the unpatched model's inside-window ceiling**\n\n" + t)
    t = entropy_table(records)
    if t:
        out.append("**Mean attention entropy (nats)**\n\n" + t)
    diffs = differences(records)
    if diffs:
        out.append(significance_sentence(diffs))
    return "\n\n".join(out) + "\n"


def smoke_banner(suite: str | None) -> str:
    """The banner of a smoke suite's numbers (report header and model card)."""
    return (f"> **Smoke test.** The `{suite}` suite checks that everything runs; its samples are too few to compare "
            "methods (see the intervals). Use the `paper` or `full` suite for evidence.")


def _header(meta: dict, records: list[dict]) -> list[str]:
    suite = meta.get("suite") or {}
    lines = []
    if suite.get("smoke"):
        lines += [smoke_banner(suite.get("name")), ""]
    lines.append(f"- model: `{meta.get('model_path')}`")
    window = Window(meta.get("original_length"), meta.get("pre_scaling_length"), meta.get("shipped_scheme"))
    lines.append(f"- original context window: {window.describe()}")
    lines.append(f"- suite: `{suite.get('name')}`" + (f" ({meta['suite_source']})" if meta.get("suite_source") else "")
                 + (f": {suite['description']}" if suite.get("description") else ""))
    lines.append(f"- dtype: {meta.get('dtype')}")
    if meta.get("engine"):
        lines.append(f"- engine: {meta['engine']}")
    for name, why in (meta.get("left_out") or {}).items():
        lines.append(f"- left out for {name}: {why}")
    expected = meta.get("expected_records")
    if expected and len(records) < expected:
        lines.append(f"- **partial run**: {len(records)} of {expected} cases finished (rerun the same command to resume)")
    lines += ["", "| variant | spec |", "|---|---|"]
    for v in meta.get("variants", []):
        spec = json.dumps(v["spec"], sort_keys=True) if v["spec"] else "(none)"
        lines.append(f"| {v['name']} | `{spec}` |")
    lines.append("")
    return lines


def write_report(records: list[dict], out_dir, images: dict | None = None, meta: dict | None = None,
                 failed_plots: dict | None = None) -> Path:
    """report.md in `out_dir`, linking `images` ({title: file name}, drawn by `plots.make_plots`) and naming the
    plots that could not be drawn (`failed_plots`: {title: reason})."""
    out = Path(out_dir)
    meta = meta or {}
    lines = ["# RoPE context-extension evaluation", ""]
    if meta:
        lines += _header(meta, records)
    lines += [ci_note(records), ""]
    diffs = differences(records)
    sections = [
        ("Short-context regression (inside the original window)", short_context_section(records)),
        ("Perplexity [95 % interval] by context length", perplexity_table(records)),
        ("Loss by position", position_table(records)),
        ("Passkey and needle retrieval: accuracy [95 % interval] k/n", probe_table(records)),
        ("Retrieval ceiling: the unpatched model inside its window, per depth (k/n)", ceiling_table(records)),
        ("Retrieval beyond the window, read against the ceiling (a depth is flagged when the unpatched model "
         f"retrieves under {FLAG_BELOW:.0%} of its prompts inside the window: its format fails there)",
         beyond_window_table(records)),
        ("Differences vs the unpatched model (paired, same samples)",
         (significance_sentence(diffs) + "\n\n" + differences_table(diffs)) if diffs else ""),
        ("Attention entropy (nats, mean over layers; grows with length, YaRN's temperature lowers it)",
         entropy_table(records)),
    ]
    for title, body in sections:
        if body:
            lines += [f"## {title}", "", body, ""]
    if images or failed_plots:
        lines += ["## Plots", ""]
        for title, name in (images or {}).items():
            lines += [f"![{title}]({name})", ""]
        for title, why in (failed_plots or {}).items():
            lines += [f"_{title}: not drawn ({why})._", ""]
    total = sum(r.get("seconds", 0) for r in records)
    lines.append(f"_{len(records)} cases, {total:.0f} s of compute._")
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
