"""How a file of SOURCE gets into OUT, decided in one place: copied, or (weights only) its bytes shared.

Nothing written to OUT may change SOURCE or the Hugging Face Hub cache it came from:

- Every file that is not weights (config.json, tokenizer files, chat templates, generation_config.json, the card,
  remote code, a license, notes SOURCE carried) is **copied**. These are small, and they are the files people edit
  before publishing (a chat template, generation defaults), often in place (`open(path, "r+")`, vim with
  `backupcopy=yes`, many IDEs), which would write through a link into SOURCE.
- Weights (`*.safetensors`, and pickle weights when `--allow-pickle` lets them through) are **shared**, so that a
  config-only patch costs the same for 135M and 405B parameters. `share` takes the first of
  1. a copy-on-write clone (`clone`: Linux's `ioctl(FICLONE)`, on XFS formatted with reflink=1, btrfs, bcachefs,
     OCFS2...): a new file whose blocks are SOURCE's until either side writes, so even an in-place edit of OUT's
     weights leaves SOURCE as it was;
  2. a hard link: the same inode under a second name. O(1) too, but an edit IN PLACE of OUT's weights edits
     SOURCE's (or the Hub cache's blob): rope-extend never opens them for writing, and docs/hub-and-checkpoints.md
     says so. A tool that saves by writing a new file and renaming it over the old name (safetensors' and
     transformers' own savers, most editors) leaves SOURCE alone;
  3. a copy, where neither is possible (OUT on another filesystem).

`place(src, dst)` applies the rule and returns how the file got there (`COPIED`, `CLONED`, `HARD_LINKED`); the
checkpoint writer counts them and the record (`rope_extend.record`) keeps which files are shared.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections import Counter
from pathlib import Path

COPIED, CLONED, HARD_LINKED = "copied", "reflinked", "hard-linked"
SHARED = (CLONED, HARD_LINKED)  # the bytes are SOURCE's: the record identifies them without reading them
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl")
FICLONE = 0x40049409  # _IOW(0x94, 9, int), linux/fs.h


def is_weight(name: str | os.PathLike) -> bool:
    """Whether a file of SOURCE is weights (shared) rather than a small file (copied). An index
    (`model.safetensors.index.json`) is a small JSON file: copied."""
    return Path(name).suffix in WEIGHT_SUFFIXES


def _ficlone(src: Path, dst: Path) -> bool:
    """Linux's copy-on-write clone of `src` as the new file `dst`; False (and no `dst`) where OUT's filesystem has
    none (ext4, tmpfs, another filesystem than SOURCE's: EOPNOTSUPP, ENOTTY, EINVAL, EXDEV...)."""
    import fcntl

    with open(src, "rb") as source, open(dst, "xb") as target:
        try:
            fcntl.ioctl(target.fileno(), FICLONE, source.fileno())
            return True
        except OSError:
            pass
    os.unlink(dst)
    return False


def _no_clone(src: Path, dst: Path) -> bool:
    return False


# The platform's copy-on-write clone (a named, swappable piece): Linux's FICLONE; elsewhere none yet (macOS's
# clonefile would go here), so weights are hard-linked there.
clone = _ficlone if sys.platform.startswith("linux") else _no_clone


def place(src: Path, dst: Path) -> str:
    """Put SOURCE's file `src` (a Hub cache link is followed to its blob) at `dst` by the rule of the module
    docstring; returns how: `COPIED`, `CLONED` or `HARD_LINKED`."""
    real = Path(os.path.realpath(src))
    dst.parent.mkdir(parents=True, exist_ok=True)
    if is_weight(src):
        return share(real, dst)
    shutil.copyfile(real, dst)
    return COPIED


def share(real: Path, dst: Path) -> str:
    """Share the bytes of the file `real` as `dst`: a clone, else a hard link, else a copy."""
    try:
        if clone(real, dst):
            return CLONED
    except OSError:
        pass
    try:
        os.link(real, dst)
        return HARD_LINKED
    except OSError:  # another filesystem (EXDEV), too many links (EMLINK), a filesystem without links
        pass
    shutil.copyfile(real, dst)
    return COPIED


HARD_LINK_NOTE = ("the hard-linked files are SOURCE's own bytes under a second name: a program that writes into one "
                  "in place changes SOURCE too (saving a new file over the name is safe; `cp --reflink=never` first "
                  "to edit in place)")


def tally(placed: dict[str, str]) -> str:
    """How the files of `placed` (name -> how) got into OUT, in words: '4 hard-linked, 5 copied'."""
    counts = Counter(placed.values())
    return ", ".join(f"{counts[how]} {how}" for how in (HARD_LINKED, CLONED, COPIED) if counts[how]) or "0 copied"
