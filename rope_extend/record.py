"""What an output folder consists of and what rope-extend vouches for in it: OUT's record.

`patch`, `train` and `verify` end by writing OUT's `rope_extend.yaml`: the spec, then under `output_record` whether
OUT was verified, every file they put into OUT with what identifies its contents, and the card's serving commands
with the model's name written `ROPE_EXTEND_MODEL_ID` (a push renders them for its repo id, without planning the patch
again):

- a file rope-extend wrote or copied (config.json, tokenizer files, templates, the card, weights a full patch or
  `train` saved): the sha256 of its bytes (`rope_extend.yaml`'s own entry: of its spec part);
- weights it shared with SOURCE (`rope_extend.sharing`: a copy-on-write clone or a hard link, never read, so O(1) in
  their size): how, their size, modification time and inode.

`changes(OUT, record)` says which recorded files are not what was verified (edited, replaced, missing, hard-linked
since); `public_text` is the record as a push uploads it: the hashes and sizes, nothing of this machine (no inode,
time or path). What a push may send, decided from the record, is `rope_extend.publish.selection`'s.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import files, sharing
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
WEIGHT_INDEX = ".safetensors.index.json"
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


def is_top_weight(name: str) -> bool:
    """Whether `name` (relative to OUT) is one of a checkpoint's weight files or their index (top level)."""
    return "/" not in name and (sharing.is_weight(name) or name.endswith(WEIGHT_INDEX))


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
