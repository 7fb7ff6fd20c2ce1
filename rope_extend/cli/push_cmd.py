"""`rope-extend push`: publish a folder `patch` or `train` wrote (thin over rope_extend.publish).

`patch --push-to-hub` and `train --push-to-hub` end with the same `publish`, so a push that failed after OUT was
written is finished by the one command its error line prints.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from .app import app, console, out, say
from .options import Private

EXAMPLES = """Examples:

  rope-extend push out/smollm2-yarn2 me/smollm2-yarn2

  rope-extend push out/smollm2-yarn2 me/smollm2-yarn2 --private --dry-run

  rope-extend push out/smollm2-16k me/smollm2-16k --include adapter

  rope-extend push out/smollm2-yarn2.gguf me/smollm2-yarn2-gguf --unverified

Only a checkpoint rope-extend wrote and verified is sent (--unverified
sends another as it is, its card saying so), and only its files; anything
else in OUT is refused, named, before any network call (--include NAME
sends a file inside OUT on purpose).
The token is HF_TOKEN or the one `hf auth login` stored; it is never printed.
"""


def publish(folder: Path, repo_id: str, private: bool, dry_run: bool, include: Sequence[str] = (), *,
            flag: str = "REPO", written_now: bool = False, unverified: bool = False) -> None:
    """Push `folder` to `repo_id` (or, with `dry_run`, print exactly what the push would send and leave out).
    `flag` names the repo id in errors (`REPO` for push, `--push-to-hub` for patch and train); `written_now`: OUT
    was just written by patch or train; `unverified`: push --unverified."""
    from ..publish.plan import files_count, hub_token, plan_push
    from ..publish.push import check_reachable, push
    from ..terminal import shown_name

    plan = plan_push(folder, repo_id, private, include, flag=flag, written_now=written_now, unverified=unverified)
    if dry_run:  # wrapped at the terminal's width; a file's reason continues under its name
        for line in plan.dry_run_lines():
            indent = len(line) - len(line.lstrip())
            say(line, hang=" " * (indent + 4 if indent else 2))
    refusal = plan.selection.refusal()
    if refusal is not None:
        raise refusal
    if dry_run:
        return
    from ..publish.upload import PushInterrupted

    token = hub_token(plan.kept())  # before anything is printed or sent
    check_reachable(plan)
    try:
        with TransferReport(repo_id, len(plan.files)) as report:
            visibility = push(plan, token, report)
    except PushInterrupted as exc:
        print(f"rope-extend: {exc.message}", file=sys.stderr, flush=True)
        raise SystemExit(130) from None  # its own line said what is left; not the generic one
    shown = {True: "private", False: "public", None: "visibility not reported by the Hub"}[visibility]
    out.print(f"pushed: {plan.url} ({files_count(len(plan.files))}, {shown})", markup=False, highlight=False)
    if plan.selection.left_out:  # said, not silently skipped; the dry run gives each one's reason
        names = [shown_name(name) for name, _ in plan.selection.left_out]
        out.print(f"left out: {', '.join(names[:8])}{f' and {len(names) - 8} more' if len(names) > 8 else ''} "
                  f"(`{plan.later} --dry-run` says why)", markup=False, highlight=False)
    if plan.serve:
        out.print(f"serve:  {plan.serve}", markup=False, highlight=False)


class TransferReport:
    """A push's progress on stderr (`upload.Report`): what the Hub already holds, each large file as it is sent, and
    the total (bytes, rate, time left). On a terminal one status line is updated; otherwise a line per file, one
    every `EVERY_S` seconds while a file is sent, one per retry."""

    EVERY_S = 10.0

    def __init__(self, repo_id: str, files: int):
        self.repo_id, self.files = repo_id, files
        self.status = None
        self.started: float | None = None
        self.last = 0.0
        self.to_send = 0

    def __enter__(self) -> TransferReport:
        if console.is_terminal:
            self.status = console.status(f"pushing {self.files} files to {self.repo_id}...")
            self.status.__enter__()
        else:
            self._line(f"pushing {self.files} file{'s' if self.files != 1 else ''} to {self.repo_id}")
        return self

    def __exit__(self, *exc) -> None:
        if self.status is not None:
            self.status.__exit__(*exc)

    def _line(self, text: str) -> None:
        if self.status is not None:
            console.print(f"rope-extend: {text}", markup=False, highlight=False)
        else:
            print(f"rope-extend: {text}", file=sys.stderr, flush=True)

    def hashing(self, item) -> None:
        from ..publish.upload import size_text
        from ..terminal import shown_name

        if self.status is not None:
            self.status.update(f"hashing {shown_name(item.name)} ({size_text(item.size)})")
        elif item.size >= 1 << 30:
            self._line(f"hashing {shown_name(item.name)} ({size_text(item.size)})")

    def planned(self, transfer) -> None:
        from ..publish.upload import size_text

        large = [item for item in transfer.items if item.lfs]
        held = [item for item in large if item.present]
        self.to_send = sum(item.size for item in large if not item.present)
        if large:
            already = (f"; on the Hub already from an earlier push: {len(held)} ({size_text(transfer.already)}), "
                       "not sent again" if held else "")
            self._line(f"{len(large) - len(held)} of {len(large)} large files to send "
                       f"({size_text(self.to_send)}){already}; the other files go in the commit")

    def start(self, item, transfer) -> None:
        from ..publish.upload import size_text
        from ..terminal import shown_name

        self.started = self.started or time.monotonic()
        self.sent_before = transfer.sent
        self._line(f"sending {shown_name(item.name)} ({size_text(item.size)})")

    def _total(self, transfer) -> tuple[str, float]:
        from ..publish.upload import size_text

        done = sum(item.size if item.uploaded else item.done for item in transfer.items
                   if item.lfs and not item.present)
        elapsed = max(time.monotonic() - (self.started or time.monotonic()), 1e-6)
        rate = transfer.sent / elapsed
        left = (self.to_send - done) / rate if rate > 0 else float("inf")
        eta = f"{left / 60:.0f} min left" if left >= 90 else f"{left:.0f} s left"
        return (f"{size_text(done)} of {size_text(self.to_send)}, {size_text(rate)}/s, "
                f"{eta if left != float('inf') else 'time left unknown'}"), rate

    def advance(self, item, transfer) -> None:
        from ..publish.upload import size_text
        from ..terminal import shown_name

        now = time.monotonic()
        if now - self.last < (0.2 if self.status is not None else self.EVERY_S):
            return
        self.last = now
        total, _ = self._total(transfer)
        text = f"{shown_name(item.name)} {size_text(item.done)} of {size_text(item.size)}; total {total}"
        if self.status is not None:
            self.status.update(text)
        else:
            self._line(text)

    def finish(self, item, transfer) -> None:
        from ..terminal import shown_name

        total, _ = self._total(transfer)
        self._line(f"sent {shown_name(item.name)}; total {total}")

    def retry(self, what: str, why: str, wait: float, attempt: int, attempts: int) -> None:
        self._line(f"{why} on {what}: retrying in {wait:.0f} s (try {attempt + 1} of {attempts})")


@app.command(epilog=EXAMPLES)
def push(
    folder: Annotated[Path, typer.Argument(help="The OUT folder `patch` or `train` wrote, or a .gguf file (a GGUF repo: the file and a card).")],
    repo_id: Annotated[str, typer.Argument(help="Hub repo id, e.g. me/my-model-64k (created if missing).")],
    private: Private = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would be sent and left out; send nothing.")] = False,
    include: Annotated[list[str] | None, typer.Option("--include", metavar="NAME", help="Also send this file or folder of OUT (a name relative to OUT; repeatable).")] = None,
    unverified: Annotated[bool, typer.Option("--unverified", help="Push a folder rope-extend did not verify (no record, written with --no-verify, or a record without weights) as it is; the card sent says so.")] = False,
) -> None:
    """Upload a checkpoint folder to the Hugging Face Hub (creates the repo; a later push adds a commit)."""
    publish(folder, repo_id, private, dry_run, include or [], unverified=unverified)
