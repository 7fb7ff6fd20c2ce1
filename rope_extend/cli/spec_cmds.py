"""`rope-extend validate` and `rope-extend methods`: spec checks and the method table, no model needed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ..methods import all_methods
from ..spec import load_spec
from .app import app, out


@app.command(
    epilog="Examples:\n\n  rope-extend validate configs/yarn-x8.yaml\n\n"
    "  rope-extend validate configs/qwen2.5-yarn-x4.yaml --original-length 32768"
)
def validate(
    spec_file: Annotated[Path, typer.Argument(help="YAML spec to check.")],
    original_length: Annotated[
        int | None, typer.Option("--original-length", help="Resolve factor/target against this original length.")
    ] = None,
) -> None:
    """Check a spec file without loading any model; print the resolved spec."""
    spec = load_spec(spec_file)
    if original_length is not None:
        spec = spec.resolve(original_length)
    out.print(f"[green]valid[/green]: {spec_file}")
    out.print(spec.to_yaml().rstrip(), markup=False, highlight=False)


@app.command(epilog="Example:\n\n  rope-extend methods")
def methods() -> None:
    """List every scaling method: parameters and defaults, formula, and which stock loaders reproduce it."""
    table = Table(title="RoPE scaling methods", show_lines=True)
    for column in ("method", "parameters (defaults)", "formula", "transformers 4.x / 5.x", "vLLM", "llama.cpp", "use when"):
        table.add_column(column, overflow="fold")
    for method in all_methods():
        params = ", ".join(f"{k}={v}" for k, v in method.params.items()) or "-"
        loaders = method.loaders
        table.add_row(
            method.name,
            params,
            method.formula,
            f"{loaders.get('transformers-4')} / {loaders.get('transformers-5')}",
            loaders.get("vllm", "?"),
            loaders.get("llama.cpp", "?"),
            method.use_when,
        )
    out.print(table)
