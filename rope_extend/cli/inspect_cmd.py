"""`rope-extend inspect`: the per-disk RoPE table of a model, a method comparison plot, and a recommendation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.table import Table

from ..terminal import column_widths, fits, shell_path
from .app import app, fail, out, say, say_command
from .options import Factor, Json, Revision, SpecFile, TargetLength, method_option

if TYPE_CHECKING:
    from ..spec import RopeSpec


def _spec(method, factor, target_length, config_file, advice) -> RopeSpec | None:
    from ..spec import RopeSpec

    overrides = {"method": method, "factor": factor, "target_length": target_length}
    if config_file is not None:
        return RopeSpec.from_sources(config_file, overrides)
    if method is None:
        if factor is not None:
            fail(f"--factor {factor:g} needs --method (e.g. --method yarn); see `rope-extend methods`")
        if advice is None:
            if target_length is not None:
                fail("--target-length needs --method (e.g. --method yarn) or --recommend")
            return None
        if advice.method is None:  # no scaling needed: show the model as it is
            return None
        return RopeSpec(method=advice.method, target_length=target_length)
    from ..methods import get_method

    if factor is None and target_length is None and get_method(method).needs_factor:
        fail(f"--method {method} needs --factor or --target-length")
    return RopeSpec.from_sources(None, overrides)


@app.command(
    epilog="Examples:\n\n  rope-extend inspect ./SmolLM2-135M\n\n"
    "  rope-extend inspect ./SmolLM2-135M --method yarn --factor 4 --plot rope.png\n\n"
    "  rope-extend inspect ./SmolLM2-135M --recommend --target-length 32768"
)
def inspect(
    source: Annotated[str, typer.Argument(help="Model folder (or Hub id) with a config.json.")],
    method: method_option("Scaling method to preview.") = None,
    factor: Factor = None,
    target_length: TargetLength = None,
    config_file: SpecFile = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            help="Write a PNG comparing linear/ntk/yarn/ntk-by-parts/llama3 at the spec's factor "
            "(else the recommended one, else 4).",
        ),
    ] = None,
    recommend_: Annotated[
        bool, typer.Option("--recommend", help="Recommend a factor and method for --target-length.")
    ] = False,
    revision: Revision = None,
    as_json: Json = False,
) -> None:
    """Show each rotary dimension (a disk turning θ_i per token): wavelength, turns within the original length,
    and, with a method, its new frequency and regime (extrapolated / blended / interpolated)."""
    if recommend_ and target_length is None:
        fail("--recommend needs --target-length N (the context length you want to serve)")
    if factor is not None and factor < 1:
        fail(f"--factor must be >= 1 (it multiplies the context length), got {factor:g}")
    if target_length is not None and target_length <= 0:
        fail(f"--target-length must be a positive number of tokens, got {target_length}")
    from ..gguf.binary import is_gguf
    from ..gguf.info import hf_config_of, read_gguf_info
    from ..inspect import inspect_rope, load_config, plot_methods, recommend

    config = hf_config_of(read_gguf_info(source)) if is_gguf(source) else load_config(source, revision=revision)
    advice = recommend(config, target_length) if recommend_ else None
    spec = _spec(method, factor, target_length, config_file, advice)
    view = inspect_rope(config, spec)
    plot_path = None
    if plot is not None:
        plot_factor = view.factor if view.factor > 1 else (advice.factor if advice and advice.factor > 1 else 4.0)
        plot_path = plot_methods(config, plot_factor, plot)

    if as_json:
        data = {"inspection": view.to_dict()}
        if advice is not None:
            data["recommendation"] = {**advice.to_dict(), "commands": advice.commands(source)}
        if plot_path is not None:
            data["plot"] = str(plot_path)
        out.print_json(json.dumps(data))
        return
    _print_table(view)
    if advice is not None:
        out.print()
        caveat = f" (caveat: {advice.caveat})" if advice.caveat else ""
        if advice.method is None:
            say(f"recommendation for {advice.target_length} tokens: no scaling needed")
        else:
            say(f"recommendation for {advice.target_length} tokens: factor {advice.factor:.4g}, method "
                f"{advice.method}{caveat}")
        for line in advice.reasons:
            say(f"- {line}", indent="  ", hang="    ")
        for name, why in advice.alternatives.items():
            say(f"alternative {name}: {why}", indent="  ", hang="    ")
        commands = advice.commands(source)
        if commands:
            say("to write it, measure it on your model (passkey and perplexity, patched vs unpatched) and train at "
                "the new length on your text (docs/train.md):")
            for label, command in commands.items():
                say_command(f"  {label + ':':<7}", command)
    if plot_path is not None:
        say(f"plot written to {shell_path(plot_path)}")


def _print_table(view) -> None:
    scaled = view.method is not None or view.current_rope_type != "default"
    what = f"{view.method} x{view.factor:g}" if view.method else f"current RoPE ({view.current_rope_type})"
    title = (
        f"{view.model_type}: rotary dim {view.rotary_dim}, base {view.base:g}, original length {view.original_length}"
        f" -> {view.target_length}; {what}; attention factor {view.attention_factor:.4f}"
    )
    say(title)
    columns = ["i", "λ", "r = L/λ"]
    if scaled:
        columns += ["old θ", "new θ", "new/old", "r at N", "regime"]
    else:
        columns += ["θ"]
    rows = []
    for row in view.rows:
        cells = [str(row.index), f"{row.wavelength:.4g}", f"{row.rotations:.4g}"]
        if scaled:
            cells += [f"{row.old_inv_freq:.3g}", f"{row.new_inv_freq:.3g}", f"{row.ratio:.4f}",
                      f"{row.rotations_at_target:.4g}", row.regime]
        else:
            cells += [f"{row.old_inv_freq:.4g}"]
        rows.append(cells)
    widths = column_widths([tuple(columns), *map(tuple, rows)], out.width, gap=1)
    dropped = []
    if not fits(widths, out.width, gap=1) and scaled:  # narrow terminal: new/old says what old and new θ say
        keep = [i for i, column in enumerate(columns) if column not in ("old θ", "new θ")]
        dropped = [column for column in columns if column in ("old θ", "new θ")]
        columns, rows = [columns[i] for i in keep], [[cells[i] for i in keep] for cells in rows]
        widths = column_widths([tuple(columns), *map(tuple, rows)], out.width, gap=1)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
    for column, width in zip(columns, widths):
        table.add_column(column, justify="left" if column == "regime" else "right", min_width=width)
    for cells in rows:
        table.add_row(*cells)
    out.print(table)
    if dropped:
        say(f"({' and '.join(dropped)}: at 80 columns or with --json)")
    say("i: a rotary pair of query/key dimensions (a \"disk\"), turning θ radians per token; λ = 2π/θ tokens per "
        "turn; r = turns within L (original) or N (target)", hang="   ")
    counts = ", ".join(f"{n} {regime}" for regime, n in view.counts().items())
    say(f"disks: {counts}; attention factor {view.attention_factor:.4f}", hang="   ")
    for note in view.notes:
        say(f"note: {note}", hang="   ")
