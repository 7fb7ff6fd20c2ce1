"""How a training run spreads its windows over processes: one strategy object, chosen once by `prepare`
(`choose`), whose methods the later stages call; no stage asks how many processes share a window.

- `WholeWindows`: every process holds whole windows: one process, or several under a launcher that replicates
  (DDP) or shards the parameters (FSDP, DeepSpeed ZeRO-3: `sharding.py`), each taking different windows.
- `UlyssesSequenceParallel` (`--sequence-parallel N`): each window split over N processes on DeepSpeed's Ulysses;
  what it does is `sequence_parallel.py`, this is what the stages call of it.

Every method is one the stages call at one point of the run: `prepare` (the batch split, the fingerprint),
`trainer` (the loaded model's check, the `TrainingArguments` keywords), `runner` (the progress lines, the scope
training runs in).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Protocol

from . import sequence_parallel
from .recipe import ParallelismOptions


class Parallelism(Protocol):
    size: int  # processes that share one window (1: each process holds whole windows)
    deepspeed: dict | None  # the DeepSpeed config rope-extend gives the run (None: none, or the launch's own)

    def replicas(self, world: int) -> int:
        """Process groups that take different windows (data parallel)."""

    def groups(self, replicas: int) -> str:
        """What those groups are, in words (the batch split's line and its refusal)."""

    def fingerprint(self) -> dict:
        """What a resumed run must share with the interrupted one, beyond the recipe."""

    def compile_note(self, launched_with: str | None) -> str | None:
        """The line to say before DeepSpeed compiles its communication op (None: nothing to say)."""

    def check_loaded(self, model) -> None:
        """Refuse a loaded model this strategy cannot train."""

    def training_arguments(self, world: int) -> dict:
        """The `TrainingArguments` keywords this strategy adds."""

    def arguments_made(self) -> None:
        """What must happen once the `TrainingArguments` exist."""

    def processes_line(self, sharding_line: str, world: int) -> str:
        """The progress line's words for how the processes share the work."""

    def training_scope(self, accumulation: int) -> contextlib.AbstractContextManager:
        """What training runs within (entered before the attention kernel's own swap, `sdpa.installed`)."""


@dataclass(frozen=True)
class WholeWindows:
    """Every process holds whole windows (see the module docstring)."""

    size: int = 1
    deepspeed: dict | None = None

    def replicas(self, world: int) -> int:
        return world

    def groups(self, replicas: int) -> str:
        return f"{replicas} process(es)"

    def fingerprint(self) -> dict:
        return {}  # fingerprints as before the option existed

    def compile_note(self, launched_with: str | None) -> str | None:
        # an accelerate DeepSpeed (ZeRO) launch compiles the same op on CPU processes
        return sequence_parallel.compile_note() if launched_with == "DeepSpeed" else None

    def check_loaded(self, model) -> None:
        return None

    def training_arguments(self, world: int) -> dict:
        return {}

    def arguments_made(self) -> None:
        return None

    def processes_line(self, sharding_line: str, world: int) -> str:
        return sharding_line

    def training_scope(self, accumulation: int) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


@dataclass(frozen=True)
class UlyssesSequenceParallel:
    """`--sequence-parallel N`: each window split over `size` processes (`sequence_parallel.py`)."""

    size: int
    deepspeed: dict | None  # None under an accelerate DeepSpeed launch (it brings its own config)

    def replicas(self, world: int) -> int:
        return world // self.size

    def groups(self, replicas: int) -> str:
        return f"{replicas} group(s) of {self.size} sequence-parallel processes"

    def fingerprint(self) -> dict:
        return {"sequence_parallel": self.size, **({} if self.deepspeed is None else {"deepspeed": self.deepspeed})}

    def compile_note(self, launched_with: str | None) -> str | None:
        return sequence_parallel.compile_note()

    def check_loaded(self, model) -> None:
        # a model class without sdpa loads eager whatever its config says
        sequence_parallel.check_attention(self.size, model.config._attn_implementation,
                                          f"the loaded {type(model).__name__}")

    def training_arguments(self, world: int) -> dict:
        return sequence_parallel.arguments(self.size, world, self.deepspeed)

    def arguments_made(self) -> None:
        sequence_parallel.join_deepspeed_comm()

    def processes_line(self, sharding_line: str, world: int) -> str:
        return f"{sharding_line}; {sequence_parallel.describe(self.size, world)}"

    @contextlib.contextmanager
    def training_scope(self, accumulation: int):
        with sequence_parallel.attention_scoped(), sequence_parallel.planned_accumulation_quiet(accumulation):
            yield


WHOLE_WINDOWS = WholeWindows()


def choose(options: ParallelismOptions, dtype: str, text_config, window: int, world: int,
           launched_with: str | None) -> Parallelism:
    """The run's strategy, once, with everything it cannot work with refused in one line before the tokenizer and
    the model load (`sequence_parallel.prepare`)."""
    if not options.splits_windows:
        return WHOLE_WINDOWS
    n = options.sequence_parallel
    return UlyssesSequenceParallel(n, sequence_parallel.prepare(n, options.deepspeed, dtype, text_config, window,
                                                                world, launched_with))
