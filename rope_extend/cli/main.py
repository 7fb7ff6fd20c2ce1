"""Run the CLI: register the commands, parse, and turn every outcome into an exit code.

Exit codes: 0 success; 2 a user error (one line on stderr: `rope-extend: error: ...`, from the main process only
under a distributed launcher); 3 `engines --run` contradicted the card (a real engine measured otherwise a route it
lists as identical); 130 Ctrl-C (SIGINT) and 143 SIGTERM, with one line saying what was left at the output path.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import traceback
from pathlib import Path

import typer

from ..errors import RopeExtendError
from . import commands  # noqa: F401  registers every command on `app`
from .app import app

USER_ERRORS = (RopeExtendError, ValueError, OSError, KeyError)
OUTPUT_FLAGS = ("-o", "--output")
ATOMIC_COMMANDS = {"patch"}  # commands whose output appears whole or not at all
ACKNOWLEDGE_AFTER = 0.5  # seconds: a signal whose cleanup takes longer is acknowledged on stderr at once


class Signals:
    """SIGINT and SIGTERM both interrupt the work as KeyboardInterrupt (so every `finally` cleans up); which signal
    it was decides the exit code (128 + signal number)."""

    def __init__(self):
        self.received: int | None = None
        self.previous: dict[int, object] = {}
        self.acknowledged = None  # a timer: the line saying the signal was received, if stopping takes a while

    def _handler(self, signum, frame):
        if self.received is None:
            import threading

            name = signal.Signals(signum).name
            self.acknowledged = threading.Timer(ACKNOWLEDGE_AFTER, print, (
                f"rope-extend: {name} received: stopping (what was started is being stopped and cleaned up)",),
                {"file": sys.stderr, "flush": True})
            self.acknowledged.daemon = True
            self.acknowledged.start()
        self.received = signum
        raise KeyboardInterrupt

    def done(self) -> None:
        """Stopped: the acknowledgement is not needed any more (printed already, or never)."""
        if self.acknowledged is not None:
            self.acknowledged.cancel()

    @contextlib.contextmanager
    def installed(self):
        import threading

        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            self.previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handler)
        try:
            yield self
        finally:
            for signum, handler in self.previous.items():
                signal.signal(signum, handler)


def _output_of(argv: list[str]) -> Path | None:
    for i, arg in enumerate(argv):
        if arg in OUTPUT_FLAGS and i + 1 < len(argv):
            return Path(argv[i + 1])
        for flag in OUTPUT_FLAGS:
            if arg.startswith(flag + "=") and flag.startswith("--"):
                return Path(arg.split("=", 1)[1])
    return None


def interrupted(signals: Signals, output: Path | None, atomic: bool) -> int:
    signals.done()
    signum = signals.received or signal.SIGINT
    name = signal.Signals(signum).name
    if output is None:
        left = "nothing was written"
    elif not output.exists():
        left = f"nothing was left at {output}"
    elif atomic:  # patch builds OUT beside it and renames it into place at the very end
        left = f"{output} was left as it was before this run"
    else:  # eval keeps the records it finished (results.jsonl) so that rerunning resumes
        left = f"the finished part is kept in {output}; rerun the same command to resume"
    if output is not None:  # `train` keeps its state beside OUT from before its first step
        from ..train.recipe import STATE_SUFFIX

        state = output.with_name(output.name + STATE_SUFFIX)
        if state.is_dir():
            left += f"; {state} keeps this run's training state: rerun the same command to resume from it"
    print(f"rope-extend: interrupted ({name}); {left}", file=sys.stderr, flush=True)
    return 128 + int(signum)


def _key_error_message(exc: KeyError) -> str:
    """A KeyError's line: raised while rope-extend read an input, an entry the input lacks; raised inside another
    library (accelerate, peft, transformers: the innermost frame's module), that library's failure, named."""
    key = exc.args[0] if exc.args else "?"
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    module = str(tb.tb_frame.f_globals.get("__name__", "")) if tb is not None else ""
    if not module or module.split(".")[0] == "rope_extend":
        return (f"an input lacks the entry {key!r} that rope-extend needs; check the files you passed (--debug "
                "shows where it was read)")
    return (f"KeyError {key!r} raised in {module}: an input may lack that entry, or {module.split('.')[0]} met a "
            "case it does not handle (--debug shows the traceback)")


OTHER_RANK_WAIT_S = 60.0  # how long another process waits for the main one to refuse first (see _other_rank)


def _other_rank() -> bool:
    """A process other than the main one of a distributed launch (torchrun, accelerate and deepspeed set RANK and
    WORLD_SIZE). Every process runs the same command on the same files, so rope-extend's own refusals are the same
    in each and the main process says it: another process waits (`_wait_for_main_process`) instead of exiting
    first, since the launcher stops every process when one exits, and the main one could be stopped before it says
    why. Other errors (an OS error on one node) are said at once by whichever process meets them."""
    import os

    rank, world = os.environ.get("RANK", "0"), os.environ.get("WORLD_SIZE", "1")
    return rank.isdigit() and int(rank) > 0 and world.isdigit() and int(world) > 1


def _wait_for_main_process() -> None:
    """Sleep while the main process refuses the same way and exits: the launcher then stops this process, so the
    refusal is printed once. A process still alive after OTHER_RANK_WAIT_S says its own line (the main process did
    not refuse: the error was this process's alone)."""
    import time

    time.sleep(OTHER_RANK_WAIT_S)


BOOLEAN_WORDS = ("true", "false", "yes", "no", "on", "off", "1", "0")


def _flag_value_hint(argv: list[str]) -> str:
    """For `--overwrite true` (a flag given a value, which click reports as an extra argument): how to write it."""
    for flag, value in zip(argv, argv[1:]):
        if flag.startswith("--") and "=" not in flag and value.lower() in BOOLEAN_WORDS:
            return f"; {flag} is a flag and takes no value: write {flag} (or leave it out) instead of {flag} {value}"
    return ""


def _repo_id_hint(argv: list[str]) -> str:
    """For `push OUT -me/x` (a repo id with a leading dash, which click reads as options): what happened and the id
    meant."""
    import re

    for arg in argv:
        if re.fullmatch(r"-+[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*", arg):
            return (f"; {arg!r} starts with '-', so it was read as options: a Hub repo id starts with a letter or a "
                    f"digit (user/name), e.g. {arg.lstrip('-')!r}")
    return ""


def run(argv: list[str], debug: bool = False) -> int:
    """Run one command line; returns the exit code (never raises for user errors or interrupts)."""
    argv = list(argv)
    if "--debug" in argv:
        argv = [a for a in argv if a != "--debug"]
        debug = True
    command = typer.main.get_command(app)
    output = _output_of(argv)
    atomic = next((a for a in argv if not a.startswith("-")), None) in ATOMIC_COMMANDS
    signals = Signals()
    try:
        with signals.installed():
            code = command.main(args=argv, prog_name="rope-extend", standalone_mode=False)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except KeyboardInterrupt:
        return interrupted(signals, output, atomic)
    except USER_ERRORS as exc:
        if debug:
            traceback.print_exc()
        message = exc
        if isinstance(exc, KeyError) and not isinstance(exc, RopeExtendError):  # a bare key name says nothing
            message = _key_error_message(exc)
        if isinstance(exc, RopeExtendError) and _other_rank():
            _wait_for_main_process()
        print(f"rope-extend: error: {' '.join(str(message).split())}", file=sys.stderr)
        return 2
    except RecursionError:  # a user file nested beyond reason that escaped the boundary checks
        if debug:
            traceback.print_exc()
        print("rope-extend: error: an input file is nested too deeply to read; check the files you passed",
              file=sys.stderr)
        return 2
    except Exception as exc:  # click's own exceptions (typer >= 0.20 vendors click, so match by shape)
        if hasattr(exc, "format_message"):  # usage errors: bad option, missing argument
            message = " ".join(exc.format_message().split())
            hint = _flag_value_hint(argv) if "unexpected extra argument" in message else ""
            hint = hint or (_repo_id_hint(argv) if message.startswith("No such option") else "")
            print(f"rope-extend: error: {message}{hint}", file=sys.stderr)
            return 2
        if type(exc).__name__ == "Abort":
            return interrupted(signals, output, atomic)
        if isinstance(getattr(exc, "exit_code", None), int):  # typer.Exit
            return exc.exit_code
        raise
    if isinstance(code, int) and code == 130:  # typer turns KeyboardInterrupt into Exit(130) and returns it
        return interrupted(signals, output, atomic)
    return code if isinstance(code, int) else 0
