"""Imports every command module so each registers itself on the app (one line per command)."""

from . import (
    engines_cmd,  # noqa: F401  engines
    eval_cmd,  # noqa: F401  eval
    inspect_cmd,  # noqa: F401  inspect
    patch_cmd,  # noqa: F401  patch, show
    spec_cmds,  # noqa: F401  validate, methods
)
