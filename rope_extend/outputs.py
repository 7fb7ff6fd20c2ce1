"""What an existing OUT may hold before rope-extend replaces it or writes into it: the one rule that keeps
`--overwrite` (and `eval -o`, `tune -o`, GGUF outputs) from deleting a user's files.

`check_replaceable(path, kind)` is called by every command that writes an output, before any work starts and again
right before a checkpoint folder is swapped in. What it accepts, by kind:

- ``checkpoint`` (patch, train; the folder is *replaced*): a folder that is recognisably a checkpoint (as a folder
  rope-extend wrote is, unless SOURCE carried other files into it): a config.json naming a ``model_type``, weights (``*.safetensors``,
  ``pytorch_model*.bin`` or their index) and nothing else but the files a checkpoint has (tokenizer files,
  generation_config.json, chat templates, the README.md model card, .gitattributes, a license, remote code, and
  rope-extend's own rope_extend.yaml and training files); no subfolder but huggingface_hub's ``.cache``.
- ``eval`` (the folder is *written into*: results.jsonl is resumed, report.md, run.json and the plots rewritten): an
  eval output folder, i.e. one with the run.json that `rope_extend.eval.runner` writes first (a JSON object with the
  run's ``suite`` and ``variants``).
- ``tune`` (written into, resumed): a tune output folder, i.e. one whose search.jsonl or heldout.jsonl starts with the
  run header line (``{"kind": "run", ...}``) that `rope_extend.tune.log.SearchLog` writes first.
- ``gguf`` (a file, replaced): a GGUF file (its first four bytes are ``GGUF``).

A missing path or an empty folder is always accepted. Anything else is refused with an `OutputNotReplaceableError`
(a ValueError) naming the first few files that would be lost, how many there are, and the fix.
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

from .errors import OutputNotReplaceableError

KINDS = ("checkpoint", "eval", "tune", "gguf")

# Top-level files of a Hugging Face checkpoint (save_pretrained, the Hub's model repos) besides its weights.
CHECKPOINT_FILES = {
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model",
    "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json", "preprocessor_config.json",
    "processor_config.json", "README.md", ".gitattributes", "NOTICE", "USE_POLICY.md", "training_args.bin",
    ".DS_Store",
}
CHECKPOINT_PATTERNS = ("*.tiktoken", "LICENSE*", "configuration_*.py", "modeling_*.py", "tokenization_*.py")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json", "pytorch_model.bin.index.json")
CHECKPOINT_DIRS = {".cache"}  # huggingface_hub's download metadata (`hf download --local-dir`)
# rope-extend's own files in a checkpoint it wrote (checkpoint.py: the spec; train/card.py: the training record)
ROPE_EXTEND_FILES = {"rope_extend.yaml", "training.json", "training_log.jsonl", "training_loss.png"}
# the marker files of eval and tune outputs; their writers (eval.runner, tune.runner) name them from here
EVAL_RUN_FILE = "run.json"
SEARCH_LOG, HELDOUT_LOG = "search.jsonl", "heldout.jsonl"
TUNE_LOGS = (SEARCH_LOG, HELDOUT_LOG)
GGUF_MAGIC = b"GGUF"
SHOWN = 4  # files named in a refusal


def check_replaceable(path: str | Path, kind: str, given: str | None = None) -> None:
    """Refuse (`OutputNotReplaceableError`) an existing *path* that a *kind* output may not replace or write into;
    see the module docstring. *given* is the path as the user typed it (for the message)."""
    if kind not in KINDS:
        raise ValueError(f"unknown output kind {kind!r}; one of {', '.join(KINDS)}")
    path = Path(path)
    given = given if given is not None else str(path)
    if not path.exists() and not path.is_symlink():
        return
    if kind == "gguf":
        _check_gguf(path, given)
        return
    if not path.is_dir():
        raise OutputNotReplaceableError(f"OUT {given!r} is an existing file; choose a folder path with -o", path=given)
    if not any(path.iterdir()):
        return
    found = {"checkpoint": _not_checkpoint, "eval": _not_eval, "tune": _not_tune}[kind](path)
    if found is None:
        return
    strangers, why = found
    everything = _files(path)
    what = {"checkpoint": "a checkpoint or a folder rope-extend wrote", "eval": "an eval output folder",
            "tune": "a tune output folder"}[kind]
    verb = "replacing it would delete" if kind == "checkpoint" else "writing into it could overwrite or mix with"
    fix = "choose another -o, or remove it yourself" if kind == "checkpoint" else "choose another -o (a new or empty folder)"
    named = ", ".join(strangers[:SHOWN]) + (f" and {len(strangers) - SHOWN} more" if len(strangers) > SHOWN else "")
    raise OutputNotReplaceableError(
        f"OUT {given!r} is not {what} ({why}): {verb} {len(everything)} file{'s' * (len(everything) != 1)} "
        f"({named}); {fix}",
        path=given, files=strangers,
    )


def is_checkpoint(folder: Path) -> bool:
    """A folder that `check_replaceable(folder, "checkpoint")` accepts and that is not empty."""
    return folder.is_dir() and any(folder.iterdir()) and _not_checkpoint(folder) is None


def _files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if not p.is_dir() or p.is_symlink()]


def _describe(folder: Path, entries: list[Path]) -> list[str]:
    """Names for a refusal: files by name, subfolders as `name/ (N files)`."""
    out = []
    for entry in sorted(entries, key=lambda p: (p.is_dir(), p.name)):
        if entry.is_dir() and not entry.is_symlink():
            n = len(_files(entry))
            out.append(f"{entry.name}/ ({n} file{'s' * (n != 1)})")
        else:
            out.append(entry.name)
    return out


def is_checkpoint_file(name: str) -> bool:
    """A top-level file name a checkpoint has (the rule above; `rope_extend.record` holds a push to it too)."""
    return (name in CHECKPOINT_FILES or name in ROPE_EXTEND_FILES
            or any(fnmatch.fnmatchcase(name, p) for p in CHECKPOINT_PATTERNS + WEIGHT_PATTERNS))


def _not_checkpoint(folder: Path) -> tuple[list[str], str] | None:
    """None for a checkpoint folder, else (the entries to name, the user's first; why it is not one)."""
    entries = list(folder.iterdir())
    strangers = [p for p in entries if (p.is_dir() and not p.is_symlink() and p.name not in CHECKPOINT_DIRS)
                 or ((not p.is_dir() or p.is_symlink()) and not is_checkpoint_file(p.name))]
    if strangers:
        return _describe(folder, strangers), "it holds files a checkpoint does not"
    names = [p.name for p in entries]
    if not any(fnmatch.fnmatchcase(n, p) for n in names for p in WEIGHT_PATTERNS):
        return _describe(folder, entries), "it has no weights"
    config = _first_json(folder / "config.json", lines=False)
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        return _describe(folder, entries), "its config.json names no model_type"
    return None


def _first_json(path: Path, lines: bool) -> object:
    try:
        with open(path) as fh:
            text = fh.readline() if lines else fh.read()
        return json.loads(text)
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _not_eval(folder: Path) -> tuple[list[str], str] | None:
    run = _first_json(folder / EVAL_RUN_FILE, lines=False)
    if isinstance(run, dict) and "suite" in run and "variants" in run:
        return None
    return _describe(folder, list(folder.iterdir())), "no run.json written by rope-extend eval"


def _not_tune(folder: Path) -> tuple[list[str], str] | None:
    for name in TUNE_LOGS:
        header = _first_json(folder / name, lines=True)
        if isinstance(header, dict) and header.get("kind") == "run":
            return None
    return _describe(folder, list(folder.iterdir())), "no search.jsonl written by rope-extend tune"


def _check_gguf(path: Path, given: str) -> None:
    if path.is_dir():
        raise OutputNotReplaceableError(f"OUT {given!r} is a folder; give a file name ending in .gguf", path=given)
    try:
        with open(path, "rb") as fh:
            magic = fh.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise OutputNotReplaceableError(f"OUT {given!r} cannot be read ({exc.strerror}); choose another path",
                                        path=given) from None
    if magic != GGUF_MAGIC:
        raise OutputNotReplaceableError(
            f"OUT {given!r} is not a GGUF file (it does not start with the GGUF magic): replacing it would delete "
            "it; choose another path ending in .gguf, or remove it yourself", path=given, files=[path.name],
        )
