"""The flags several commands share, each declared once: its name and its help (`Flag`), and `LoadOptions`, the four
that say how a command loads a model's weights (`eval` and `tune`; `patch`'s `WriteOptions` and `train` take
`--dtype` and `--no-memory-check` from here too).

An options dataclass carries a flag in a field's metadata (`Flag.field`): the field is the Python API's keyword, and
`cli.options.options_flags` turns it into the command's option (mergekit's `add_merge_options`); a command without
an options dataclass takes the same flag as a typer option (`cli.options.flag_option`). A `--no-...` flag fills a
field that defaults to true.

Imports nothing: the CLI reads it to declare its flags before any command runs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Flag:
    """A command-line flag: `name` (`--dtype`, or `--no-memory-check` for a field that defaults to true) and `help`."""

    name: str
    help: str

    @property
    def metadata(self) -> dict[str, str]:
        """What an options dataclass's field carries to be this flag (`cli.options.flag_fields`)."""
        return {"flag": self.name, "help": self.help}

    def field(self, default: Any) -> Any:
        """A dataclass field with `default` that is this flag."""
        return dataclasses.field(default=default, metadata=self.metadata)


DTYPE = Flag("--dtype", "Weights dtype: float32, bfloat16, float16, or auto (as stored; train: bfloat16 on GPUs that "
             "have it, else float32).")
DEVICE = Flag("--device", "e.g. cuda (ignored with --device-map).")
DEVICE_MAP = Flag("--device-map", "e.g. auto (accelerate) for models larger than one device.")
MEMORY_CHECK = Flag("--no-memory-check", "Load the weights even if the memory estimate says they do not fit.")
RESUME = Flag("--no-resume", "Start afresh instead of resuming from the output folder's log.")
PLOTS = Flag("--no-plots", "Write the report without its PNG plots.")
OVERWRITE = Flag("--overwrite", "Replace an existing OUT that is a checkpoint (a folder of other files is refused).")
VERIFY = Flag("--no-verify", "Skip reloading OUT with stock transformers.")


@dataclass(frozen=True)
class LoadOptions:
    """How a command loads the model's weights: `dtype` (float32, bfloat16, float16, or auto: as stored), `device`
    (e.g. cuda; ignored with `device_map`), `device_map` (e.g. auto, through accelerate, for a model larger than one
    device) and `memory_check` (refuse, before loading, weights the machine's memory cannot hold:
    `rope_extend.memory`; False loads them anyway)."""

    dtype: str = DTYPE.field("float32")
    device: str | None = DEVICE.field(None)
    device_map: str | None = DEVICE_MAP.field(None)
    memory_check: bool = MEMORY_CHECK.field(True)
