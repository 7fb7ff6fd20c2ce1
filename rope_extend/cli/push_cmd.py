"""`rope-extend push`: publish a folder `patch` or `train` wrote (thin over rope_extend.hub).

`patch --push-to-hub` and `train --push-to-hub` end with the same `publish`, so a push that failed after OUT was
written is finished by the one command its error line prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .app import Progress, app, out

EXAMPLES = """Examples:

  rope-extend push out/smollm2-yarn2 me/smollm2-yarn2

  rope-extend push out/smollm2-yarn2 me/smollm2-yarn2 --private --dry-run

The token is HF_TOKEN or the one `hf auth login` stored; it is never printed.
"""


def publish(folder: Path, repo_id: str, private: bool, dry_run: bool) -> None:
    """Push `folder` to `repo_id` (or, with `dry_run`, print exactly what the push would upload)."""
    from ..hub import plan_push, push, serve_command_for

    plan = plan_push(folder, repo_id, private)
    if dry_run:
        for line in plan.dry_run_lines():
            out.print(line, markup=False, highlight=False)
        return
    with Progress("pushing", 1) as progress:
        progress.step(f"uploading {len(plan.files)} files to {repo_id}")
        url = push(plan)
    out.print(f"pushed: {url} ({len(plan.files)} files, {'private' if private else 'public'})", markup=False,
              highlight=False)
    serve = serve_command_for(plan.folder, repo_id)
    if serve:
        out.print(f"serve:  {serve}", markup=False, highlight=False)


@app.command(epilog=EXAMPLES)
def push(
    folder: Annotated[Path, typer.Argument(help="The OUT folder `patch` or `train` wrote.")],
    repo_id: Annotated[str, typer.Argument(help="Hub repo id, e.g. me/my-model-64k (created if missing).")],
    private: Annotated[bool, typer.Option("--private", help="Create the repo as private.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would be uploaded; send nothing.")] = False,
) -> None:
    """Upload a checkpoint folder to the Hugging Face Hub (creates the repo; a later push adds a commit)."""
    publish(folder, repo_id, private, dry_run)
