"""What an output folder consists of, what rope-extend vouches for in it, and from that exactly the files
`rope-extend push` may send.

**The record.** `patch`, `train` and `verify` end by writing OUT's `rope_extend.yaml`: the spec, then under
`output_record` whether OUT was verified, every file they put into OUT with what identifies its contents, and the
card's serving commands with the model's name written `ROPE_EXTEND_MODEL_ID` (a push renders them for its repo id,
without planning the patch again):

- a file rope-extend wrote or copied (config.json, tokenizer files, templates, the card, weights a full patch or
  `train` saved): the sha256 of its bytes (`rope_extend.yaml`'s own entry: of its spec part);
- weights it shared with SOURCE (`rope_extend.sharing`: a copy-on-write clone or a hard link, never read, so O(1) in
  their size): how, their size, modification time and inode.

`changes(OUT, record)` says which recorded files are not what was verified (edited, replaced, missing, hard-linked
since); `public_text` is the record as a push uploads it: the hashes and sizes, nothing of this machine (no inode,
time or path).

**What a push sends.** `select(OUT, include)` decides, before any network call:

- An OUT rope-extend wrote (its config.json carries the `rope_extend` marker, or it has a `rope_extend.yaml`) without
  a record sends nothing: one line says how to make one (write it again into a new folder). A record from before
  contents were recorded (names and inodes only) sends nothing either: `rope-extend verify OUT` records them.
- A folder that is not a checkpoint rope-extend verified (`unverified_reason`: no record, a record that says it is
  not verified, a record that lists no weight file) sends nothing, the line naming `patch` or `verify`, unless the
  push says `--unverified` (`select(..., unverified=True)`: the card it sends then says so). Top-level weights the
  record does not list are refused even when named: `rope-extend verify OUT` records the weights it verifies.
- A recorded file that changed since verification sends nothing: one line names each, with the command that
  re-verifies OUT as it is now and refreshes its card and record (`rope-extend verify OUT`). The card (README.md) is
  the exception: edited by hand it is the user's, sent as written.
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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import files, outputs, sharing
from .errors import CheckpointError
from .spec import OUTPUT_RECORD_KEY

SPEC_FILE = "rope_extend.yaml"
CARD = "README.md"
MODEL_ID = "ROPE_EXTEND_MODEL_ID"  # the model's name in the recorded serving commands; a push writes its repo id
METADATA = {".git": "git metadata", ".cache": "huggingface_hub's download metadata",
            ".gitattributes": "git metadata (the Hub keeps its own)", ".DS_Store": "a Finder file"}
RECORD_NOTE = (f"# {OUTPUT_RECORD_KEY}: rope-extend's record of this folder, not part of the spec: whether it was "
               "verified, every file it wrote or copied (sha256) and the weights it shared with SOURCE (how, size, "
               "time, inode), the card's serving commands. `rope-extend push` sends these files, as recorded, and no "
               "other.\n")
PUBLIC_NOTE = (f"# {OUTPUT_RECORD_KEY}: rope-extend's record of this checkpoint as it was pushed, not part of the "
               "spec: whether it was verified, every file with the sha256 of its bytes (weights shared with the base "
               "model by their size), the serving commands for model_id. `rope-extend push` of a download of this "
               "repo sends these files, as recorded, and no other.\n")
SHOWN = 8  # files named in a refusal
WEIGHT_INDEX = ".safetensors.index.json"
UNVERIFIED_WEIGHTS = ("weights rope-extend did not verify (not in its record: added or re-sharded since), refused "
                      "even when named")
CHUNK = 1 << 20


# --- the record ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    """What the record knows of one file of OUT: the sha256 of bytes rope-extend wrote or copied, or, for weights it
    shared with SOURCE, how (`sharing.CLONED` / `HARD_LINKED`) and their O(1) identity (size, mtime_ns, inode). A
    record downloaded from the Hub keeps the hashes and sizes only."""

    sha256: str | None = None
    shared: str | None = None
    size: int | None = None
    mtime_ns: int | None = None
    inode: int | None = None

    def public(self) -> str:
        """The entry as a push uploads it, nothing of this machine: 'sha256 <hex>' or 'size <bytes>'."""
        return f"sha256 {self.sha256}" if self.sha256 else f"size {self.size}"

    def local(self) -> str:
        """The entry as OUT's record holds it: 'sha256 <hex>', or '<how> size N mtime_ns N inode N' (one string per
        file, so the record stays as flat as a spec: `rope-extend patch --config OUT/rope_extend.yaml` reads it)."""
        if self.sha256:
            return f"sha256 {self.sha256}"
        return f"{self.shared} size {self.size} mtime_ns {self.mtime_ns} inode {self.inode}"

    @classmethod
    def parse(cls, text: str) -> Entry:
        """An entry from `local` or `public` text; ValueError when it is neither."""
        words = str(text).split()
        if len(words) == 2 and words[0] == "sha256" and len(words[1]) == 64:
            int(words[1], 16)
            return cls(sha256=words[1])
        shared = words.pop(0) if len(words) % 2 and words[0] in sharing.SHARED else None
        fields = dict(zip(words[::2], words[1::2]))
        if len(words) % 2 or not fields or set(fields) - {"size", "mtime_ns", "inode"} or "size" not in fields:
            raise ValueError(text)
        numbers = {key: int(value) for key, value in fields.items()}
        return cls(shared=shared, **numbers)


@dataclass(frozen=True)
class Record:
    """`output_record` of an OUT's rope_extend.yaml, plus the spec beside it."""

    spec: dict
    entries: dict[str, Entry]  # POSIX paths relative to OUT -> what identifies their contents
    verified: bool = True
    serve: str | None = None  # serving.serve_command with the name MODEL_ID
    serving: str | None = None  # the card's Serving section (serving.serving_hints) with the name MODEL_ID
    contents_known: bool = True  # False: written before rope-extend recorded contents (names and inodes only)

    @property
    def files(self) -> frozenset[str]:
        return frozenset(self.entries)

    @property
    def weights(self) -> list[str]:
        """The weight files the record vouches for (top level: a checkpoint's weights)."""
        return sorted(name for name in self.entries if is_top_weight(name))

    def serve_for(self, repo_id: str) -> str | None:
        return None if self.serve is None else self.serve.replace(MODEL_ID, repo_id)

    def serving_for(self, repo_id: str) -> str | None:
        return None if self.serving is None else self.serving.replace(MODEL_ID, repo_id)


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def _text(spec_yaml: str, verified: bool, entries: Mapping[str, str], serve: str | None, serving: str | None,
          model_id: str | None = None) -> str:
    record = {"verified": verified, "files": dict(entries), "serve": serve, "serving": serving}
    record = record if model_id is None else {"model_id": model_id, **record}
    return spec_yaml + (RECORD_NOTE if model_id is None else PUBLIC_NOTE) + yaml.dump({OUTPUT_RECORD_KEY: record}, Dumper=_Dumper, sort_keys=False,
                                               width=1_000_000, allow_unicode=True)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def entry_of(path: Path, shared: str | None = None) -> Entry:
    """The entry of a file as it is now: shared weights by their identity (O(1)), anything else by its sha256."""
    if shared in sharing.SHARED:
        info = os.stat(path)
        return Entry(shared=shared, size=info.st_size, mtime_ns=info.st_mtime_ns, inode=info.st_ino)
    return Entry(sha256=sha256(path))


def write_record(folder: Path, spec_yaml: str, serve: str | None = None, serving: str | None = None, *,
                 shared: Mapping[str, str] | None = None, verified: bool = True,
                 names: Sequence[str] | None = None) -> None:
    """Write `folder`'s rope_extend.yaml: `spec_yaml`, then the record of every file now in `folder` (or of `names`;
    call it last, when everything else is written), `shared` naming the weights shared with SOURCE (name -> how,
    `rope_extend.sharing`), and the serving commands (written with the name `MODEL_ID`)."""
    shared = shared or {}
    found = sorted({rel for rel, _ in walk(folder)} - {SPEC_FILE} if names is None else set(names) - {SPEC_FILE})
    entries = {name: entry_of(folder / name, shared.get(name)).local() for name in found}
    entries[SPEC_FILE] = Entry(sha256=hashlib.sha256(spec_yaml.encode("utf-8")).hexdigest()).local()
    write_fresh(folder / SPEC_FILE, _text(spec_yaml, verified, dict(sorted(entries.items())), serve, serving))


def write_fresh(path: Path, text: str) -> None:
    """Write `text` as a new file renamed over `path`: never through a link (a hard link's other names, a Hub cache
    blob), and never half written."""
    fresh = path.with_name(f".{path.name}.rope-extend-{os.getpid()}")
    try:
        fresh.write_text(text, encoding="utf-8")
        os.replace(fresh, path)
    finally:
        if fresh.exists():
            fresh.unlink()


def refresh(folder: Path, recorded: Record, verified: bool = True, added: Sequence[str] = ()) -> None:
    """Rewrite `folder`'s record from `recorded`: the same files, those still there, and `added` (weights verified
    since), with their contents as they are now (the weights `recorded` shared by their identity), the same serving
    commands, and `verified`."""
    still = sorted({name for name in recorded.files if os.path.lexists(folder / name)} | set(added))
    shared = {name: entry.shared for name, entry in recorded.entries.items()  # still SOURCE's bytes: same inode
              if entry.shared in sharing.SHARED and name in still and os.stat(folder / name).st_ino == entry.inode}
    write_record(folder, spec_text(folder) or "", recorded.serve, recorded.serving, shared=shared, verified=verified,
                 names=still)


def read_record(folder: Path) -> Record | None:
    """The record of an OUT rope-extend wrote, or None when it has none (a clean checkpoint, or an OUT written
    before rope-extend recorded its outputs). A damaged record is a CheckpointError: nothing is sent on its word."""
    from .spec import MAX_SPEC_BYTES, load_yaml_text

    path = _spec_path(folder)
    if path is None or path.stat().st_size > MAX_SPEC_BYTES:
        return None
    fix = "write OUT again with `rope-extend patch` (or `train`) into a new folder"
    try:
        data = load_yaml_text(path.read_text(encoding="utf-8"), f"{SPEC_FILE} {str(path)!r}")
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"{exc}; {fix}") from None
    if not isinstance(data, dict) or OUTPUT_RECORD_KEY not in data:
        return None
    raw = data.pop(OUTPUT_RECORD_KEY)
    raw = raw if isinstance(raw, dict) else {}
    names, texts = raw.get("files"), [raw.get("serve"), raw.get("serving")]
    model_id = raw.get("model_id")  # a pushed record: its serving commands name the repo it was pushed to
    if isinstance(model_id, str) and model_id:
        texts = [t.replace(model_id, MODEL_ID) if isinstance(t, str) else t for t in texts]
    damaged = CheckpointError(f"{str(path)!r}: rope-extend's {OUTPUT_RECORD_KEY} is damaged (files must name files "
                              f"inside OUT, each with 'sha256 <hex>' or, for shared weights, 'size N mtime_ns N inode "
                              f"N'); {fix}")
    if not all(t is None or isinstance(t, str) for t in texts) or not isinstance(raw.get("verified", True), bool):
        raise damaged
    if isinstance(names, list):  # before contents were recorded: names, and the inodes of the hard links made
        links = raw.get("hard_links") or {}
        if not (all(isinstance(n, str) and files.names_inside(Path(n)) for n in names) and isinstance(links, dict)
                and all(isinstance(v, int) and not isinstance(v, bool) for v in links.values())):
            raise damaged
        entries = {n: Entry(shared=sharing.HARD_LINKED, inode=links[n]) if n in links else Entry() for n in names}
        return Record(spec=data, entries=entries, serve=texts[0], serving=texts[1], contents_known=False)
    if not isinstance(names, dict):
        raise damaged
    entries = {}
    for name, value in names.items():
        if not (isinstance(name, str) and files.names_inside(Path(name)) and isinstance(value, str)):
            raise damaged
        try:
            entries[name] = Entry.parse(value)
        except ValueError:
            raise damaged from None
    return Record(spec=data, entries=entries, verified=raw.get("verified", True), serve=texts[0], serving=texts[1])


def _spec_path(folder: Path) -> Path | None:
    """OUT's rope_extend.yaml: a regular file, or in a Hub cache snapshot its blob; None otherwise."""
    path = folder / SPEC_FILE
    if path.is_symlink():
        try:
            return files.source_file(folder, Path(SPEC_FILE))
        except CheckpointError:
            return None
    return path if path.is_file() else None


def spec_text(folder: Path) -> str | None:
    """The spec part of OUT's rope_extend.yaml, as written (the record left out), or None without one."""
    path = _spec_path(folder)
    if path is None:
        return None
    kept = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True):
        if line.startswith((f"# {OUTPUT_RECORD_KEY}:", f"{OUTPUT_RECORD_KEY}:")):  # the note (any version), the record
            break
        kept.append(line)
    return "".join(kept)


def public_text(folder: Path, record: Record, card: bytes | None = None, repo_id: str | None = None) -> str:
    """OUT's rope_extend.yaml as a push to `repo_id` uploads it: the spec as written, the record without this
    machine's data (inodes, times, how files were shared: what identifies them here, not what they are), the serving
    commands rendered for `repo_id` (named as `model_id`, so a later push of a download renders them again), and a
    note that says what this record holds; `card`: the card the push sends instead of OUT's (its Serving section
    renamed), whose sha256 the uploaded record then holds."""
    sent = {CARD: Entry(sha256=hashlib.sha256(card).hexdigest())} if card is not None and CARD in record.entries else {}
    entries = {name: entry.public() for name, entry in sorted({**record.entries, **sent}.items())}
    if repo_id is None:
        return _text(spec_text(folder) or "", record.verified, entries, record.serve, record.serving)
    return _text(spec_text(folder) or "", record.verified, entries, record.serve_for(repo_id),
                 record.serving_for(repo_id), model_id=repo_id)


# --- what changed since verification -----------------------------------------------------------------------------------
def contents(root: Path, rel: str) -> Path:
    """The file whose bytes `rel` stands for: itself, or in a Hub cache snapshot the blob it links to."""
    parts = Path(rel).parts
    if any((root / Path(*parts[: i + 1])).is_symlink() for i in range(len(parts))):
        try:
            return files.source_file(root, Path(rel))
        except CheckpointError:
            pass
    return root / rel


def changes(folder: Path, record: Record) -> list[tuple[str, str]]:
    """(name, how) of every recorded file that is not what rope-extend verified: missing, edited (another sha256),
    replaced (shared weights of another identity), a link now, or hard-linked to another name since (its bytes may
    be shared with a file outside OUT). The card is listed like the others; the caller decides (a push sends an
    edited card as written)."""
    root = Path(os.path.abspath(folder))
    found = []
    for name, entry in sorted(record.entries.items()):
        path = contents(root, name)
        if not os.path.lexists(path):
            found.append((name, "missing"))
            continue
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            found.append((name, "a symbolic link now"))
        elif not stat.S_ISREG(info.st_mode):
            found.append((name, "not a regular file now"))
        elif name == SPEC_FILE:
            spec = (spec_text(root) or "").encode("utf-8")
            if hashlib.sha256(spec).hexdigest() != entry.sha256:
                found.append((name, "its spec edited"))
        elif entry.sha256 is not None:
            if info.st_nlink > 1 and path == root / name:
                found.append((name, f"hard-linked since ({info.st_nlink} names): its bytes may be another file's"))
            elif sha256(path) != entry.sha256:
                found.append((name, "edited"))
        else:
            now = (info.st_size, info.st_mtime_ns, info.st_ino)
            then = (entry.size, entry.mtime_ns, entry.inode)
            if any(b is not None and a != b for a, b in zip(now, then)):
                found.append((name, "another file than the one verified (its size, time or inode changed)"))
    return found


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


def is_top_weight(name: str) -> bool:
    """Whether `name` (relative to OUT) is one of a checkpoint's weight files or their index (top level)."""
    return "/" not in name and (sharing.is_weight(name) or name.endswith(WEIGHT_INDEX))


def shown_name(name: str) -> str:
    """A file name as printed: control characters, escape sequences, newlines and undecodable bytes escaped the way
    Python writes them (`\\x1b`, `\\n`, `\\udcff`), so a name cannot move the cursor, recolour the terminal or
    fake a line of output."""
    if name.isprintable():
        return name
    return "".join(c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
                   if ord(c) < 0xD800 or ord(c) > 0xDFFF else f"\\u{ord(c):04x}" for c in name)


def _named(items: list[tuple[str, str]]) -> str:
    shown = ", ".join(f"{shown_name(name)} ({why})" for name, why in items[:SHOWN])
    return shown + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def _plural(count: int, word: str) -> str:
    return word if count == 1 else word + "s"


def written_by_rope_extend(folder: Path) -> bool:
    """Whether OUT shows rope-extend wrote it: its rope_extend.yaml, or the marker in its config.json."""
    if (folder / SPEC_FILE).is_file():
        return True
    try:
        config = files.read_json(folder / "config.json")
    except CheckpointError:
        return False
    text = config.get("text_config")  # compat.text_part's rule, without importing transformers for a push
    return isinstance((text if isinstance(text, dict) else config).get("rope_extend"), dict)


def no_record_message(folder: Path) -> str:
    """Why an OUT rope-extend wrote without a record cannot be pushed, and how to make one."""
    quoted = shlex.quote(str(folder))
    spec = f" --config {shlex.quote(str(folder / SPEC_FILE))}" if (folder / SPEC_FILE).is_file() else " --method ..."
    return (f"OUT {str(folder)!r} was written by rope-extend before it recorded the files it vouches for (its "
            f"rope_extend.yaml has no {OUTPUT_RECORD_KEY}), so nothing was sent: make a record by writing the "
            f"checkpoint again into a new folder, `rope-extend patch SOURCE{spec} -o NEW` with the model it was made "
            f"from as SOURCE, and push NEW ({quoted} is left as it is)")


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


def walk(root: Path, metadata: list | None = None) -> Iterator[tuple[str, Path]]:
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
