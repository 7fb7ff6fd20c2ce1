"""Markdown report and PNG plots from evaluation records."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from .variants import BASELINE


def _variants(records: list[dict]) -> list[str]:
    seen: list[str] = []
    for r in records:
        if r["variant"] not in seen:
            seen.append(r["variant"])
    if BASELINE in seen:
        seen.remove(BASELINE)
        seen.insert(0, BASELINE)
    return seen


def _orig(records: list[dict]) -> int | None:
    for r in records:
        if r.get("original_length"):
            return int(r["original_length"])
    return None


def _fmt_len(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _ppl_records(records):
    return [r for r in records if r["kind"] == "perplexity"]


def _probe_records(records):
    return [r for r in records if r["kind"] not in ("perplexity", "entropy")]


def entropy_table(records: list[dict]) -> str:
    """Mean attention entropy (nats, mean over layers) per length and variant."""
    recs = [r for r in records if r["kind"] == "entropy"]
    if not recs:
        return ""
    variants = _variants(recs)
    by = {(r["variant"], r["length"]): r["metrics"]["mean_entropy"] for r in recs}
    rows = [[_fmt_len(L)] + [f"{by[(v, L)]:.3f}" if (v, L) in by else "-" for v in variants]
            for L in sorted({r["length"] for r in recs})]
    return _table(["length"] + variants, rows)


def perplexity_table(records: list[dict], max_length: int | None = None) -> str:
    recs = _ppl_records(records)
    if not recs:
        return ""
    variants = _variants(recs)
    orig = _orig(recs)
    by = {(r["variant"], r["length"]): r["metrics"] for r in recs}
    lengths = sorted({r["length"] for r in recs if max_length is None or r["length"] <= max_length})
    rows = []
    for L in lengths:
        label = _fmt_len(L) + (" (beyond original)" if orig and L > orig else "")
        row = [label]
        for v in variants:
            m = by.get((v, L))
            row.append(f"{m['ppl']:.2f} ({m['loss']:.3f})" if m else "–")
        rows.append(row)
    return _table(["length"] + [f"{v} ppl (loss)" for v in variants], rows)


def position_table(records: list[dict]) -> str:
    recs = _ppl_records(records)
    if not recs:
        return ""
    L = max(r["length"] for r in recs)
    variants = _variants(recs)
    by = {r["variant"]: r["metrics"]["buckets"] for r in recs if r["length"] == L}
    spans = []
    for b in by.get(variants[0]) or next(iter(by.values())):
        spans.append((b["start"], b["end"]))
    rows = []
    for a, b in spans:
        row = [f"{a}–{b}"]
        for v in variants:
            hit = [x for x in by.get(v, []) if x["start"] == a and x["end"] == b]
            row.append(f"{hit[0]['loss']:.3f}" if hit else "–")
        rows.append(row)
    return f"Mean next-token loss by position in the {_fmt_len(L)}-token sequence:\n\n" + _table(
        ["positions"] + variants, rows
    )


def _probe_acc(records: list[dict]):
    acc = defaultdict(list)
    for r in _probe_records(records):
        acc[(r["kind"], r["variant"], r["length"])].append(float(r["metrics"]["score"]))
    return {k: sum(v) / len(v) for k, v in acc.items()}, {k: len(v) for k, v in acc.items()}


def probe_table(records: list[dict], max_length: int | None = None) -> str:
    recs = _probe_records(records)
    if not recs:
        return ""
    acc, n = _probe_acc(recs)
    variants = _variants(recs)
    orig = _orig(recs)
    kinds = []
    for r in recs:
        if r["kind"] not in kinds:
            kinds.append(r["kind"])
    rows = []
    for k in kinds:
        for L in sorted({r["length"] for r in recs if r["kind"] == k}):
            if max_length is not None and L > max_length:
                continue
            row = [k, _fmt_len(L) + (" (beyond original)" if orig and L > orig else "")]
            for v in variants:
                a = acc.get((k, v, L))
                row.append(f"{a:.2f} (n={n[(k, v, L)]})" if a is not None else "–")
            rows.append(row)
    return _table(["task", "length"] + variants, rows)


def short_context_section(records: list[dict]) -> str:
    """Regression check inside the original window: metrics and delta vs the unpatched model."""
    orig = _orig(records)
    if not orig:
        return ""
    parts = []
    ppl = [r for r in _ppl_records(records) if r["length"] <= orig]
    if ppl:
        variants = _variants(ppl)
        by = {(r["variant"], r["length"]): r["metrics"] for r in ppl}
        rows = []
        for L in sorted({r["length"] for r in ppl}):
            base = by.get((BASELINE, L))
            row = [_fmt_len(L)]
            for v in variants:
                m = by.get((v, L))
                if not m:
                    row.append("–")
                elif base and v != BASELINE:
                    row.append(f"{m['ppl']:.3f} ({100 * (m['ppl'] / base['ppl'] - 1):+.1f}%)")
                else:
                    row.append(f"{m['ppl']:.3f}")
            rows.append(row)
        parts.append("Perplexity (change vs unpatched):\n\n" + _table(["length"] + variants, rows))
    probes = probe_table(records, max_length=orig)
    if probes:
        parts.append("Retrieval accuracy:\n\n" + probes)
    if not parts:
        return "_No cases inside the original window were evaluated._"
    return "\n\n".join(parts)


def summary_tables(records: list[dict]) -> str:
    orig = _orig(records)
    out = []
    if orig:
        out.append(f"Original context window: {orig} tokens.")
    t = perplexity_table(records)
    if t:
        out.append("**Perplexity by context length**\n\n" + t)
    t = probe_table(records)
    if t:
        out.append("**Retrieval accuracy (passkey / needle)**\n\n" + t)
    t = entropy_table(records)
    if t:
        out.append("**Mean attention entropy (nats)**\n\n" + t)
    return "\n\n".join(out) + "\n"


def write_report(records: list[dict], out_dir, plots: bool = True, meta: dict | None = None) -> Path:
    out = Path(out_dir)
    images = make_plots(records, out) if plots else {}
    meta = meta or {}
    lines = ["# RoPE context-extension evaluation", ""]
    if meta:
        lines.append(f"- model: `{meta.get('model_path')}`")
        lines.append(f"- original context window: {meta.get('original_length')} tokens")
        suite = meta.get("suite") or {}
        lines.append(f"- suite: `{suite.get('name')}`" + (f" ({meta['suite_source']})" if meta.get("suite_source") else ""))
        lines.append(f"- dtype: {meta.get('dtype')}")
        lines.append("")
        lines.append("| variant | spec |")
        lines.append("|---|---|")
        for v in meta.get("variants", []):
            spec = json.dumps(v["spec"], sort_keys=True) if v["spec"] else "(none)"
            lines.append(f"| {v['name']} | `{spec}` |")
        lines.append("")
    sections = [
        ("Short-context regression (inside the original window)", short_context_section(records)),
        ("Perplexity by context length", perplexity_table(records)),
        ("Loss by position", position_table(records)),
        ("Passkey and needle retrieval", probe_table(records)),
        ("Attention entropy (nats, mean over layers; grows with length, YaRN's temperature lowers it)",
         entropy_table(records)),
    ]
    for title, body in sections:
        if body:
            lines += [f"## {title}", "", body, ""]
    if images:
        lines += ["## Plots", ""]
        for title, name in images.items():
            lines += [f"![{title}]({name})", ""]
    total = sum(r.get("seconds", 0) for r in records)
    lines.append(f"_{len(records)} cases, {total:.0f} s of compute._")
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def make_plots(records: list[dict], out_dir) -> dict[str, str]:
    """Write PNGs into *out_dir*; returns ``{title: filename}``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # matplotlib is an optional extra
        return {}
    out = Path(out_dir)
    orig = _orig(records)
    images: dict[str, str] = {}

    ppl = _ppl_records(records)
    if ppl:
        L = max(r["length"] for r in ppl)
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for v in _variants(ppl):
            rec = [r for r in ppl if r["variant"] == v and r["length"] == L]
            if not rec:
                continue
            b = rec[0]["metrics"]["buckets"]
            ax.plot([(x["start"] + x["end"]) / 2 for x in b], [x["loss"] for x in b], marker="o", ms=3, label=v)
        if orig:
            ax.axvline(orig, color="k", ls="--", lw=1, label=f"original window ({orig})")
        ax.set_xlabel("token position")
        ax.set_ylabel("mean next-token loss")
        ax.set_title(f"Loss vs position ({L} tokens)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "loss_vs_position.png", dpi=110)
        plt.close(fig)
        images["Loss vs position"] = "loss_vs_position.png"

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for v in _variants(ppl):
            pts = sorted((r["length"], r["metrics"]["ppl"]) for r in ppl if r["variant"] == v)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=v)
        if orig:
            ax.axvline(orig, color="k", ls="--", lw=1)
        ax.set_xscale("log", base=2)
        ticks = sorted({r["length"] for r in ppl})
        ax.set_xticks(ticks, [_fmt_len(L) for L in ticks])
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("perplexity")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "perplexity_vs_length.png", dpi=110)
        plt.close(fig)
        images["Perplexity vs context length"] = "perplexity_vs_length.png"

    pk = [r for r in records if r["kind"] == "passkey"]
    if pk:
        variants = _variants(pk)
        lengths = sorted({r["length"] for r in pk})
        depths = sorted({r["depth"] for r in pk})
        fig, axes = plt.subplots(1, len(variants), figsize=(2.2 + 2.6 * len(variants), 0.6 + 0.45 * max(len(depths), 3)),
                                 squeeze=False)
        im = None
        for ax, v in zip(axes[0], variants):
            grid = [[float("nan")] * len(lengths) for _ in depths]
            cell = defaultdict(list)
            for r in pk:
                if r["variant"] == v:
                    cell[(r["depth"], r["length"])].append(r["metrics"]["score"])
            for (d, L), s in cell.items():
                grid[depths.index(d)][lengths.index(L)] = sum(s) / len(s)
            im = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="upper")
            for (d, L), s in cell.items():
                ax.text(lengths.index(L), depths.index(d), f"{sum(s) / len(s):.2g}", ha="center", va="center",
                        fontsize=7)
            ax.set_xticks(range(len(lengths)), [_fmt_len(L) for L in lengths], rotation=45)
            ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths] if ax is axes[0][0] else [])
            ax.set_title(v, fontsize=9)
            ax.set_xlabel("length")
        axes[0][0].set_ylabel("needle depth")
        if im is not None:
            fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="accuracy")
        fig.savefig(out / "passkey_heatmap.png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        images["Passkey accuracy (depth × length)"] = "passkey_heatmap.png"

    ent = [r for r in records if r["kind"] == "entropy"]
    if ent:
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        for v in _variants(ent):
            pts = sorted((r["length"], r["metrics"]["mean_entropy"]) for r in ent if r["variant"] == v)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=v)
        if orig:
            ax.axvline(orig, color="k", ls="--", lw=1, label="original length")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length")
        ax.set_ylabel("mean attention entropy (nats)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "attention_entropy.png", dpi=110)
        plt.close(fig)
        images["Attention entropy vs length"] = "attention_entropy.png"

    nd = [r for r in records if r["kind"] not in ("perplexity", "passkey", "entropy")]
    if nd:
        acc, _ = _probe_acc(nd)
        tasks = []
        for r in nd:
            if r["kind"] not in tasks:
                tasks.append(r["kind"])
        fig, axes = plt.subplots(1, len(tasks), figsize=(1 + 3.6 * len(tasks), 3.6), squeeze=False)
        for ax, t in zip(axes[0], tasks):
            for v in _variants(nd):
                pts = sorted((L, a) for (k, vv, L), a in acc.items() if k == t and vv == v)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=v)
            if orig:
                ax.axvline(orig, color="k", ls="--", lw=1)
            ax.set_ylim(-0.05, 1.05)
            ax.set_xscale("log", base=2)
            ticks = sorted({L for (k, _, L) in acc if k == t})
            ax.set_xticks(ticks, [_fmt_len(L) for L in ticks])
            ax.minorticks_off()
            ax.set_title(t)
            ax.set_xlabel("context length")
        axes[0][0].set_ylabel("accuracy")
        axes[0][-1].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "needle_accuracy.png", dpi=110)
        plt.close(fig)
        images["Needle accuracy vs length"] = "needle_accuracy.png"
    return images
