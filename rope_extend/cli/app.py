"""The typer application, shared option handling, and the one place where errors become exit code 2."""

from __future__ import annotations

import sys
import traceback

import typer
from rich.console import Console

from ..errors import RopeExtendError

app = typer.Typer(
    name="rope-extend",
    help="Extend the context window of Hugging Face LLaMA-family models by rescaling RoPE.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
console = Console(stderr=True)
out = Console(soft_wrap=True)

USER_ERRORS = (RopeExtendError, ValueError, OSError, KeyError)


def fail(message: str) -> None:
    """Print one line to stderr and exit 2."""
    line = " ".join(str(message).split())
    print(f"rope-extend: error: {line}", file=sys.stderr)
    raise SystemExit(2)


def run(argv: list[str], debug: bool = False) -> int:
    if "--debug" in argv:
        argv = [a for a in argv if a != "--debug"]
        debug = True
    _register_commands()
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="rope-extend", standalone_mode=False)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except KeyboardInterrupt:
        print("rope-extend: interrupted; nothing was left at the output path", file=sys.stderr)
        return 130
    except USER_ERRORS as exc:
        if debug:
            traceback.print_exc()
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"rope-extend: error: {' '.join(str(message).split())}", file=sys.stderr)
        return 2
    except Exception as exc:  # click's own exceptions (typer >= 0.20 vendors click, so match by shape)
        if hasattr(exc, "format_message"):  # usage errors: bad option, missing argument
            print(f"rope-extend: error: {' '.join(exc.format_message().split())}", file=sys.stderr)
            return 2
        if type(exc).__name__ == "Abort":
            print("rope-extend: interrupted", file=sys.stderr)
            return 130
        if isinstance(getattr(exc, "exit_code", None), int):  # typer.Exit
            return exc.exit_code
        raise
    return 0


_registered = False


def _register_commands() -> None:
    """Import the command modules (each registers itself on `app`)."""
    global _registered
    if _registered:
        return
    from . import commands  # noqa: F401

    _registered = True
