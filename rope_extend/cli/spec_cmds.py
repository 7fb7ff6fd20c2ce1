"""`rope-extend validate` and `rope-extend methods`: spec checks and the method table, no model needed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .app import app, fail, out, say


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
    if original_length is not None and original_length < 1:
        fail(f"--original-length {original_length} is not a number of tokens: give the context length the model "
             "was trained with (>= 1, e.g. --original-length 4096)")
    from ..spec import load_spec

    spec = load_spec(spec_file)
    if original_length is not None:
        spec = spec.resolve(original_length)
        spec = spec.rope_method.fill_params(spec)  # derived parameters and their rules (self-extend's reach)
    out.print(f"[green]valid[/green]: {spec_file}")
    out.print(spec.to_yaml().rstrip(), markup=False, highlight=False)


@app.command(epilog="Example:\n\n  rope-extend methods")
def methods() -> None:
    """List every scaling method: formula, attention factor, parameters and defaults (where each serves identically:
    `rope-extend engines`)."""
    from ..methods import all_methods

    for method in all_methods():
        out.print(f"[bold]{method.name}[/bold]{'  (dynamic)' if method.dynamic else ''}")
        for label, value in (("formula", method.formula), ("attention factor", method.attention),
                             ("parameters", method.param_doc()),
                             ("use when", method.use_when), ("paper", method.paper)):
            say(f"{label}: {value}", indent="  ", hang="    ")
