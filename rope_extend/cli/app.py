"""The CLI's leaf module: the typer app, the two consoles, the error helper and step progress.

It imports no command module (commands import it; `commands.py` registers them; `main.py` runs the app), so the
CLI has no import cycle.
"""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer
from rich.console import Console

from ..terminal import command_lines, help_lines, markdown_lines, wrap

app = typer.Typer(
    name="rope-extend",
    help="Extend the context window of Hugging Face LLaMA-family models by rescaling RoPE.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _flags_show_no_value() -> None:
    """typer's help (0.2x) prints a value type after every option, flags included (`--overwrite <bool>`), although
    a flag takes no value (`--overwrite true` is refused): print a flag as the plain flag it is."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "flags_show_no_value", False):  # older typer prints no type for a flag
        return

    def display_type_rich(self, ctx):
        return None if getattr(self, "is_flag", False) else shown(self, ctx)

    display_type_rich.flags_show_no_value = True
    TyperOption.display_type_rich = display_type_rich


def _narrow_help() -> None:
    """typer's rich help draws the options as a table whose columns it cuts with "…" when the terminal is too narrow
    for them (60 columns: `--trust-remote…`, `--target-leng…`), and click's own help breaks words at hyphens
    (`--target-` / `length`). Below RICH_HELP_COLUMNS, print `terminal.help_lines` instead: each option on its own
    line, its help wrapped between words below it, the examples as commands that paste."""
    from typer.core import TyperCommand, TyperGroup

    for cls in (TyperCommand, TyperGroup):
        rich_help = cls.format_help
        if getattr(rich_help, "narrow", False):
            continue

        def format_help(self, ctx, formatter, _rich_help=rich_help):
            if out.width >= RICH_HELP_COLUMNS:
                return _rich_help(self, ctx, formatter)
            formatter.write("\n".join(help_lines(self, ctx, out.width)) + "\n")
            return None

        format_help.narrow = True
        cls.format_help = format_help


console = Console(stderr=True)  # progress, warnings, errors
out = Console(soft_wrap=True)  # results only: what a script may parse or a user may paste
RICH_HELP_COLUMNS = 80  # the narrowest terminal whose rich help tables fit every option name (tests/test_cli_output)
_flags_show_no_value()
_narrow_help()


def say(text: str, indent: str = "", hang: str | None = None, stream: Console | None = None) -> None:
    """Print *text* wrapped between words at the output's width (`terminal.wrap`): every command's output fits the
    terminal, 80 columns when it is not one (or $COLUMNS)."""
    stream = stream or out
    for line in wrap(text, stream.width, indent, hang):
        stream.print(line, markup=False, highlight=False, soft_wrap=True)


def say_command(label: str, command: str, python: bool = False, stream: Console | None = None) -> None:
    """Print a command after *label* so that it fits and still pastes (`terminal.command_lines`)."""
    stream = stream or out
    for line in command_lines(label, command, stream.width, python):
        stream.print(line, markup=False, highlight=False, soft_wrap=True)


def say_markdown(text: str, stream: Console | None = None) -> None:
    """Print a report's markdown summary at the output's width (`terminal.markdown_lines`: tables fitted)."""
    stream = stream or out
    for line in markdown_lines(text, stream.width):
        stream.print(line, markup=False, highlight=False, soft_wrap=True)


def fail(message: str) -> None:
    """Print one line to stderr and exit 2."""
    line = " ".join(str(message).split())
    print(f"rope-extend: error: {line}", file=sys.stderr)
    raise SystemExit(2)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        from .. import __version__

        def installed(name: str) -> str:  # read from the installed metadata: importing them takes seconds
            try:
                return version(name)
            except PackageNotFoundError:
                return "not installed"

        print(f"rope-extend {__version__} (transformers {installed('transformers')}, torch {installed('torch')})")
        raise typer.Exit(0)


@app.callback()
def _options(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the full traceback of an error (also ROPE_EXTEND_DEBUG=1).")
    ] = False,
) -> None:
    """Extend the context window of Hugging Face LLaMA-family models by rescaling RoPE."""
    # --debug is taken out of argv (wherever it appears) by main.run before parsing; it is declared here for --help.


class Progress:
    """Progress of a multi-step job on stderr, never on stdout.

    On a terminal: a spinner with the current step. Otherwise (a log file, CI, a pipe): one line per step with the
    step number, the elapsed time and an ETA from the average step time so far, so a long run is visibly alive.
    """

    def __init__(self, what: str, steps: int):
        self.what, self.steps, self.done = what, max(int(steps), 1), 0
        self.started = time.perf_counter()
        self._status = None

    def __enter__(self) -> Progress:
        if console.is_terminal:
            self._status = console.status(f"{self.what}...")
            self._status.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)

    def step(self, message: str) -> None:
        self.done = min(self.done + 1, self.steps)
        if self._status is not None:
            self._status.update(f"[{self.done}/{self.steps}] {message}")
            return
        now = time.perf_counter()
        elapsed = now - self.started
        self.first_step = getattr(self, "first_step", now)  # validation before the first step is not a step
        finished = self.done - 1  # the step that starts now is not finished
        per_step = (now - self.first_step) / finished if finished else 0.0
        eta = f", ETA ~{per_step * (self.steps - finished):.1f} s" if finished else ""
        # Wrapped at the width; each continuation line repeats the step's prefix (indented by two), so every line of
        # a log says which step it belongs to.
        prefix = f"rope-extend: [{self.done}/{self.steps}] "
        lines = wrap(f"{prefix}{message} ({elapsed:.1f} s elapsed{eta})", console.width, hang=prefix + "  ")
        print("\n".join(lines), file=sys.stderr, flush=True)
