"""`rope-extend tune`: search the RoPE scaling that gives the lowest loss beyond the window on your text."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..terminal import shell_path
from .app import app, say

EXAMPLES = """Examples:

  rope-extend tune smollm2 --target-length 16384 -o tuned/

  rope-extend tune smollm2 --target-length 16384 --budget 12 --heldout licenses --passkey-samples 10 -o tuned/

  rope-extend tune ./my-model --target-length 32768 --text calib.txt --methods yarn,llama3 --device cuda -o tuned/

Rerunning the same command resumes from tuned/search.jsonl. The winner is tuned/best.yaml:
  rope-extend patch ./my-model --config tuned/best.yaml -o ./my-model-32k
"""


@app.command(name="tune", epilog=EXAMPLES)
def tune_command(
    model: Annotated[str, typer.Argument(help="Unpatched checkpoint folder, Hub id, or 'smollm2' (the demo model).")],
    target_length: Annotated[int, typer.Option("--target-length", help="Context length to tune for (tokens).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder: search.jsonl, best.yaml, report.md, PNGs.")],
    text: Annotated[str | None, typer.Option(help="Calibration text file (default: stdlib docs prose).")] = None,
    budget: Annotated[float, typer.Option(help="Search budget in target-length forwards (short screening "
                                                "forwards count as fractions).")] = 12.0,
    methods: Annotated[str | None, typer.Option(help="Closed forms to search, comma-separated "
                                                     "(default: yarn, ntk-by-parts, llama3, ntk, linear).")] = None,
    knots: Annotated[int, typer.Option(help="Knots of the per-dimension curve.")] = 6,
    heldout: Annotated[str | None, typer.Option(help="Held-out text file for the comparison table, or 'licenses' "
                                                     "(/usr/share/common-licenses). Never the calibration text.")] = None,
    passkey_samples: Annotated[int, typer.Option("--passkey-samples", help="Passkey prompts per variant at the "
                                                                          "target length (held-out only).")] = 0,
    dtype: Annotated[str, typer.Option(help="float32, bfloat16, float16.")] = "float32",
    device: Annotated[str | None, typer.Option(help="e.g. cuda (ignored with --device-map).")] = None,
    device_map: Annotated[str | None, typer.Option("--device-map", help="e.g. auto (accelerate).")] = None,
    no_resume: Annotated[bool, typer.Option("--no-resume", help="Start a fresh log instead of resuming.")] = False,
    no_plots: Annotated[bool, typer.Option("--no-plots")] = False,
    baselines_first: Annotated[bool, typer.Option("--baselines-first", help="Evaluate the held-out closed forms "
                                                  "at their defaults before the search (slow machines).")] = False,
    attention_factor: Annotated[float | None, typer.Option("--attention-factor", help="Pin the per-dimension "
                                "curves' attention factor (1 = inside the window exactly the original model; "
                                "default: searched).")] = None,
    no_memory_check: Annotated[bool, typer.Option("--no-memory-check", help="Load the model even if the memory "
                                                  "estimate says it does not fit.")] = False,
) -> None:
    """Tune the RoPE scaling for a target length on calibration text: closed forms, then per-dimension factors."""
    from ..tune.runner import tune_model

    if text is not None and heldout is not None and Path(text).resolve() == Path(heldout).resolve():
        raise ValueError(f"--heldout {heldout} is the calibration text; held-out numbers need a different text")
    summary = tune_model(
        model,
        target_length,
        output,
        text=text,
        heldout=heldout,
        budget=budget,
        methods=[m.strip() for m in methods.split(",")] if methods else None,
        knots=knots,
        passkey_samples=passkey_samples,
        dtype=dtype,
        device=device,
        device_map=device_map,
        resume=not no_resume,
        plots=not no_plots,
        baselines_first=baselines_first,
        attention_factor=attention_factor,
        memory_check=not no_memory_check,
    )
    say(f"winner: {summary['winner']} (loss beyond the window {summary['winner_loss']:.4f})", hang="  ")
    say(f"spec: {shell_path(output / 'best.yaml')}   report: {shell_path(output / 'report.md')}", hang="  ")
