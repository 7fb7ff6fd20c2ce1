"""What `rope-extend push` may send from an output folder, decided from its record before any network call.

`select(OUT, include)` decides, nothing written and nothing sent:

- An OUT rope-extend wrote (its config.json carries the `rope_extend` marker, or it has a `rope_extend.yaml`) without
  a record sends nothing: one line says how to make one (write it again into a new folder). A record from before
  contents were recorded (names and inodes only) sends nothing either: `rope-extend verify OUT` records them.
- A folder that is not a checkpoint rope-extend verified (`unverified_reason`: no record, a record that says it is
  not verified, a record that lists no weight file) sends nothing, the line naming `patch` or `verify`, unless the
  push says `--unverified` (`select(..., unverified=True)`: the card it sends then says so). Top-level weights the
  record does not list are refused even when named: `rope-extend verify OUT` records the weights it verifies.
- A recorded file that changed since verification (`record.changes`) sends nothing: one line names each, with the
  command that re-verifies OUT as it is now and refreshes its card and record (`rope-extend verify OUT`). The card
  (README.md) is the exception: edited by hand it is the user's, sent as written.
- Otherwise a file is sent when it is a checkpoint's by the rule that decides what `--overwrite` may replace
  (`outputs.is_checkpoint_file`: config, weights, tokenizer files, the card, a license, rope-extend's own files; top
  level only), one the record lists (in a recorded OUT), and its bytes are OUT's alone: a regular file with one
  name, weights rope-extend shared as it recorded them (their inode), or, in a Hub cache snapshot
  (`models--org--name/snapshots/<rev>`), a link to a blob of the same repo (`files.source_file`'s rule) that has no
  other name.
- `--include NAME` sends a file (or a folder's files) of OUT on purpose, whatever its name; never one whose bytes
  are shared with a file rope-extend did not record (a hard link, a blob with other names), nor a name or link that
  resolves outside OUT. Metadata (`.git/`, huggingface_hub's `.cache/`, `.gitattributes`, `.DS_Store`) is left
  out; a file rope-extend carried from SOURCE that is not a checkpoint's (a subfolder such as Llama 3.1's
  `original/`, train's `adapter/`, a SOURCE's own notes) is left out unless included; anything else is refused, all
  of it named in one line.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .. import files, outputs
from ..errors import CheckpointError
from ..record import (
    CARD,
    CHUNK,
    METADATA,
    SPEC_FILE,
    Record,
    changes,
    is_top_weight,
    no_record_message,
    read_record,
    sha256,
    walk,
    written_by_rope_extend,
)
from ..spec import OUTPUT_RECORD_KEY
from ..terminal import shown_name

SHOWN = 8  # files named in a refusal
UNVERIFIED_WEIGHTS = ("weights rope-extend did not verify (not in its record: added or re-sharded since), refused "
                      "even when named")


@dataclass(frozen=True)
class Sent:
    name: str  # the path in the repo: POSIX, relative to OUT
    path: Path  # the file whose bytes go up (a Hub cache link's blob)
    how: str  # why it may go up, for the dry run


@dataclass
class Selection:
    """What a push of `folder` sends, leaves out and refuses, each with why (computed once, printed by the dry
    run, sent by the push)."""

    folder: Path
    record: Record | None
    hint: str = "--include {name}"  # how the caller's command sends a file on purpose
    sent: list[Sent] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    changed: list[tuple[str, str]] = field(default_factory=list)  # recorded files not as verified
    card_edited: bool = False  # README.md is not the card rope-extend wrote: sent as written
    no_record: str | None = None  # why OUT, written by rope-extend, has no record to send on
    unverified: str | None = None  # why OUT is not a checkpoint rope-extend verified (None: it is)
    allow_unverified: bool = False  # push --unverified: sent as it is, the card saying so
    unverified_hint: str = "--unverified"  # how the caller's command pushes an unverified OUT on purpose
    unverified_fix: str | None = None  # how to make a verified one, where `patch`/`verify` are not the way (a GGUF)

    @property
    def names(self) -> list[str]:
        return [entry.name for entry in self.sent]

    def refusal(self) -> CheckpointError | None:
        """One line: why nothing may be sent (no record; changed files, then refused ones, the first few of each
        named), and the way forward; or None."""
        if self.no_record is not None:
            return CheckpointError(self.no_record)
        if self.unverified is not None and not self.allow_unverified:
            return CheckpointError(self._unverified_refusal())
        if not self.changed and not self.refused:
            return None
        where, count = f"OUT {str(self.folder)!r}", len(self.refused)
        held = f"holds {count} {_plural(count, 'file')} a push may not send as the checkpoint's"
        if self.changed:
            what = f"{where} changed since rope-extend verified it, so nothing was sent: {_named(self.changed)}"
            what += f"; it also {held}: {_named(self.refused)}" if self.refused else ""
        else:
            what = f"{where} {held}, so nothing was sent: {_named(self.refused)}"
        fixes = []
        if self.changed:
            fixes.append(f"`rope-extend verify {shlex.quote(str(self.folder))}` re-verifies OUT as it is now (stock "
                         "reload and a forward beyond the original length) and refreshes its card and record; then "
                         "push again")
        blobs = sum(1 for _, why in self.refused if why.startswith("a Hub cache blob"))
        weights = sum(1 for _, why in self.refused if why == UNVERIFIED_WEIGHTS)
        if weights:  # moving them out would leave a checkpoint without its weights
            fixes.append(f"`rope-extend verify {shlex.quote(str(self.folder))}` verifies OUT with the weights it holds "
                         "now (stock reload and a forward beyond the original length on them) and records them; then "
                         "push again")
        if count > blobs + weights:
            them = "them" if count - blobs - weights != 1 else "it"
            fixes.append(f"move {them} out of OUT, or send a file you added on purpose with "
                         f"{self.hint.format(name='NAME')}")
        if blobs:  # a blob cannot be moved out of its snapshot
            fixes.append(f"a Hub cache blob stays in its cache: copy the snapshot's files into a new folder "
                         f"(cp -rL {shlex.quote(str(self.folder))} NEW) and push NEW")
        return CheckpointError(f"{what}; {'; '.join(fixes)}")


    def _unverified_refusal(self) -> str:
        quoted = shlex.quote(str(self.folder))
        if self.unverified_fix is not None:
            fix = self.unverified_fix
        elif self.record is None:
            fix = (f"write it with `rope-extend patch {quoted} --method METHOD --factor N -o NEW` (which verifies the "
                   "checkpoint it writes and records every file) and push NEW")
        else:
            fix = (f"`rope-extend verify {quoted}` verifies OUT as it is now (stock reload and a forward beyond the "
                   "original length) and records its files; then push again")
        return (f"OUT {str(self.folder)!r} is not a checkpoint rope-extend verified: {self.unverified}, so nothing "
                f"was sent (a push publishes what rope-extend wrote and verified); {fix}, or push it as it is with "
                f"{self.unverified_hint} (the card it sends then says rope-extend did not verify it)")


def unverified_reason(record: Record | None) -> str | None:
    """Why an OUT with `record` is not a checkpoint rope-extend verified, or None when it is: no record, a record
    that says it is not verified, or one that lists no weight file (it vouches for no model)."""
    if record is None:
        return (f"it holds no record of rope-extend's ({SPEC_FILE} with {OUTPUT_RECORD_KEY}), so rope-extend did not "
                "write or verify it")
    if not record.verified:
        return "its record says it is not verified (written with --no-verify, or kept after a failed verification)"
    if not record.weights:
        return "its record lists no weight file, so it vouches for no model"
    return None


def _named(items: list[tuple[str, str]]) -> str:
    shown = ", ".join(f"{shown_name(name)} ({why})" for name, why in items[:SHOWN])
    return shown + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def _plural(count: int, word: str) -> str:
    return word if count == 1 else word + "s"


def select(folder: Path, include: Sequence[str] = (), hint: str = "--include {name}", *, unverified: bool = False,
           unverified_hint: str = "--unverified") -> Selection:
    """What a push of `folder` sends (see the module docstring); no network, nothing written. `include` are the
    names of `push --include`; `hint` is how the caller's command sends a file on purpose (said in reasons);
    `unverified`: push --unverified (an OUT rope-extend did not verify is sent as it is), `unverified_hint` how the
    caller's command says so."""
    root = Path(os.path.abspath(folder))
    real_root = Path(os.path.realpath(root))
    record = read_record(root)
    chosen = _resolve_include(root, real_root, include)
    selection = Selection(folder=root, record=record, hint=hint, allow_unverified=unverified,
                          unverified_hint=unverified_hint)
    if record is None and written_by_rope_extend(root):
        selection.no_record = no_record_message(root)
        return selection
    if record is not None and not record.contents_known:
        selection.no_record = (
            f"OUT {str(root)!r} has a record from before rope-extend recorded the contents it vouches for (names "
            f"and inodes, not bytes), so nothing was sent: `rope-extend verify {shlex.quote(str(root))}` re-verifies "
            "OUT as it is now (stock reload and a forward beyond the original length) and records them; then push "
            "again")
        return selection
    selection.unverified = unverified_reason(record)
    if record is not None:
        for name, why in changes(root, record):
            if name == CARD and why == "edited":
                selection.card_edited = True  # the user's card: sent as written
            elif not (why == "missing" and not outputs.is_checkpoint_file(name)):
                selection.changed.append((name, why))
    seen = set()
    for rel, path in walk(root, metadata=selection.left_out):
        seen.add(rel)
        included = any(rel == name or rel.startswith(name + "/") for name in chosen)
        sent = _sendable(root, real_root, rel, path, record, included)  # links first: they say the most
        why = sent if isinstance(sent, str) else _refused_name(rel, record, included)
        if record is not None and rel not in record.files and is_top_weight(rel):
            why = UNVERIFIED_WEIGHTS  # sending them would publish weights no verification ran on
        if why is None:
            selection.sent.append(sent)
        elif not isinstance(sent, str) and record is not None and rel in record.files:
            # rope-extend carried it from SOURCE into OUT: not a file added to OUT, not a checkpoint's either
            selection.left_out.append((rel, f"{why}; rope-extend carried it from SOURCE ({hint.format(name=rel)} sends it)"))
        elif not any(rel == name for name, _ in selection.changed):
            selection.refused.append((rel, why))
    return selection


def _resolve_include(root: Path, real_root: Path, include: Sequence[str], flag: str = "--include") -> list[str]:
    """The names (relative to OUT) that `include` adds; each must name a file or a folder inside OUT that a push
    can send: not OUT itself, not metadata, not through a symbolic link."""
    chosen = []
    for item in include:
        example = f"(names are relative to OUT, e.g. {flag} notes.md)"
        if not item.strip():
            raise CheckpointError(f"{flag} {item!r} names nothing; give a file or folder inside OUT {example}")
        given = Path(item).expanduser()
        rel = Path(os.path.relpath(os.path.abspath(given), root)) if given.is_absolute() else given
        plain = Path(os.path.normpath(rel))  # extra/../NOTES.md is NOTES.md, unless a link makes `..` go elsewhere
        if (plain != rel and files.names_inside(plain) and os.path.lexists(root / rel)
                and os.path.realpath(root / rel) == os.path.realpath(root / plain)):
            rel = plain
        if rel.parts in ((), (".",)) or Path(os.path.normpath(rel)).parts in ((), (".",)):
            raise CheckpointError(f"{flag} {item!r} names OUT itself: a push already sends the checkpoint's files, "
                                  f"and {flag} adds one file or folder of OUT that is not one {example}")
        if not files.names_inside(rel):
            raise CheckpointError(f"{flag} {item!r} names a path outside OUT {str(root)!r}; a push sends files "
                                  f"inside OUT only {example}")
        path = root / rel
        if not path.exists() and not path.is_symlink():
            raise CheckpointError(f"{flag} {item!r}: OUT {str(root)!r} has no {rel.as_posix()!r} {example}")
        real = Path(os.path.realpath(path))
        if real != real_root and real_root not in real.parents and not _cache_link(root, rel):
            raise CheckpointError(f"{flag} {item!r} resolves to {str(real)!r}, outside OUT; a push sends files inside "
                                  "OUT only: copy it into OUT to send it")
        if rel.parts[0] in METADATA:
            raise CheckpointError(f"{flag} {item!r} is {METADATA[rel.parts[0]]}, which a push never uploads")
        through = next((Path(*rel.parts[: i + 1]) for i in range(len(rel.parts))
                        if (root / Path(*rel.parts[: i + 1])).is_symlink() and (root / Path(*rel.parts[: i + 1])).is_dir()),
                       None)
        if through is not None:
            own = real.relative_to(real_root).as_posix() if real != real_root else "."
            raise CheckpointError(f"{flag} {item!r} goes through {through.as_posix()!r}, a symbolic link to a folder; "
                                  f"a push does not follow folders through links: name it by its own path, {flag} "
                                  f"{own}")
        chosen.append(rel.as_posix())
    return chosen


def _cache_link(root: Path, rel: Path) -> bool:
    """Whether `rel` is, in a Hub cache snapshot, a link to a blob of the same repo (its own file, not outside)."""
    try:
        files.source_file(root, rel)
    except CheckpointError:
        return False
    return (root / rel).is_symlink()


def _refused_name(rel: str, record: Record | None, included: bool) -> str | None:
    """Why a name may not be sent (None: it may, if its link checks pass)."""
    if included:
        return None
    if "/" in rel:
        return "in a subfolder; a checkpoint's files are at its top level"
    if not outputs.is_checkpoint_file(rel):
        return "not a file of a checkpoint"
    if record is not None and rel not in record.files:
        return "not among the files rope-extend recorded in rope_extend.yaml; added to OUT later"
    return None


def _is_cache_object(blob: Path) -> bool:
    """Whether a Hub cache blob's bytes are the object its name says: huggingface_hub names an LFS file's blob by
    the sha256 of its bytes and a small file's by its git blob id (sha1 of `blob <size>\\0` and the bytes). Then
    other names of it (a hard link made from OUT, `patch`'s own) cannot have changed what is sent."""
    name = blob.name
    if len(name) == 64:
        return sha256(blob) == name
    if len(name) == 40:
        digest = hashlib.sha1(f"blob {blob.stat().st_size}\0".encode())
        with open(blob, "rb") as handle:
            while chunk := handle.read(CHUNK):
                digest.update(chunk)
        return digest.hexdigest() == name
    return False


def _sendable(root: Path, real_root: Path, rel: str, path: Path, record: Record | None, included: bool) -> Sent | str:
    """The file to send for `rel`, or why it may not be sent (links, bytes shared with other files, not a regular
    file): whether included or not, a file whose bytes are another file's is never sent, unless rope-extend shared
    them (SOURCE's weights) as its record says."""
    parts = Path(rel).parts
    if any((root / Path(*parts[: i + 1])).is_symlink() for i in range(len(parts))):
        target = Path(os.path.realpath(path))
        try:
            blob = files.source_file(root, Path(rel))  # a Hub cache snapshot's link to its repo's blob
        except CheckpointError:
            blob = None
        if blob is not None:
            names = os.stat(blob).st_nlink
            if names > 1 and not _is_cache_object(blob):
                return (f"a Hub cache blob with {names} names whose bytes do not hash to its name: they are another "
                        "file's (a hard link), so it is never sent, even when named")
            if names > 1:  # e.g. rope-extend's own hard links from the OUTs patched from this snapshot
                return Sent(rel, blob, f"Hub cache blob, its bytes the repo's (they hash to its name; {names} names)")
            return Sent(rel, blob, "Hub cache blob")
        where = "outside OUT" if real_root not in target.parents else "inside OUT"
        if not target.exists():
            return f"a broken symbolic link to {str(target)!r}"
        if target.is_dir():
            return f"a symbolic link to the folder {str(target)!r}, {where}; folders are not followed through links"
        if included and where == "inside OUT":
            inside = target.relative_to(real_root).as_posix()
            if os.stat(target).st_nlink > 1:
                return f"a symbolic link to {inside}, a hard link: its bytes are shared with another file"
            return Sent(rel, target, f"included on purpose, a link to {inside}")
        return f"a symbolic link to {str(target)!r}, {where}"
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    entry = record.entries.get(rel) if record is not None else None
    if entry is not None and entry.shared is not None and entry.inode == info.st_ino:
        return Sent(rel, path, f"weights rope-extend shared with SOURCE, {entry.shared}")
    if info.st_nlink > 1:
        unrecorded = "OUT has no rope-extend record" if record is None else "rope-extend did not make it"
        return (f"a hard link ({info.st_nlink} names) and {unrecorded}: its bytes are shared with another file, maybe "
                "outside OUT, so it is never sent, even when named; copy it into OUT (cp, not ln) to send it")
    return Sent(rel, path, "included on purpose" if included else "a file of OUT")
