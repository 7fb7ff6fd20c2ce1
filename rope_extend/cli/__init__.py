"""The `rope-extend` command line: thin commands over the library, one file per command.

Layout (no import cycle): `app.py` is the leaf (typer app, consoles, `fail`, progress); each `*_cmd.py` imports it
and registers its command; `commands.py` imports every command module (the one registration list); `main.py` runs a
command line and maps errors to exit code 2 and signals to 130/143. `--debug` (or ROPE_EXTEND_DEBUG=1) shows the
traceback of an error.
"""

from __future__ import annotations

import os
import sys

from .app import app
from .main import run

__all__ = ["app", "main", "run"]


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point."""
    return run(argv if argv is not None else sys.argv[1:], debug=bool(os.environ.get("ROPE_EXTEND_DEBUG")))
