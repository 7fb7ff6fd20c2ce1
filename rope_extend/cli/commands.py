"""Imports every command module so each registers itself on the app (one line per command)."""

from . import (
    eval_cmd,  # noqa: F401  eval
    inspect_cmd,  # noqa: F401  inspect
    patch_cmd,  # noqa: F401  patch, show
    spec_cmds,  # noqa: F401  validate, methods
    tune_cmd,  # noqa: F401  tune
)
