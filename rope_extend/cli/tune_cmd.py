"""`rope-extend tune`: search the RoPE scaling that gives the lowest loss beyond the window on your text."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from ..terminal import shell_path
from ..tune.options import TuneOptions
from .app import app, say
from .options import UnpatchedModel, options_flags

EXAMPLES = """Examples:

  rope-extend tune smollm2 --target-length 16384 -o tuned/

  rope-extend tune smollm2 --target-length 16384 --budget 12 --heldout licenses --passkey-samples 10 -o tuned/

  rope-extend tune ./my-model --target-length 32768 --text calib.txt --methods yarn,llama3 --device cuda -o tuned/

Rerunning the same command resumes from tuned/search.jsonl. The winner is tuned/best.yaml:
  rope-extend patch ./my-model --config tuned/best.yaml -o ./my-model-32k
"""


@app.command(name="tune", epilog=EXAMPLES)
@options_flags(options=TuneOptions)
def tune_command(
    model: UnpatchedModel,
    target_length: Annotated[int, typer.Option("--target-length", help="Context length to tune for (tokens).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder: search.jsonl, best.yaml, report.md, PNGs.")],
    methods: Annotated[str | None, typer.Option(help="Closed forms to search, comma-separated "
                                                     "(default: yarn, ntk-by-parts, llama3, ntk, linear).")] = None,
    options: TuneOptions = None,  # --dtype, --device, --device-map, --no-memory-check, --text, --budget, --knots, ...
) -> None:
    """Tune the RoPE scaling for a target length on calibration text: closed forms, then per-dimension factors."""
    from ..tune.runner import tune_model

    if methods:
        options = replace(options, methods=[m.strip() for m in methods.split(",")])
    result = tune_model(model, target_length, output, options)
    say(f"winner: {result.winner.candidate.name} (loss beyond the window {result.winner.loss:.4f})", hang="  ")
    say(f"spec: {shell_path(output / 'best.yaml')}   report: {shell_path(output / 'report.md')}", hang="  ")
