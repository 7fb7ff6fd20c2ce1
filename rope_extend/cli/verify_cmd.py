"""`rope-extend verify`: re-verify an output folder as it is now, and refresh its card and record (thin over
rope_extend.reverify), so that a deliberate edit can be pushed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..terminal import shell_path
from .app import Progress, app, say
from .options import NoMemoryCheck

EXAMPLES = """Examples:

  rope-extend verify out/smollm2-yarn2

After editing a file of OUT (a chat template, generation defaults, a config
key, other weights), `rope-extend push` refuses it until this re-runs the
verification on OUT as it is now; then push again.
"""
STEPS = 3


@app.command(epilog=EXAMPLES)
def verify(
    folder: Annotated[Path, typer.Argument(help="The OUT folder `patch` or `train` wrote.")],
    no_memory_check: NoMemoryCheck = False,
) -> None:
    """Re-verify OUT as it is now (stock reload + a forward beyond the original length); refresh its card and record."""
    from ..reverify import reverify

    with Progress("verifying", STEPS) as progress:
        result = reverify(folder, on_step=progress.step, memory_check=not no_memory_check)
    changed = ", ".join(f"{name} ({why})" for name, why in result.changed) or "none"
    weights = "the real weights" if result.real_weights else "a small model of the config (the weights unchanged)"
    say(f"verified {shell_path(result.folder)} as it is now in {result.seconds:.2f} s: stock transformers reload and a forward "
        f"beyond the original length on {weights}", hang="  ")
    say(f"changed since the last verification: {changed}", hang="  ")
    card = {"refreshed": "refreshed (its engines section and a re-verification line)",
            "kept as edited": "kept as you edited it", "none": "none in OUT"}[result.card]
    listed = ", ".join(result.weights[:4]) + (f" and {len(result.weights) - 4} more" if len(result.weights) > 4 else "")
    say(f"record: {shell_path(result.folder / 'rope_extend.yaml')} rewritten, vouching for the weights {listed}; "
        f"card: {card}", hang="  ")
