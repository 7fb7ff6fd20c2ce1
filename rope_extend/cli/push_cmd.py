"""`rope-extend push`: publish a folder `patch` or `train` wrote (thin over rope_extend.hub and rope_extend.record).

`patch --push-to-hub` and `train --push-to-hub` end with the same `publish`, so a push that failed after OUT was
written is finished by the one command its error line prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from .app import Progress, app, out, say

EXAMPLES = """Examples:

  rope-extend push out/smollm2-yarn2 me/smollm2-yarn2

  rope-extend push out/smollm2-yarn2 me/smollm2-yarn2 --private --dry-run

  rope-extend push out/smollm2-16k me/smollm2-16k --include adapter

Only the checkpoint's files are sent; anything else in OUT is refused, named,
before any network call (--include NAME sends a file inside OUT on purpose).
The token is HF_TOKEN or the one `hf auth login` stored; it is never printed.
"""


def publish(folder: Path, repo_id: str, private: bool, dry_run: bool, include: Sequence[str] = (), *,
            flag: str = "REPO", written_now: bool = False) -> None:
    """Push `folder` to `repo_id` (or, with `dry_run`, print exactly what the push would send and leave out).
    `flag` names the repo id in errors (`REPO` for push, `--push-to-hub` for patch and train); `written_now`: OUT
    was just written by patch or train."""
    from ..hub import check_reachable, files_count, hub_token, plan_push, push

    plan = plan_push(folder, repo_id, private, include, flag=flag, written_now=written_now)
    if dry_run:  # wrapped at the terminal's width; a file's reason continues under its name
        for line in plan.dry_run_lines():
            indent = len(line) - len(line.lstrip())
            say(line, hang=" " * (indent + 4 if indent else 2))
    refusal = plan.selection.refusal()
    if refusal is not None:
        raise refusal
    if dry_run:
        return
    token = hub_token(plan.kept())  # before anything is printed or sent
    check_reachable(plan)
    with Progress("pushing", 1) as progress:
        progress.step(f"uploading {files_count(len(plan.files))} to {repo_id}")
        visibility = push(plan, token)
    shown = {True: "private", False: "public", None: "visibility not reported by the Hub"}[visibility]
    out.print(f"pushed: {plan.url} ({files_count(len(plan.files))}, {shown})", markup=False, highlight=False)
    if plan.selection.left_out:  # said, not silently skipped; the dry run gives each one's reason
        names = [name for name, _ in plan.selection.left_out]
        out.print(f"left out: {', '.join(names[:8])}{f' and {len(names) - 8} more' if len(names) > 8 else ''} "
                  f"(`{plan.later} --dry-run` says why)", markup=False, highlight=False)
    if plan.serve:
        out.print(f"serve:  {plan.serve}", markup=False, highlight=False)


@app.command(epilog=EXAMPLES)
def push(
    folder: Annotated[Path, typer.Argument(help="The OUT folder `patch` or `train` wrote.")],
    repo_id: Annotated[str, typer.Argument(help="Hub repo id, e.g. me/my-model-64k (created if missing).")],
    private: Annotated[bool, typer.Option("--private", help="Create the repo as private.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would be sent and left out; send nothing.")] = False,
    include: Annotated[list[str] | None, typer.Option("--include", metavar="NAME", help="Also send this file or folder of OUT (a name relative to OUT; repeatable).")] = None,
) -> None:
    """Upload a checkpoint folder to the Hugging Face Hub (creates the repo; a later push adds a commit)."""
    publish(folder, repo_id, private, dry_run, include or [])
