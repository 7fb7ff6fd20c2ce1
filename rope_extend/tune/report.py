"""The tune report: every candidate, objective vs evaluations, the chosen curve against the closed forms, and the
held-out table (perplexities with bootstrap intervals, passkey)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from ..eval.stats import Estimate, wilson_interval
from ..formatting import fmt_tokens
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


def _ci(estimate: Estimate) -> str:
    return f"{estimate.value:.3f} [{estimate.lo:.3f}, {estimate.hi:.3f}]"


def _pct(estimate: Estimate) -> str:
    return f"{100 * estimate.value:+.2f} % [{100 * estimate.lo:+.1f}, {100 * estimate.hi:+.1f}]"


def _passkey(r: dict) -> str:
    """Accuracy with its 95 % Wilson interval and k/n, as every eval report cell."""
    lo, hi = r["passkey_ci"]
    return f"{r['passkey']:.0%} [{lo:.0%}, {hi:.0%}] {r['passkey_k']:g}/{r['passkey_n']}"


def heldout_markdown(rows: list[dict], original: int, target: int, reference: str | None = None) -> str:
    if not rows:
        return ""
    inside = sorted({k for r in rows for k in r if k.startswith("inside_")}, key=lambda k: int(k.split("_")[1]))
    ref = reference or next((r["name"] for r in rows if r["name"].startswith("yarn x")), "reference")
    head = [
        "variant",
        f"ppl {fmt_tokens(original, quantum=0.5)}–{fmt_tokens(target, quantum=0.5)}",
        f"ppl 0–{fmt_tokens(target, quantum=0.5)}",
        *[f"ppl @{fmt_tokens(int(k.split('_')[1]), quantum=0.5)}" for k in inside],
        f"{fmt_tokens(original, quantum=0.5)}–{fmt_tokens(target, quantum=0.5)} vs {ref}",
        *[f"@{fmt_tokens(int(k.split('_')[1]), quantum=0.5)} vs unpatched" for k in inside],
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


def candidates_markdown(result) -> str:
    lines = ["| # | rung | length | candidate | family | loss beyond L | seconds |", "|---|---|---|---|---|---|---|"]
    for n, rec in enumerate(result.records, 1):
        lines.append(
            f"| {n} | {rec['rung']} | {rec['length']} | {rec['name']} | {rec['family']} | {rec['loss']:.4f} | "
            f"{rec['seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def plot_objective(result, path: Path) -> Path:
    from matplotlib.figure import Figure

    from ..plotstyle import styles_for

    fig = Figure(figsize=(9, 4.5), layout="constrained")
    ax = fig.subplots()
    groups = {}
    for n, r in enumerate(result.records, 1):
        if math.isfinite(r["loss"]):
            label = f"rung {r['rung']} ({result.rungs[r['rung']]} tok), {r['family']}"
            groups.setdefault(label, []).append((n, r["loss"]))
    styles = styles_for(sorted(groups))
    for label in sorted(groups):
        st = styles[label]
        ax.plot(*zip(*groups[label]), ls="none", marker=st["marker"], color=st["color"], ms=7, label=label, gid=label)
    ax.set(xlabel="evaluation #", ylabel=f"mean loss beyond {result.geometry.original_length}",
           title="tune: objective vs evaluations (each rung is a longer prefix)")
    fig.legend(fontsize=8, loc="outside right center", frameon=False)
    fig.savefig(path, dpi=110)
    return path


def curve_figure(result, config):
    """The chosen per-dimension factors and the tuned closed form against the closed forms at their defaults
    (`inspect`'s curves): inverse frequency and factor θ_i / θ'_i per disk, and each curve's attention factor.
    A curve whose factors equal an earlier curve's at every disk (YaRN's are NTK-by-parts'; a tuned closed form is
    often YaRN at its default) says so in the legend (``= yarn at every disk``) and is drawn hollow and larger;
    each curve's markers sit on its own disks, so curves drawn over each other all show."""
    from matplotlib.figure import Figure

    from ..inspect import method_curves
    from ..plotstyle import plain_log_axis, styles_for
    from .space import closed_form_factors

    geom = result.geometry
    original = default_inv_freq(geom.rotary_dim, geom.base).double()
    curves = {k: (v[0].double(), v[1]) for k, v in method_curves(config, geom.factor).items()}
    if result.best_closed is not None:
        f, a = closed_form_factors(geom, result.best_closed.candidate.spec)
        curves[f"tuned closed: {result.best_closed.candidate.name}"] = (original / f, a)
    if result.best_per_dim is not None:
        spec = result.best_per_dim.candidate.spec
        curves["tuned per-dim (long factors)"] = (original / torch.tensor(spec["long_factor"], dtype=torch.float64),
                                                  spec["attention_factor"])
    factors = {label: dict(enumerate((original / inv).tolist())) for label, (inv, _) in curves.items()}
    notes = {}  # whole curves hidden under an earlier one
    for k, label in enumerate(factors):
        same = next((w for w in list(factors)[:k] if all(math.isclose(y, factors[w][d], rel_tol=1e-6)
                                                         for d, y in factors[label].items())), None)
        if same:
            notes[label] = f"= {same} at every disk"
    styles = styles_for(curves, reference="original")
    fig = Figure(figsize=(16, 5.2), layout="constrained")
    ax_inv, ax_f, ax_a = fig.subplots(1, 3, width_ratios=(5, 5, 2))
    index = list(range(geom.n_freq))
    every = max(len(curves), 4)  # each curve's markers on its own disks: coinciding curves show every marker
    for k, (label, (inv, attn)) in enumerate(curves.items()):
        st, hides = styles[label], label in notes
        look = {"color": st["color"], "ls": st["ls"], "marker": st["marker"], "markevery": (k % every, every),
                "lw": 2.4 if label.startswith("tuned") else 1.4, "ms": 8 if hides else 5.5,
                "mfc": "none" if hides else st["color"], "mew": 1.4, "gid": label}
        name = label + (f" ({notes[label]})" if hides else "")
        ax_inv.plot(index, inv.numpy(), **look)
        ax_f.plot(index, list(factors[label].values()), label=name, **look)
        ax_a.barh(k, attn, color=st["color"], height=0.6, gid=label)
        ax_a.text(attn, k, f" {attn:.3f}", va="center", fontsize=8)
    ax_inv.set(yscale="log", xlabel="disk i (fast → slow)", ylabel="θ'_i (rad / token)", title="inverse frequency")
    values = [v for f in factors.values() for v in f.values()]
    ax_f.set(yscale="log", xlabel="disk i (fast → slow)", ylabel="θ_i / θ'_i (log scale)",
             title="per-dimension factor", ylim=(min(values) / 1.04, max(values) * 1.04))
    plain_log_axis(ax_f, "y")
    ax_a.set_yticks(range(len(curves)), list(curves), fontsize=8)
    ax_a.invert_yaxis()
    ax_a.set_xlim(min(a for _, a in curves.values()) * 0.97, max(a for _, a in curves.values()) * 1.03)
    ax_a.set(xlabel="attention factor", title="attention factor")
    fig.legend(*ax_f.get_legend_handles_labels(), fontsize=8, loc="outside lower center", ncols=3, frameon=False)
    fig.suptitle(f"rotary dim {geom.rotary_dim}, base {geom.base:g}, {geom.original_length} → {geom.target_length}")
    return fig


def plot_curve(result, config, path: Path) -> Path:
    curve_figure(result, config).savefig(path, dpi=110)
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
