"""`rope-extend eval` (before/after on a suite), `rope-extend demo` and `rope-extend eval-tasks` (lm-eval data).

These are the only parsers for the evaluation front ends (``python -m rope_extend.eval`` calls `eval`; `make demo`
calls `demo`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..terminal import shell_path
from .app import app, say, say_markdown

EXAMPLES = """Examples:

  rope-extend eval smollm2 --spec configs/smollm2-yarn-x2.yaml --spec configs/dynamic-yarn.yaml -o report/

  rope-extend eval ./my-model --spec configs/yarn-x8.yaml --suite eval/suites/full.yaml --device-map auto -o report/

  rope-extend eval smollm2 --suite paper --interleave -o report/ --spec method=yarn,factor=2 --spec method=ntk,factor=2

  rope-extend eval out/smollm2-16k --name "trained yarn-x2" --suite paper -o report-trained/

  rope-extend eval smollm2 --engine vllm --spec method=yarn,factor=2 -o report-vllm/
  rope-extend eval smollm2 --engine sglang --spec method=yarn,factor=2 -o report-sglang/
"""


@app.command(name="eval", epilog=EXAMPLES)
def eval_command(
    model: Annotated[str, typer.Argument(help="Unpatched checkpoint folder, Hub id, or 'smollm2' (the demo model).")],
    output: Annotated[Path, typer.Option("-o", "--output", "--out", help="Report folder (results.jsonl, report.md, PNGs).")],
    specs: Annotated[list[str] | None, typer.Option("--spec", help="Spec YAML or inline method=...,factor=... (repeatable).")] = None,
    suite: Annotated[str, typer.Option(help="quick, paper, full, smoke, readme, or a suite YAML path.")] = "quick",
    text: Annotated[list[str] | None, typer.Option(help="Perplexity text: a file, pydoc_topics or debian_licenses (repeatable; replaces the suite's).")] = None,
    dtype: Annotated[str, typer.Option(help="float32, bfloat16, float16.")] = "float32",
    device_map: Annotated[str | None, typer.Option("--device-map", help="e.g. auto (accelerate) for models larger than one device.")] = None,
    device: Annotated[str | None, typer.Option(help="e.g. cuda (ignored with --device-map).")] = None,
    no_baseline: Annotated[bool, typer.Option("--no-baseline", help="Skip the unpatched model.")] = False,
    name: Annotated[str | None, typer.Option("--name", help="Name MODEL's own row (evaluated as it loads) instead of 'unpatched', e.g. 'trained yarn-x2' for a checkpoint that already carries its scaling; there is then no unpatched row.")] = None,
    no_resume: Annotated[bool, typer.Option("--no-resume", help="Start a fresh results.jsonl instead of resuming.")] = False,
    no_plots: Annotated[bool, typer.Option("--no-plots")] = False,
    interleave: Annotated[bool, typer.Option("--interleave", help="Sample round by round across variants, so a stopped run compares like with like.")] = False,
    no_memory_check: Annotated[bool, typer.Option("--no-memory-check", help="Load the model even if the memory estimate says it does not fit.")] = False,
    engine: Annotated[str, typer.Option(help="transformers (the reference, in this process) or a run engine serving each variant: vllm, sglang or mlx (the real engine; builds its virtualenv once). Variants the engine does not serve identically are refused before loading.")] = "transformers",
    tensor_parallel_size: Annotated[int | None, typer.Option("--tensor-parallel-size", help="--engine vllm or sglang: the engine's tensor parallelism (GPUs).")] = None,
    pipeline_parallel_size: Annotated[int | None, typer.Option("--pipeline-parallel-size", help="--engine vllm: vLLM's pipeline parallelism (GPUs or nodes).")] = None,
) -> None:
    """Evaluate before/after: perplexity by length, passkey, needles, short-context regression; resumable."""
    # light imports only until the arguments are checked: a bad one is refused at once, before torch loads
    from ..eval.runner import run_eval, summary_markdown
    from ..spec import parse_inline_spec

    engine_args = {key: value for key, value in (("tensor_parallel_size", tensor_parallel_size),
                                                 ("pipeline_parallel_size", pipeline_parallel_size)) if value}
    variants = [parse_inline_spec(s) for s in specs or []]
    if name is not None:
        from ..eval.variants import BASELINE

        if name == BASELINE or not name.strip():
            raise ValueError(f"--name {name!r}: {BASELINE!r} (or an empty name) is what MODEL is called without "
                             "--name; give the checkpoint a name of its own, e.g. --name 'trained yarn-x2'")
        variants, no_baseline = [(name, None), *variants], True
    records = run_eval(
        model,
        variants,
        suite,
        output,
        dtype=dtype,
        device_map=device_map,
        device=device,
        text=list(text) if text else None,
        include_baseline=not no_baseline,
        resume=not no_resume,
        plots=not no_plots,
        interleave=interleave,
        memory_check=not no_memory_check,
        engine=engine,
        engine_args=engine_args or None,
    )
    say_markdown(summary_markdown(records))
    say(f"report: {shell_path(output / 'report.md')}", hang="        ")


@app.command(name="eval-report")
def eval_report_command(
    output: Annotated[Path, typer.Argument(help="An eval output folder (results.jsonl + run.json).")],
    no_plots: Annotated[bool, typer.Option("--no-plots")] = False,
    compare: Annotated[list[Path] | None, typer.Option(
        "--compare", help="Another eval folder whose variants on the same cases the plots draw beside OUTPUT's "
        "(e.g. the base model's eval as a trained checkpoint's 'before'). Repeatable.")] = None,
    compare_variant: Annotated[list[str] | None, typer.Option(
        "--compare-variant", help="Only these variants of the --compare folders. Repeatable.")] = None,
) -> None:
    """Rewrite report.md and the plots from results.jsonl, e.g. of a run still in progress or stopped early."""
    from ..eval.runner import rebuild_report, run_records, summary_markdown

    path = rebuild_report(output, plots=not no_plots, compare=compare or (),
                          compare_variants=compare_variant or ())
    say_markdown(summary_markdown(run_records(output)[1]))
    say(f"report: {shell_path(path)}", hang="        ")


@app.command(name="demo")
def demo_command(
    output: Annotated[Path, typer.Option("-o", "--output", "--out", help="Folder for the report and the patched checkpoint.")] = Path("demo-out"),
    suite: Annotated[str, typer.Option(help="Eval suite for the comparison.")] = "quick",
) -> None:
    """`make demo`: SmolLM2-135M unpatched vs YaRN, dynamic YaRN and PI x2, then the patched checkpoint."""
    from ..demo import run_demo

    run_demo(output, suite)


@app.command(name="eval-tasks")
def eval_tasks_command(
    tokenizer: Annotated[str, typer.Option(help="The model you will evaluate with lm-eval (its tokenizer): a "
                                           "folder, Hub id, or 'smollm2'.")],
    output: Annotated[Path | None, typer.Option("-o", "--output", "--out", help="Data folder (default: eval/tasks/data).")] = None,
    tasks: Annotated[list[str] | None, typer.Option("--task", "--tasks", help="Task (repeatable; default: all).")] = None,
    lengths: Annotated[list[int] | None, typer.Option("--length", "--lengths", help="Prompt length in tokens (repeatable).")] = None,
    depths: Annotated[list[float] | None, typer.Option("--depth", "--depths", help="Needle depth 0..1 (repeatable).")] = None,
    samples: Annotated[int, typer.Option(help="Samples per (length, depth).")] = 1,
    seed: Annotated[int, typer.Option()] = 0,
    num_needles: Annotated[int, typer.Option("--num-needles")] = 4,
) -> None:
    """Write the jsonl data for the lm-eval tasks in eval/tasks (rope_passkey, rope_niah_*, rope_vt, rope_perplexity)."""
    from ..eval.lm_tasks import all_tasks, write_task_data
    from ..hub import resolve_source

    tokenizer = str(resolve_source(tokenizer, tokenizer_only=True))  # a Hub id: its tokenizer's files alone
    unknown = [t for t in tasks or [] if t not in all_tasks()]
    if unknown:
        raise ValueError(f"unknown lm-eval task {unknown[0]!r}; expected one of {', '.join(all_tasks())}")
    paths = write_task_data(tokenizer, output, list(tasks or all_tasks()), lengths or None, depths or None,
                            samples, seed, num_needles)
    for task, path in paths.items():
        say(f"{task}: {shell_path(path)}")
