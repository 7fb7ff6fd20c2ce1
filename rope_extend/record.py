"""What an output folder consists of: rope-extend's record of it, and from that record and the checkpoint rule of
`rope_extend.outputs`, exactly the files `rope-extend push` may send.

`patch` and `train` end by writing OUT's `rope_extend.yaml`: the spec, then under `output_record` every file they
put into OUT, the inode of each hard link they made (weights and tokenizer files linked from SOURCE or from its Hub
cache blobs), and the card's serving commands with the model's name written `ROPE_EXTEND_MODEL_ID`, so a push
renders them for its repo id by reading the record, without planning the patch again.

`select(OUT, include)` decides, before any network call, what a push sends. A file is sent when it is

- a file of a checkpoint by the rule that decides what `--overwrite` may replace (`outputs.is_checkpoint_file`:
  config, weights, tokenizer files, the card, a license, rope-extend's own files; top level only), and
- in an OUT that rope-extend recorded, one the record lists, and
- a regular file of OUT (one name), or a hard link whose inode the record holds, or, in a Hub cache snapshot
  (`models--org--name/snapshots/<rev>`), a link to a blob of the same repo (`files.source_file`'s rule).

`--include NAME` sends a file (or a folder's files) of OUT on purpose, whatever its name; a name or link that
resolves outside OUT is refused even then. Metadata (`.git/`, huggingface_hub's `.cache/`, `.gitattributes`,
`.DS_Store`) is left out; a file rope-extend carried from SOURCE that is not a checkpoint's (a subfolder such as
Llama 3.1's `original/`, train's `adapter/`, a SOURCE's own notes) is left out unless included; anything else is
refused, all of it named in one line.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import files, outputs
from .errors import CheckpointError
from .spec import OUTPUT_RECORD_KEY

SPEC_FILE = "rope_extend.yaml"
MODEL_ID = "ROPE_EXTEND_MODEL_ID"  # the model's name in the recorded serving commands; a push writes its repo id
METADATA = {".git": "git metadata", ".cache": "huggingface_hub's download metadata",
            ".gitattributes": "git metadata (the Hub keeps its own)", ".DS_Store": "a Finder file"}
RECORD_NOTE = (f"# {OUTPUT_RECORD_KEY}: rope-extend's record of this folder, not part of the spec: the files it "
               "wrote, the hard links it made (name: inode), the card's serving commands. `rope-extend push` sends "
               "these files and no other.\n")
SHOWN = 8  # files named in a refusal


# --- the record ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Record:
    """`output_record` of an OUT's rope_extend.yaml, plus the spec beside it."""

    spec: dict
    files: frozenset[str]  # POSIX paths relative to OUT
    hard_links: dict[str, int]  # name -> the inode rope-extend linked
    serve: str | None = None  # serving.serve_command with the name MODEL_ID
    serving: str | None = None  # the card's Serving section (serving.serving_hints) with the name MODEL_ID

    def serve_for(self, repo_id: str) -> str | None:
        return None if self.serve is None else self.serve.replace(MODEL_ID, repo_id)

    def serving_for(self, repo_id: str) -> str | None:
        return None if self.serving is None else self.serving.replace(MODEL_ID, repo_id)


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def write_record(folder: Path, spec_yaml: str, serve: str | None = None, serving: str | None = None) -> None:
    """Write `folder`'s rope_extend.yaml: `spec_yaml`, then the record of every file now in `folder` (call it last,
    when everything else is written) and the serving commands (written with the name `MODEL_ID`)."""
    names = sorted({rel for rel, _ in _walk(folder)} | {SPEC_FILE})
    links = {}
    for name in names:
        info = os.lstat(folder / name) if name != SPEC_FILE else None
        if info is not None and stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
            links[name] = info.st_ino
    record = {"files": names, "hard_links": links, "serve": serve, "serving": serving}
    text = yaml.dump({OUTPUT_RECORD_KEY: record}, Dumper=_Dumper, sort_keys=False, width=1_000_000,
                     allow_unicode=True)
    (folder / SPEC_FILE).write_text(spec_yaml + RECORD_NOTE + text, encoding="utf-8")


def read_record(folder: Path) -> Record | None:
    """The record of an OUT rope-extend wrote, or None when it has none (a clean checkpoint, or an OUT written
    before rope-extend recorded its outputs). A damaged record is a CheckpointError: nothing is sent on its word."""
    from .spec import MAX_SPEC_BYTES, _load_yaml_text

    path = folder / SPEC_FILE
    if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_SPEC_BYTES:
        return None
    fix = "rewrite OUT with `rope-extend patch` (or `train`), or remove rope_extend.yaml to push it as a plain checkpoint"
    try:
        data = _load_yaml_text(path.read_text(encoding="utf-8"), f"{SPEC_FILE} {str(path)!r}")
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"{exc}; {fix}") from None
    if not isinstance(data, dict) or OUTPUT_RECORD_KEY not in data:
        return None
    raw = data.pop(OUTPUT_RECORD_KEY)
    raw = raw if isinstance(raw, dict) else {}
    names, links, texts = raw.get("files"), raw.get("hard_links"), [raw.get("serve"), raw.get("serving")]
    if not (isinstance(names, list) and all(isinstance(n, str) and files._names_inside(Path(n)) for n in names)
            and isinstance(links, dict) and all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                                for k, v in links.items())
            and all(t is None or isinstance(t, str) for t in texts)):
        raise CheckpointError(f"{str(path)!r}: rope-extend's {OUTPUT_RECORD_KEY} is damaged (files must be a list of "
                              f"names inside OUT, hard_links names with inodes); {fix}")
    return Record(spec=data, files=frozenset(names), hard_links=dict(links), serve=texts[0], serving=texts[1])


def spec_text(folder: Path) -> str | None:
    """The spec part of OUT's rope_extend.yaml, as written (the record left out), or None without one."""
    path = folder / SPEC_FILE
    if not path.is_file() or path.is_symlink():
        return None
    text = path.read_text(encoding="utf-8", errors="replace")
    return text.split(RECORD_NOTE, 1)[0].split(f"\n{OUTPUT_RECORD_KEY}:", 1)[0]


# --- what a push sends -----------------------------------------------------------------------------------------------
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

    @property
    def names(self) -> list[str]:
        return [entry.name for entry in self.sent]

    def refusal(self) -> CheckpointError | None:
        """One line naming every refused file (the first few, then how many more), or None."""
        if not self.refused:
            return None
        shown = ", ".join(f"{name} ({why})" for name, why in self.refused[:SHOWN])
        more = f" and {len(self.refused) - SHOWN} more" if len(self.refused) > SHOWN else ""
        many = len(self.refused) != 1
        return CheckpointError(
            f"OUT {str(self.folder)!r} holds {len(self.refused)} file{'s' * many} a push may not send as the "
            f"checkpoint's, so nothing was sent: {shown}{more}; move {'them' if many else 'it'} out of OUT, or send "
            f"a file inside OUT on purpose with {self.hint.format(name='NAME')}"
        )


def select(folder: Path, include: Sequence[str] = (), hint: str = "--include {name}") -> Selection:
    """What a push of `folder` sends (see the module docstring); no network, nothing written. `include` are the
    names of `push --include`; `hint` is how the caller's command sends a file on purpose (said in reasons)."""
    root = Path(os.path.abspath(folder))
    real_root = Path(os.path.realpath(root))
    record = read_record(root)
    chosen = _resolve_include(root, real_root, include)
    selection = Selection(folder=root, record=record, hint=hint)
    seen = set()
    for rel, path in _walk(root, metadata=selection.left_out):
        seen.add(rel)
        included = any(rel == name or rel.startswith(name + "/") for name in chosen)
        sent = _sendable(root, real_root, rel, path, record, included)  # links first: they say the most
        why = sent if isinstance(sent, str) else _refused_name(rel, record, included)
        if why is None:
            selection.sent.append(sent)
        elif not isinstance(sent, str) and record is not None and rel in record.files:
            # rope-extend carried it from SOURCE into OUT: not a file added to OUT, not a checkpoint's either
            selection.left_out.append((rel, f"{why}; rope-extend carried it from SOURCE ({hint.format(name=rel)} sends it)"))
        else:
            selection.refused.append((rel, why))
    if record is not None:  # a checkpoint's file rope-extend wrote and OUT lost: the push would publish a broken model
        selection.refused += [(name, "rope-extend wrote it, but it is missing from OUT; rewrite OUT")
                              for name in sorted(record.files - seen) if outputs.is_checkpoint_file(name)]
    return selection


def _walk(root: Path, metadata: list | None = None) -> Iterator[tuple[str, Path]]:
    """(POSIX name relative to root, path) of every file and link under root, sorted; links to folders are
    entries, never followed. Metadata (`METADATA`) is skipped, and noted in `metadata` when given."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        top = here == root
        for name in sorted(dirnames):
            if top and name in METADATA:
                dirnames.remove(name)
                if metadata is not None:
                    metadata.append((name + "/", METADATA[name] + ", never uploaded"))
            elif (here / name).is_symlink():
                dirnames.remove(name)
                found.append(here / name)
        for name in filenames:
            if top and name in METADATA:
                if metadata is not None:
                    metadata.append((name, METADATA[name] + ", never uploaded"))
                continue
            found.append(here / name)
    for path in sorted(found):
        yield path.relative_to(root).as_posix(), path


def _resolve_include(root: Path, real_root: Path, include: Sequence[str], flag: str = "--include") -> list[str]:
    """The names (relative to OUT) that `include` adds; each must name something inside OUT."""
    chosen = []
    for item in include:
        given = Path(item).expanduser()
        rel = Path(os.path.relpath(os.path.abspath(given), root)) if given.is_absolute() else given
        if not files._names_inside(rel):
            raise CheckpointError(f"{flag} {item!r} names a path outside OUT {str(root)!r}; a push sends files "
                                  f"inside OUT only (names are relative to OUT, e.g. {flag} notes.md)")
        path = root / rel
        if not path.exists() and not path.is_symlink():
            raise CheckpointError(f"{flag} {item!r}: OUT {str(root)!r} has no {rel.as_posix()!r} (names are relative "
                                  "to OUT)")
        real = Path(os.path.realpath(path))
        if real != real_root and real_root not in real.parents:
            raise CheckpointError(f"{flag} {item!r} resolves to {str(real)!r}, outside OUT; a push sends files inside "
                                  "OUT only: copy it into OUT to send it")
        chosen.append(rel.as_posix())
    return chosen


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


def _sendable(root: Path, real_root: Path, rel: str, path: Path, record: Record | None, included: bool) -> Sent | str:
    """The file to send for `rel`, or why it may not be sent (links, hard links, not a regular file)."""
    parts = Path(rel).parts
    if any((root / Path(*parts[: i + 1])).is_symlink() for i in range(len(parts))):
        target = Path(os.path.realpath(path))
        try:
            blob = files.source_file(root, Path(rel))  # a Hub cache snapshot's link to its repo's blob
            return Sent(rel, blob, "Hub cache blob")
        except CheckpointError:
            pass
        where = "outside OUT" if real_root not in target.parents else "inside OUT"
        if not target.exists():
            return f"a broken symbolic link to {str(target)!r}"
        if target.is_dir():
            return f"a symbolic link to the folder {str(target)!r}, {where}; folders are not followed through links"
        if included and where == "inside OUT":
            return Sent(rel, target, f"included on purpose, a link to {target.relative_to(real_root).as_posix()}")
        return f"a symbolic link to {str(target)!r}, {where}"
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_nlink > 1:
        if record is not None and record.hard_links.get(rel) == info.st_ino:
            return Sent(rel, path, "a hard link rope-extend made")
        if not included:
            unrecorded = "OUT has no rope-extend record" if record is None else "rope-extend did not record it"
            return (f"a hard link ({info.st_nlink} names) and {unrecorded}; its other names may lie outside OUT")
    return Sent(rel, path, "included on purpose" if included else "a file of OUT")
