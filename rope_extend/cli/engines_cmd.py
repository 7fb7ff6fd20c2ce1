"""`rope-extend engines`: the parity report -- does each serving engine reproduce rope-extend's RoPE?"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from ..terminal import column_widths, fits, row_lines
from .app import app, out, say
from .options import Factor, Json, Sets, SpecFile, TargetLength, build_spec, method_option

EXAMPLES = """Examples:

  rope-extend engines out/llama-yarn8

  rope-extend engines Qwen/Qwen2.5-7B-Instruct

  rope-extend engines ./my-model --method ntk-by-parts --factor 4 --json

  ROPE_EXTEND_OTHER_PYTHON=.venv4/bin/python rope-extend engines out/smollm2-yarn2

  rope-extend engines out/smollm2-yarn2 --run vllm --run vllm-server

  rope-extend engines Qwen/Qwen2.5-7B-Instruct --run vllm --run sglang --long-tokens 8192

Exit status: 0 when every run agrees with the card; 3 (CONTRADICTED) when a real engine (--run) measured otherwise a
route the card lists as identical, or, auditing a model rope-extend did not write, otherwise than its port at the same
lengths (the lines starting "contradicted:" name each); 2 on a usage error.
"""

CONTRADICTED = 3  # a run engine measured otherwise a request the card lists as identical


@app.command(epilog=EXAMPLES)
def engines(
    checkpoint: Annotated[str, typer.Argument(help="A checkpoint written by rope-extend, SOURCE with --method, or any model (its own RoPE audited).")],
    method: method_option("Plan this method on SOURCE in memory.") = None,
    factor: Factor = None,
    target_length: TargetLength = None,
    config: SpecFile = None,
    sets: Sets = None,
    other_python: Annotated[
        str | None, typer.Option("--other-python", help="Python of the other transformers line ($ROPE_EXTEND_OTHER_PYTHON).")
    ] = None,
    runs: Annotated[list[str] | None, typer.Option(
        "--run", help="Also serve it in a real engine: vllm (offline LLM), vllm-server (OpenAI server), sglang "
        "(SGLang's server) or mlx (mlx-lm's generate_step); repeatable. Builds the engine's own virtualenv once (`make "
        "vllm`, `make sglang`, `make mlx`). Progress goes to stderr; exits 3 when a run measures otherwise a route the "
        "card lists as identical. A model rope-extend did not write: a small random-weight model of its config served "
        "through every audit route.")] = None,
    long_tokens: Annotated[int | None, typer.Option(
        "--long-tokens", help="The long request's tokens. A checkpoint rope-extend wrote: instead of the target length "
        "(above the original length), a shorter run for a slow engine. Auditing a model rope-extend did not write "
        "with --run: the longest request the engines serve its small model at (the long request min(window, N), the "
        "short one min(L, N/2); default 8192).", min=64)] = None,
    as_json: Json = False,
) -> None:
    """Per engine and route, max |Δcos|, |Δsin| against rope-extend (a port), or |Δ logprob| against transformers (a
    run), for a short and a long request, or why not. Exits 3 when a run contradicts the card."""
    from ..engines.parity import check_runs, parity

    check_runs(runs or [])  # a bad name fails before anything is loaded
    if method is None and config is None and not sets and factor is None and target_length is None:
        contradicted = _audit(checkpoint, other_python, runs or [], long_tokens, as_json)
        if contradicted is not None:  # a model rope-extend did not write: its own RoPE audited
            _contradicted(contradicted)
            return
        report = parity(checkpoint, other_python=other_python, runs=runs or (), long_tokens=long_tokens)
    else:
        spec = build_spec(method, factor, target_length, config, sets or [])
        report = parity(source=checkpoint, spec=spec, other_python=other_python, runs=runs or (),
                        long_tokens=long_tokens)
    contradicted = report.contradictions()
    if as_json:
        out.print_json(report.to_json())
    else:
        _print_table(report)
    _contradicted(contradicted)


def _contradicted(lines: list[str]) -> None:
    """One error line each (what a CI log shows and a script greps), then exit 3 when there is any."""
    for line in lines:
        print(f"contradicted: {' '.join(line.split())}", file=sys.stderr, flush=True)
    if lines:
        raise typer.Exit(CONTRADICTED)


def _print_table(report) -> None:
    from ..engines.parity import ports_note

    measures = "a port row: max |Δcos|, |Δsin| against rope-extend's RoPE"
    if any(row.served_by_engine for row in report.rows):
        measures = ("a run row: max / mean |Δ logprob| of the prompt tokens against transformers running "
                    "rope-extend's RoPE; " + measures)
    long = f" (the long request: {report.long} tokens)" if report.long else ""
    say(f"{report.method} x{report.factor:g}: {report.original} -> {report.target} tokens{long}. Each cell, for a short "
        f"and a long request: {measures}.")
    # Borderless, so that the columns' longest words (`--json-model-override-args`) fit 80 columns: a cell wraps
    # between words, never inside one.
    notes: list[str] = []  # why a request was not run or not served: below the table, where it has the full width
    rows = [(f"{row.engine} ({row.label})", row.route, _cell(row.short, notes), _cell(row.long, notes),
             "identical" if row.identical else ("not run" if row.skipped else "differs")) for row in report.rows]
    header = ("engine", "route", f"short ({report.original})", f"long ({report.long or report.target})", "result")
    widths = column_widths([header, *rows], out.width)
    if fits(widths, out.width):
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
        for column, width in zip(header, widths):
            table.add_column(column, width=width)
        for cells in rows:
            table.add_row(*cells, style={"identical": None, "differs": "red"}.get(cells[-1]))
        out.print(table, soft_wrap=False)
    else:  # narrower than the columns' longest words (60 columns): one line per row, nothing cut
        for line in row_lines(list(header), [list(cells) for cells in rows], out.width):
            out.print(line, markup=False, highlight=False, soft_wrap=True)
    say(ports_note(report.rows))  # what the "identical" of the engine rows rests on
    for number, reason in enumerate(notes, 1):
        say(f"[{number}] {reason}", hang="    ")
    shown: set[str] = set()
    for row in report.rows:
        for warning in row.warnings if not row.identical else []:
            if warning not in shown:
                shown.add(warning)
                say(f"warning: {warning}", hang="  ")


def _cell(result, notes: list[str]) -> str:
    """A measured request's deltas, or a reference to its reason in *notes* (one note per distinct reason)."""
    from ..engines.runs import LogprobDelta
    from ..engines.served import NotServed

    if isinstance(result, NotServed):
        if result.reason not in notes:
            notes.append(result.reason)
        label = "not run" if result.reason.startswith("not run") else "not served"
        return f"{label} [{notes.index(result.reason) + 1}]"
    if isinstance(result, LogprobDelta):  # a real engine: log-probabilities, NaN counted
        return f"{result.max_abs:.2g} / {result.mean_abs:.2g} logprob" + (f", {result.nan} NaN" if result.nan else "")
    return f"{max(result.max_cos, result.max_sin):.2g} cos/sin"


def _audit(checkpoint: str, other_python: str | None, runs: list[str], long_tokens: int | None,
           as_json: bool) -> list[str] | None:
    """Audit the model's own RoPE per engine (`engines.audit`) when rope-extend did not write it, with the real
    engines of `runs` (`--run`); returns the run's contradictions of the ports ([] without a run), or None when
    rope-extend wrote the checkpoint (the parity report checks it)."""
    from ..engines.audit import audit, audit_gguf, is_own_scheme
    from ..engines.audit_run import RUN_TOKENS
    from ..gguf.binary import is_gguf

    gguf = is_gguf(checkpoint)
    if not gguf and not is_own_scheme(checkpoint):
        return None
    if gguf and (runs or long_tokens is not None):
        flag = f"--run {runs[0]}" if runs else f"--long-tokens {long_tokens}"
        raise ValueError(f"{flag}: the audit of a GGUF runs the engine ports only (llama.cpp's reading of its "
                         "metadata is the reference); drop it")
    report = audit_gguf(checkpoint, other_python=other_python) if gguf else \
        audit(checkpoint, other_python=other_python, runs=runs, run_tokens=long_tokens or RUN_TOKENS)
    if as_json:
        out.print_json(report.to_json())
    else:
        for line in report.lines(out.width):
            out.print(line, markup=False, highlight=False, soft_wrap=True)
    return report.contradictions()
