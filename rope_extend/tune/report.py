"""The tune report: every candidate, objective vs evaluations, the chosen curve against the closed forms, and the
held-out table (perplexities with bootstrap intervals, passkey)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from ..eval.stats import wilson_interval
from ..methods import default_inv_freq
from . import heldout as ho


def heldout_rows(records: list[dict[str, Any]], reference: str | None = None, n_boot: int = 2000) -> list[dict]:
    """One row per variant: perplexities with 95 % intervals; differences vs `reference` (default: YaRN at its
    default factor) beyond the window and vs the unpatched model inside it, paired over the same blocks."""
    by_name = {r["name"]: r for r in records}
    if reference is None:
        reference = next((n for n in by_name if n.startswith("yarn x")), None)
    ref = by_name.get(reference)
    base = by_name.get("unpatched")
    rows = []
    for rec in records:
        row: dict[str, Any] = {"name": rec["name"], "spec": rec["spec"], "shared_forward": rec.get("shared_forward")}
        for metric in [k for k in rec if k == "beyond" or k == "whole" or k.startswith("inside_")]:
            row[metric] = ho.ppl_interval(rec[metric], n_boot)
        if ref is not None:
            row["vs_reference_beyond"] = ho.relative_interval(rec["beyond"], ref["beyond"], n_boot)
        if base is not None:
            for metric in [k for k in rec if k.startswith("inside_")]:
                row[f"vs_unpatched_{metric}"] = ho.relative_interval(rec[metric], base[metric], n_boot)
        if "passkey" in rec:
            scores = rec["passkey"]["scores"]
            row["passkey"] = rec["passkey"]["accuracy"]
            row["passkey_n"] = len(scores)
            row["passkey_k"] = sum(scores)
            row["passkey_ci"] = wilson_interval(sum(scores), len(scores))
        rows.append(row)
    return rows


def _ci(t) -> str:
    return f"{t[0]:.3f} [{t[1]:.3f}, {t[2]:.3f}]"


def _pct(t) -> str:
    return f"{100 * t[0]:+.2f} % [{100 * t[1]:+.1f}, {100 * t[2]:+.1f}]"


def _passkey(r: dict) -> str:
    """Accuracy with its 95 % Wilson interval and k/n, as every eval report cell."""
    lo, hi = r["passkey_ci"]
    return f"{r['passkey']:.0%} [{lo:.0%}, {hi:.0%}] {r['passkey_k']:g}/{r['passkey_n']}"


def _len(n: int) -> str:
    return f"{n / 1024:g}k" if n >= 1024 and n % 512 == 0 else str(n)


def heldout_markdown(rows: list[dict], original: int, target: int, reference: str | None = None) -> str:
    if not rows:
        return ""
    inside = sorted({k for r in rows for k in r if k.startswith("inside_")}, key=lambda k: int(k.split("_")[1]))
    ref = reference or next((r["name"] for r in rows if r["name"].startswith("yarn x")), "reference")
    head = [
        "variant",
        f"ppl {_len(original)}–{_len(target)}",
        f"ppl 0–{_len(target)}",
        *[f"ppl @{_len(int(k.split('_')[1]))}" for k in inside],
        f"{_len(original)}–{_len(target)} vs {ref}",
        *[f"@{_len(int(k.split('_')[1]))} vs unpatched" for k in inside],
        "passkey",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["name"], _ci(r["beyond"]), _ci(r["whole"]), *[_ci(r[k]) for k in inside]]
        cells.append(_pct(r["vs_reference_beyond"]) if "vs_reference_beyond" in r else "")
        cells += [_pct(r[f"vs_unpatched_{k}"]) if f"vs_unpatched_{k}" in r else "" for k in inside]
        cells.append(_passkey(r) if "passkey" in r else "not run")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def heldout_table(path: str | Path, original: int, target: int) -> str:
    """The held-out table from a `heldout.jsonl` (also of a run still in progress)."""
    import json

    lines = Path(path).read_text().splitlines()[1:]
    records = [json.loads(line) for line in lines if line.strip()]
    return heldout_markdown(heldout_rows(records), original, target)


def candidates_markdown(result) -> str:
    lines = ["| # | rung | length | candidate | family | loss beyond L | seconds |", "|---|---|---|---|---|---|---|"]
    for n, rec in enumerate(result.records, 1):
        lines.append(
            f"| {n} | {rec['rung']} | {rec['length']} | {rec['name']} | {rec['family']} | {rec['loss']:.4f} | "
            f"{rec['seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def plot_objective(result, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for rung, length in enumerate(result.rungs):
        pts = [(n, r["loss"]) for n, r in enumerate(result.records, 1) if r["rung"] == rung and math.isfinite(r["loss"])]
        for family, marker in (("closed", "o"), ("per-dim", "^")):
            fam = [(n, loss) for (n, loss), r in zip(pts, [result.records[n - 1] for n, _ in pts]) if r["family"] == family]
            if fam:
                ax.scatter(*zip(*fam), marker=marker, label=f"rung {rung} ({length} tok), {family}", s=22)
    ax.set(xlabel="evaluation #", ylabel=f"mean loss beyond {result.geometry.original_length}",
           title="tune: objective vs evaluations (each rung is a longer prefix)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_curve(result, config, path: Path) -> Path:
    """The chosen per-dimension factors and the tuned closed form against the closed forms at their defaults
    (`inspect`'s curves), as inverse frequency per disk and as factor θ_i / θ'_i."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..inspect import method_curves
    from .space import closed_form_factors

    geom = result.geometry
    original = default_inv_freq(geom.rotary_dim, geom.base).double()
    curves = {k: (v[0].double(), v[1]) for k, v in method_curves(config, geom.factor).items()}
    tuned = {}
    if result.best_closed is not None:
        f, a = closed_form_factors(geom, result.best_closed.candidate.spec)
        tuned[f"tuned closed: {result.best_closed.candidate.name}"] = (original / f, a)
    if result.best_per_dim is not None:
        spec = result.best_per_dim.candidate.spec
        tuned["tuned per-dim (long factors)"] = (original / torch.tensor(spec["long_factor"], dtype=torch.float64),
                                                 spec["attention_factor"])
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8))
    index = range(geom.n_freq)
    for label, (inv, attn) in {**curves, **tuned}.items():
        style = {"linewidth": 2.6 if label.startswith("tuned") else 1.3,
                 "linestyle": "-" if label.startswith("tuned") else "--"}
        name = label if attn == 1.0 else f"{label} (attn x{attn:.3f})"
        axes[0].plot(index, inv.numpy(), label=name, **style)
        axes[1].plot(index, (original / inv).numpy(), label=name, **style)
    axes[0].set(yscale="log", xlabel="disk i (fast → slow)", ylabel="θ'_i (rad / token)", title="inverse frequency")
    axes[1].set(yscale="log", xlabel="disk i (fast → slow)", ylabel="θ_i / θ'_i", title="per-dimension factor")
    axes[1].legend(fontsize=7)
    fig.suptitle(f"rotary dim {geom.rotary_dim}, base {geom.base:g}, {geom.original_length} → {geom.target_length}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(output: Path, result, records: list[dict] | None, config, plots: bool = True) -> dict[str, Any]:
    geom = result.geometry
    lines = [
        f"# rope-extend tune: {geom.original_length} → {geom.target_length}",
        "",
        f"Budget {result.budget:g} target-length forwards; spent {result.spent:.2f} in {len(result.records)} "
        f"evaluations; rungs {result.rungs} with {result.schedule} candidates; search time {result.seconds:.0f} s "
        "(this invocation).",
        "",
        f"- winner: **{result.winner.candidate.name}** (loss beyond L at {result.winner.length}: {result.winner.loss:.4f})",
    ]
    if result.best_closed:
        lines.append(f"- best closed form: {result.best_closed.candidate.name} ({result.best_closed.loss:.4f} at "
                     f"{result.best_closed.length})")
    if result.best_per_dim:
        lines.append(f"- best per-dimension curve: {result.best_per_dim.candidate.name} ({result.best_per_dim.loss:.4f} "
                     f"at {result.best_per_dim.length})")
    summary: dict[str, Any] = {
        "winner": result.winner.candidate.name,
        "winner_loss": result.winner.loss,
        "spent": result.spent,
        "evaluations": len(result.records),
    }
    if plots:
        plot_objective(result, output / "objective.png")
        plot_curve(result, config, output / "curve.png")
        lines += ["", "![objective](objective.png)", "", "![curve](curve.png)"]
    if records:
        rows = heldout_rows(records)
        lines += ["", "## Held-out comparison", "", heldout_markdown(rows, geom.original_length, geom.target_length)]
        summary["heldout"] = [
            {k: v for k, v in r.items() if k != "spec"} for r in rows
        ]
    lines += ["", "## Every candidate", "", candidates_markdown(result)]
    (output / "report.md").write_text("\n".join(lines) + "\n")
    return summary
