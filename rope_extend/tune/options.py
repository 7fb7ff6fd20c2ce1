"""`TuneOptions`: how `tune_model` runs, declared once: the Python API's keywords and, for the fields whose metadata
holds a `help`, `rope-extend tune`'s flags (`cli.options.options_flags`, as for `eval`'s `EvalOptions`).

Imports nothing heavy: the CLI reads it to declare `tune`'s flags before any command runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..flags import PLOTS, RESUME, LoadOptions

DEFAULT_BUDGET = 12.0  # target-length forwards (`search.tune`)


@dataclass(frozen=True)
class TuneOptions(LoadOptions):
    """How `tune_model` runs: the `tune` command's flags and the Python API's keywords.

    dtype / device / device_map / memory_check: how the weights load (`flags.LoadOptions`).
    text: the calibration text file (None: the stdlib docs prose); `heldout`: the held-out text of the comparison
        table (a file, or 'licenses': /usr/share/common-licenses), never the calibration text; None: no comparison.
    budget: the search's budget in target-length forwards (`search.tune`); `methods`: the closed forms searched
        (None: every closed form's `Advice`); `knots`: of the per-dimension curve (0: closed forms only).
    passkey_samples: passkey prompts per held-out variant at the target length.
    resume / plots: resume from the output folder's logs; draw the report's plots.
    baselines_first: evaluate the held-out closed forms at their defaults before the search (they do not depend on
        it), so a run cut short on a slow machine still has the baseline table.
    attention_factor: pin the per-dimension curves' attention factor (1: inside the window exactly the original
        model; None: searched).
    """

    text: str | None = field(default=None, metadata={"help": "Calibration text file (default: stdlib docs prose)."})
    budget: float = field(default=DEFAULT_BUDGET, metadata={
        "help": "Search budget in target-length forwards (short screening forwards count as fractions)."})
    methods: list[str] | None = None  # the CLI's --methods: comma-separated
    knots: int = field(default=6, metadata={"help": "Knots of the per-dimension curve."})
    heldout: str | None = field(default=None, metadata={
        "help": "Held-out text file for the comparison table, or 'licenses' (/usr/share/common-licenses). Never the "
        "calibration text."})
    passkey_samples: int = field(default=0, metadata={
        "help": "Passkey prompts per variant at the target length (held-out only)."})
    resume: bool = RESUME.field(True)
    plots: bool = PLOTS.field(True)
    baselines_first: bool = field(default=False, metadata={
        "help": "Evaluate the held-out closed forms at their defaults before the search (slow machines)."})
    attention_factor: float | None = field(default=None, metadata={
        "help": "Pin the per-dimension curves' attention factor (1 = inside the window exactly the original model; "
        "default: searched)."})

    def __post_init__(self) -> None:
        if self.text is not None and self.heldout is not None and \
                Path(self.text).resolve() == Path(self.heldout).resolve():
            raise ValueError(f"--heldout {self.heldout} is the calibration text; held-out numbers need a different "
                             "text")
