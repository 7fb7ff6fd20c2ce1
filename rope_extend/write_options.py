"""`WriteOptions`: how the checkpoint writer writes OUT, declared once: the Python API's keywords
(`patch_checkpoint(..., mode=...)`) and, for the fields whose metadata holds a `help`, `patch`'s flags
(`cli.options.options_flags` turns them into typer options: `flag` names a flag other than `--field-name`); the
flags other commands share (`--dtype`, `--overwrite`, `--no-verify`, `--no-memory-check`) are `flags`' own.

Imports nothing heavy: the CLI reads it to declare `patch`'s flags before any command runs."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import CheckpointError
from .flags import DTYPE, MEMORY_CHECK, OVERWRITE, VERIFY

DTYPES = {"auto": "auto", "float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
          "bfloat16": "bfloat16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class WriteOptions:
    """How `write_checkpoint` writes OUT: the `patch` command's flags and the Python API's keywords, checked once.

    mode: auto (config-only unless `dtype` changes the weights), config-only (link the weights, write the config)
        or full (load, patch, save). A loaded model (`train`) is always written in full.
    dtype: the weights' dtype on the full path (float32, bfloat16, float16, auto).
    hub_id: the repo OUT will be pushed to, which names the model in the card's serving commands (otherwise
        `./NAME`, OUT's folder as seen from the folder that holds it: the card never holds a local absolute path).
    eval_summary: the card's Evaluation section (`eval.card_section.CardEval` or markdown); training: its Training section.
    engines_report: the card's "Where it serves identically" section (the parity report of what was written).
    extra: adds files (plots, logs) to the folder before verification.
    keep_unverified: where a checkpoint written in full that fails verification is kept (OUT is not created) instead
        of deleted, its card saying why (`UnverifiedCheckpointError` names it).
    memory_check: a full write whose weights do not fit the machine's memory is refused before loading
        (`check_loading`); False loads them anyway (--no-memory-check).
    on_step: called at each of `steps` steps, all after validation (a refused input prints only its error).
    """

    mode: str = field(default="auto", metadata={
        "help": "auto | config-only (link weights, write config) | full (load + save)."})
    dtype: str | None = DTYPE.field(None)
    overwrite: bool = OVERWRITE.field(False)
    verify: bool = VERIFY.field(True)
    allow_pickle: bool = field(default=False, metadata={
        "help": "Accept pickle (.bin) weights. Only for trusted sources."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow the checkpoint's own Python code."})
    hub_id: str | None = None
    eval_summary: Any = None
    training: str | None = None
    engines_report: bool = True
    extra: Callable[[Path], None] | None = None
    keep_unverified: str | os.PathLike | None = None
    memory_check: bool = MEMORY_CHECK.field(True)
    on_step: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "config-only", "full"):
            raise CheckpointError(f"--mode {self.mode!r} is not one of auto, config-only, full")
        if self.mode == "config-only" and self.dtype not in (None, "auto"):
            raise CheckpointError("--dtype changes the weights; it needs --mode full (or auto)")
        if self.dtype is not None and (self.dtype or "").lower() not in DTYPES:
            raise CheckpointError(f"--dtype {self.dtype!r} is not one of {', '.join(sorted(set(DTYPES)))}")

    def write_mode(self, loaded: bool = False) -> str:
        """config-only or full (auto resolved; a loaded model is saved in full)."""
        if loaded:
            return "full"
        if self.mode == "auto":
            return "full" if self.dtype not in (None, "auto") else "config-only"
        return self.mode

    @property
    def steps(self) -> int:
        """How many times `write_checkpoint` calls `on_step` (for progress with an ETA)."""
        return 2 if self.verify else 1
