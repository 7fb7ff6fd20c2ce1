"""The `rope-extend` command line: thin commands over the library, one file per command.

Every known error (a `RopeExtendError`, or a builtin `ValueError`/`OSError` from the library) becomes one line on
stderr and exit code 2; `--debug` (or ROPE_EXTEND_DEBUG=1) shows the traceback instead.
"""

from __future__ import annotations

import os
import sys

from .app import app, run

__all__ = ["app", "main", "run"]


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point."""
    return run(argv if argv is not None else sys.argv[1:], debug=bool(os.environ.get("ROPE_EXTEND_DEBUG")))
