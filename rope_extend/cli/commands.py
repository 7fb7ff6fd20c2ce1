"""Imports every command module so each registers itself on the app (one line per command)."""

from . import spec_cmds  # noqa: F401  validate, methods
from . import inspect_cmd  # noqa: F401  inspect
from . import patch_cmd  # noqa: F401  patch, show
from . import eval_cmd  # noqa: F401  eval
