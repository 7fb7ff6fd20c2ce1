"""A push planned once (`PushPlan`): what it sends (`selection.select`), the cards it sends from memory, its commit
message, and the lines its dry run prints; no network, nothing written. The token a push needs is found here too
(never printed, logged or written)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError
from ..hub import check_repo_id
from ..record import CARD, SPEC_FILE, public_text, spec_text
from ..terminal import shown_name
from .cards import gguf_card, unverified_card, with_serving
from .selection import Selection, Sent, select


@dataclass
class PushPlan:
    """What a push sends: computed once by `plan_push`, printed by `--dry-run`, executed by `push`."""

    folder: Path
    repo_id: str
    private: bool
    selection: Selection
    commit_message: str
    card: bytes | None = None  # OUT's README.md with its Serving section naming `repo_id` (None: sent as it is)
    record_text: bytes | None = None  # OUT's rope_extend.yaml without this machine's data (`record.public_text`)
    serve: str | None = None  # the serve line for the pushed repo (from OUT's record)
    written_now: bool = False  # `patch`/`train --push-to-hub`: OUT was just written, its command is news
    include: tuple[str, ...] = ()  # push's --include names (the push-later command repeats them)
    unverified: bool = False  # push --unverified (the push-later command repeats it)
    url: str = ""
    transfer: object = None  # upload.Transfer of the push that ran (what was sent, what the Hub held)

    @property
    def files(self) -> list[str]:
        return self.selection.names

    @property
    def later(self) -> str:
        """The one command that pushes `folder` (what a failure a retry can fix prints)."""
        return (f"rope-extend push {shlex.quote(str(self.folder))} {self.repo_id}" + (" --private" if self.private else "")
                + "".join(f" --include {shlex.quote(name)}" for name in self.include)
                + (" --unverified" if self.unverified else ""))

    def kept(self, retry: bool = False) -> str:
        """How a failure ends: OUT is kept as it was, and, when a retry can fix the failure (network, 5xx), the
        command that pushes it later; after an auth failure of `--push-to-hub`, the command to run once fixed."""
        where = f"; OUT {str(self.folder)!r} is kept as it is"
        if retry:
            return f"{where}: push it later with `{self.later}` (it sends only what the Hub does not hold yet)"
        return f"{where}: once that is fixed, push it with `{self.later}`" if self.written_now else where

    def dry_run_lines(self) -> list[str]:
        """The dry run's report: the repo, its visibility, the commit message, every file sent (and why it may
        be), left out or refused (and why)."""
        selection = self.selection
        changed = {name for name, _ in selection.changed}
        sendable = [entry for entry in selection.sent if entry.name not in changed]
        if selection.refusal() is None:
            head = (f"dry run: would push {files_count(len(sendable))} to {self.repo_id} "
                    f"({'private' if self.private else 'public'} if created; an existing repo keeps its visibility)")
        else:  # the push would be refused: nothing is sent, and the count says so
            why = [f"{len(changed)} changed since verification (!)" if changed else "",
                   f"{len(selection.refused)} refused (x)" if selection.refused else ""]
            head = (f"dry run: a push to {self.repo_id} would send nothing: {files_count(len(changed) + len(selection.refused))} "
                    f"it may not send, {' and '.join(w for w in why if w)}; the {files_count(len(sendable))} marked + "
                    "would go once they are dealt with")
        lines = [head, f"commit message: {self.commit_message}"]
        if selection.unverified is not None and selection.allow_unverified:
            lines.append(f"--unverified: {selection.unverified}; the {CARD} sent says rope-extend did not verify it "
                         "(OUT's copy is not changed)")
        elif self.card is not None:
            lines.append(f"{CARD}: sent with its Serving section naming {self.repo_id} (OUT's copy is not changed)")
        elif selection.card_edited:
            lines.append(f"{CARD}: edited since rope-extend wrote it: yours, sent as written")
        if find_token() is None:
            lines.append("no Hugging Face token is set: the push itself would stop before sending anything; set "
                         "HF_TOKEN to a token with write access or log in once with `hf auth login`")
        if self.record_text is not None:
            lines.append(f"{SPEC_FILE}: sent without this machine's data (inodes, times), its serving commands naming "
                         f"{self.repo_id}; OUT's copy is not changed")
        lines += [f"  + {shown_name(entry.name)}   ({entry.how})" for entry in sendable]
        lines += [f"  - {shown_name(name)}   (left out: {why})" for name, why in selection.left_out]
        lines += [f"  x {shown_name(name)}   (refused: {why})" for name, why in selection.refused]
        lines += [f"  ! {shown_name(name)}   (changed since rope-extend verified it: {why})"
                  for name, why in selection.changed]
        return lines


def files_count(count: int) -> str:
    """'1 file', '6 files'."""
    return f"{count} file" + ("" if count == 1 else "s")


def plan_push(folder: str | os.PathLike, repo_id: str, private: bool, include: Sequence[str] = (), *,
              flag: str = "REPO", written_now: bool = False, unverified: bool = False) -> PushPlan:
    """Check the repo id and OUT and compute the upload (`selection.select`); no network, nothing written. Refused
    files are in `plan.selection.refused` (`selection.refusal()` is the error the push raises). `unverified`: push
    --unverified, an OUT rope-extend did not verify sent as it is with a card that says so."""
    check_repo_id(repo_id, flag)
    folder = _checkpoint_folder(folder)
    if folder.is_file():  # a GGUF (anything else was refused)
        return plan_gguf_push(folder, repo_id, private, written_now=written_now, unverified=unverified)
    command = f"rope-extend push {shlex.quote(str(folder))} {repo_id}"
    hint = (f"`{command} --include {{name}}`" if written_now
            else "--include {name}")  # patch and train have no --include: the push command does
    selection = select(folder, include, hint, unverified=unverified,
                       unverified_hint=f"`{command} --unverified`" if written_now else "--unverified")
    record = selection.record
    card = _card_sent(selection, repo_id, unverified)
    spec = spec_text(folder)
    what = " ".join(spec.split()) if spec else f"upload {folder.name}"
    sends_record = record is not None and any(entry.name == SPEC_FILE for entry in selection.sent)
    return PushPlan(folder=folder, repo_id=repo_id, private=private, selection=selection,
                    commit_message=("rope-extend: " + what)[:1000], card=card,
                    record_text=public_text(folder, record, card, repo_id).encode("utf-8") if sends_record else None,
                    serve=record.serve_for(repo_id) if record is not None else None, written_now=written_now,
                    include=tuple(include), unverified=unverified and selection.unverified is not None)


def _checkpoint_folder(folder: str | os.PathLike) -> Path:
    """OUT as an absolute path: a checkpoint folder (with config.json) or a GGUF file; anything else refused."""
    from ..gguf.binary import is_gguf

    given = str(folder)
    folder = Path(folder).expanduser()
    if not folder.exists():
        raise CheckpointError(f"OUT {given!r} does not exist; give the folder `rope-extend patch` or `train` wrote")
    if folder.is_file():
        if is_gguf(folder):
            return folder
        raise CheckpointError(f"OUT {given!r} is a file, not a GGUF; give the checkpoint folder (with config.json) "
                              "or a .gguf file")
    if not folder.is_dir():
        raise CheckpointError(f"OUT {given!r} is neither a folder nor a file; give the checkpoint folder")
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"OUT {given!r} is not a checkpoint folder (no config.json); give the folder "
                              "`rope-extend patch` or `train` wrote")
    return Path(os.path.abspath(folder))


def _card_sent(selection: Selection, repo_id: str, unverified: bool) -> bytes | None:
    """The card the push sends instead of OUT's README.md, or None (OUT's is sent as it is): its Serving section
    renamed for `repo_id` (a card rope-extend wrote, not edited since), and with `--unverified` the note that
    rope-extend did not verify OUT (a card written for an OUT that has none)."""
    record, card = selection.record, None
    readme = next((entry for entry in selection.sent if entry.name == CARD), None)
    if record is not None and record.serving is not None and readme is not None and not selection.card_edited:
        text = _read_card(readme.path)  # None: not a card rope-extend wrote, sent as it is
        new = text and with_serving(text, record.serving_for(repo_id))
        card = None if new == text else new.encode("utf-8")
    if selection.unverified is None or not unverified:
        return card
    if readme is None:  # the card sent says so, whatever OUT's says
        readme = Sent(CARD, selection.folder / CARD, "written by this push (OUT has none): it says rope-extend did "
                                                     "not verify this folder")
        selection.sent = sorted([*selection.sent, readme], key=lambda entry: entry.name)
        text = None
    else:
        text = card.decode("utf-8") if card is not None else _read_card(readme.path)
    return unverified_card(text, selection.folder.name, selection.unverified).encode("utf-8")


def _read_card(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def plan_gguf_push(path: Path, repo_id: str, private: bool, *, written_now: bool = False,
                   unverified: bool = False) -> PushPlan:
    """A push of one GGUF file as a GGUF repo: the file and a card (sent from memory) saying what llama.cpp reads
    from its metadata and how to serve it from the repo. A GGUF holds no rope-extend record, so it goes only with
    `unverified` (the card says so). Its header is read first: what is not a model GGUF is refused in one line."""
    from ..gguf.info import read_gguf_info

    path = Path(os.path.abspath(path))
    info = read_gguf_info(path)
    command = f"rope-extend push {shlex.quote(str(path))} {repo_id} --unverified"
    selection = Selection(folder=path, record=None, allow_unverified=unverified,
                          unverified_hint=f"`{command}`" if written_now else "--unverified")
    selection.unverified = ("it is a GGUF file, which keeps no record of rope-extend's (its metadata is what "
                            "llama.cpp reads), so rope-extend cannot say it wrote and verified it")
    selection.unverified_fix = ("`rope-extend patch` checks the GGUF it writes against llama.cpp's RoPE math, but "
                                "keeps no record inside it either")
    selection.sent = [Sent(CARD, path.with_name(CARD), "written by this push: what llama.cpp reads from the file, "
                                                       "how to serve it"),
                      Sent(path.name, path, "the GGUF file")]
    return PushPlan(folder=path, repo_id=repo_id, private=private, selection=selection,
                    commit_message=f"rope-extend: upload {path.name}",
                    card=gguf_card(info, repo_id, path.name, selection.unverified).encode("utf-8"),
                    written_now=written_now, unverified=unverified)


def find_token() -> str | None:
    """HF_TOKEN, else huggingface_hub's stored token (`hf auth login`), else None (never printed)."""
    from huggingface_hub import get_token

    return os.environ.get("HF_TOKEN") or get_token() or None


def hub_token(where: str = "") -> str:
    """HF_TOKEN, else huggingface_hub's stored token (`hf auth login`); a missing one is refused here, before any
    network call. The token goes to huggingface_hub only: never printed, logged or written."""
    token = find_token()
    if not token:
        raise CheckpointError(
            "no Hugging Face token: set HF_TOKEN to a token with write access or log in once with `hf auth login`"
            + where
        )
    return token
