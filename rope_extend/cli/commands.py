"""The one place that registers CLI commands: importing a command module adds its command(s) to `app`.

To add a command: write `<name>_cmd.py` (importing only from `.app` and the library) and add one line here. Import
torch, transformers and library modules that load them inside the command function, never at module top:
`rope-extend --help` imports every command module (tests/test_cli_startup.py; docs/development.md, "Adding a
command").
"""

from . import (
    engines_cmd,  # noqa: F401  engines
    eval_cmd,  # noqa: F401  eval
    inspect_cmd,  # noqa: F401  inspect
    patch_cmd,  # noqa: F401  patch, show
    push_cmd,  # noqa: F401  push
    spec_cmds,  # noqa: F401  validate, methods
    train_cmd,  # noqa: F401  train
    tune_cmd,  # noqa: F401  tune
    verify_cmd,  # noqa: F401  verify
)

# Slots for commands other branches add (one line each, inside the import list above):
#     engines_cmd,  # engines
#     tune_cmd,  # tune
