"""The training part of a trained checkpoint's model card, its loss-curve plot and its log file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LOSS_PLOT = "training_loss.png"
LOG_FILE = "training_log.jsonl"
SUMMARY_FILE = "training.json"
EVAL_START, EVAL_END = "<!-- rope-extend train: before/after eval -->", "<!-- /rope-extend train: before/after eval -->"


def write_files(folder: Path, summary: dict[str, Any], history: list[dict]) -> None:
    """training.json (the summary), training_log.jsonl (one line per logged step) and the loss plot."""
    (folder / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    (folder / LOG_FILE).write_text("".join(json.dumps(row) + "\n" for row in history))
    losses = [(row["step"], row["loss"]) for row in history if "loss" in row]
    if losses:
        plot_loss(losses, folder / LOSS_PLOT, summary.get("title", "training loss"))


def smoothing_window(steps: int) -> int:
    """Steps per point of the smoothed loss: a tenth of the run, at least 3 (one step's loss moves with its batch)."""
    return max(3, steps // 10)


def plot_loss(points: list[tuple[int, float]], path: Path, title: str) -> None:
    loss_figure(points, title).savefig(path)


def loss_figure(points: list[tuple[int, float]], title: str):
    """Each step's loss, faint, and its trailing mean over :func:`smoothing_window` steps, bold: what the loss
    did, not one batch's luck."""
    from matplotlib.figure import Figure

    from ..plotstyle import PALETTE, smooth

    steps, losses = [p[0] for p in points], [p[1] for p in points]
    fig = Figure(figsize=(6.4, 3.7), dpi=100, layout="constrained")
    ax = fig.subplots()
    ax.plot(steps, losses, color=PALETTE[1], lw=0.9, alpha=0.6, marker="." if len(points) < 200 else None,
            ms=4, label="each step (one batch)", gid="step")
    k = smoothing_window(len(points))
    if len(points) > k:
        mean = smooth(losses, k)
        ax.plot(steps[k - 1:], mean[k - 1:], color="black", lw=2.2, label=f"mean of the last {k} steps",
                gid="smoothed")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/token)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.legend(fontsize=8, loc="outside lower center", ncols=2, frameon=False)  # never over the data
    return fig


def loss_line(summary: dict[str, Any]) -> str | None:
    """"first A -> last B (mean of the first / last k steps: C -> D)", or None when no loss was logged."""
    if summary.get("first_loss") is None:
        return None
    line = f"first {summary['first_loss']:.4f} -> last {summary['last_loss']:.4f}"
    if (m := summary.get("loss_means")) and m["steps"] > 1:
        line += f" (mean of the first / last {m['steps']} steps: {m['first']:.4f} -> {m['last']:.4f})"
    return line


def section(summary: dict[str, Any], eval_summary: str | None = None) -> str:
    """Markdown: recipe, data (names, token counts, hashes), steps, tokens, wall time, loss, eval."""
    r = summary["recipe"]
    rows = [
        ("method", f"{r['method']} x{r['factor']:g} ({r['original_length']} -> {r['target_length']} tokens)"),
        ("adaptation", "LoRA r={lora_r} alpha={lora_alpha} dropout={lora_dropout} on all linear layers but lm_head"
         "{extra}".format(**r, extra=", embeddings and norms trainable" if r["train_embeddings_and_norms"] else "")
         if r["lora"] else "full fine-tune"),
        ("window", f"{r['window']} tokens" + (f", PoSE positions spanning {r['target_length']}" if r["pose"]
                                               else " (the full target length)")),
        ("global batch", f"{r['global_windows']} windows = {r['global_windows'] * r['window']} tokens "
                         f"({_processes(r)} x {r['micro_batch']} x {r['accumulation']} accumulation)"),
        ("optimizer", f"AdamW lr {r['learning_rate']:g}, betas ({r['adam_beta1']}, {r['adam_beta2']}), weight decay "
                      f"{r['weight_decay']:g}, {r['warmup_steps']} warmup steps, {r['scheduler']} schedule"),
        ("steps", f"{summary['steps']} (seed {r['seed']})"),
        ("tokens trained", f"{summary['tokens_trained']:,}"),
        ("wall time", f"{summary['wall_seconds']:.1f} s ({summary['tokens_per_second']:.0f} tokens/s, "
                      f"{summary['device']})"),
        ("precision", summary.get("precision", "-")),
        ("processes", summary.get("processes", "-")),
        ("loss", loss_line(summary) or "-"),
    ]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    data = "\n".join(f"| `{s['name']}` | {s['documents']} | {s['chars']:,} | {s['tokens']:,} | `{s['sha256'][:16]}` |"
                     for s in summary["data"])
    text = f"""| | |
|---|---|
{table}

Data (documents are never packed across boundaries unmarked; BOS/EOS as the tokenizer defines them):

| source | documents | characters | tokens | sha256 (first 16) |
|---|---|---|---|---|
{data}

![training loss]({LOSS_PLOT})

`{SUMMARY_FILE}` holds these numbers, `{LOG_FILE}` the loss, learning rate and tokens/s of every logged step.
"""
    if eval_summary:
        text += f"\n### Before / after\n\n{eval_summary.rstrip()}\n"
    return text


def _processes(recipe: dict[str, Any]) -> str:
    n = recipe.get("sequence_parallel", 1)
    if n == 1:
        return f"{recipe['world_size']} process(es)"
    return f"{recipe['world_size'] // n} group(s) of {n} sequence-parallel processes, each holding 1/{n} of every window"


def replace_eval(readme: str, block: str) -> str:
    """The card with its eval block (between EVAL_START and EVAL_END) replaced by *block*."""
    start, end = readme.find(EVAL_START), readme.find(EVAL_END)
    if start < 0 or end < start:
        raise ValueError("the model card has no before/after eval block to replace (was it written by rope-extend train?)")
    return readme[:start] + block + readme[end + len(EVAL_END):]
