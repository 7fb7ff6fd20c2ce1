"""`rope-extend eval`: the unpatched model and each spec side by side on a benchmark suite."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .app import app, out

EXAMPLES = """Examples:

  rope-extend eval smollm2 --spec configs/smollm2-yarn-x2.yaml --spec configs/dynamic-yarn.yaml -o report/

  rope-extend eval ./my-model --spec configs/yarn-x8.yaml --suite eval/suites/full.yaml --device-map auto -o report/

  rope-extend eval ./my-model --spec method=ntk,factor=2 --spec method=linear,factor=2 -o report/
"""


def parse_spec_arg(text: str):
    """A YAML path, or an inline spec 'method=yarn,factor=2'."""
    from ..eval.__main__ import parse_spec

    return parse_spec(text)


@app.command(name="eval", epilog=EXAMPLES)
def eval_command(
    model: Annotated[str, typer.Argument(help="Unpatched checkpoint folder, Hub id, or 'smollm2' (the demo model).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Report folder (results.jsonl, report.md, PNGs).")],
    specs: Annotated[list[str] | None, typer.Option("--spec", help="Spec YAML or inline method=...,factor=... (repeatable).")] = None,
    suite: Annotated[str, typer.Option(help="quick, full, smoke, or a suite YAML path.")] = "quick",
    text: Annotated[Path | None, typer.Option(help="Text file for perplexity (default: stdlib docs prose).")] = None,
    dtype: Annotated[str, typer.Option(help="float32, bfloat16, float16.")] = "float32",
    device_map: Annotated[str | None, typer.Option("--device-map", help="e.g. auto (accelerate) for models larger than one device.")] = None,
    device: Annotated[str | None, typer.Option(help="e.g. cuda (ignored with --device-map).")] = None,
    no_baseline: Annotated[bool, typer.Option("--no-baseline", help="Skip the unpatched model.")] = False,
    no_resume: Annotated[bool, typer.Option("--no-resume", help="Start a fresh results.jsonl instead of resuming.")] = False,
    no_plots: Annotated[bool, typer.Option("--no-plots")] = False,
) -> None:
    """Evaluate before/after: perplexity by length, passkey, needles, short-context regression; resumable."""
    from ..eval.runner import run_eval, summary_markdown

    if model == "smollm2":
        from ..demo_model import smollm2_path

        model = str(smollm2_path())
    records = run_eval(
        model,
        [parse_spec_arg(s) for s in specs or []],
        suite,
        output,
        dtype=dtype,
        device_map=device_map,
        device=device,
        text=text,
        include_baseline=not no_baseline,
        resume=not no_resume,
        plots=not no_plots,
    )
    out.print(summary_markdown(records), markup=False, highlight=False)
    out.print(f"report: {output / 'report.md'}")
