"""Where the suite's time goes: the slowest test files, as a table in docs/development.md.

Runs pytest with a JUnit XML report (or reads the reports given with --junit), sums each file's test times, and
writes the slowest files between the TEST-DURATIONS markers of docs/development.md (or prints them with --print),
with the date, the commit, the command, the machine (CPUs) and the load average sampled during the run: a table
whose numbers are those of one real run, never edited by hand.

    # the 5.x suite as `make test` runs it, then the table (docs/development.md, "Where the suite's time goes")
    python tools/test_durations.py --run -- -q -p no:cacheprovider
    # a report written earlier (several: summed), e.g. by `pytest --junitxml=suite.xml`
    python tools/test_durations.py --junit suite.xml --load "3.1-4.0" --command "pytest ..."

A test's time is pytest's (set-up, call and tear-down), so a session fixture's cost lands on the first test that
uses it: the file that builds a shared environment carries it.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "development.md"
START, END = "<!-- TEST-DURATIONS:BEGIN -->", "<!-- TEST-DURATIONS:END -->"
ROWS = 25


@dataclass
class FileTime:
    """One test file's tests in a report: their count, summed seconds and outcomes, and its slowest test."""

    path: str
    tests: int = 0
    seconds: float = 0.0
    failed: int = 0
    skipped: int = 0
    slowest: tuple[float, str] = (0.0, "")


def _file_of(case: ET.Element) -> str:
    """tests/test_x.py from a testcase's `file` attribute, else its classname ('tests.test_x[.Class]')."""
    if case.get("file"):
        return case.get("file")
    parts = case.get("classname", "").split(".")
    module = [p for p in parts if not p[:1].isupper()]  # drop a test class
    return "/".join(module) + ".py"


def read_reports(paths) -> dict[str, FileTime]:
    """Every testcase of the JUnit XML reports, summed per test file."""
    files: dict[str, FileTime] = {}
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            name = _file_of(case)
            entry = files.setdefault(name, FileTime(name))
            seconds = float(case.get("time") or 0.0)
            entry.tests += 1
            entry.seconds += seconds
            entry.failed += any(child.tag in ("failure", "error") for child in case)
            entry.skipped += any(child.tag == "skipped" for child in case)
            if seconds > entry.slowest[0]:
                entry.slowest = (seconds, case.get("name", ""))
    return files


def table(files: dict[str, FileTime], *, when: str, command: str, load: str, commit: str, rows: int = ROWS) -> str:
    """The markdown block: a header line saying what ran where, then the slowest `rows` files and the rest summed."""
    ordered = sorted(files.values(), key=lambda f: -f.seconds)
    total = sum(f.seconds for f in ordered)
    tests = sum(f.tests for f in ordered)
    failed = sum(f.failed for f in ordered)
    lines = [
        f"Measured {when} on {commit}: `{command}`, {os.cpu_count()} CPUs ({platform.machine()}), load average "
        f"{load} during the run; {tests} tests in {len(ordered)} files, {total:.0f} s of test time"
        + (f", {failed} failed" if failed else "") + ".",
        "",
        "| file | tests | seconds | share | slowest test (s) |",
        "|---|---:|---:|---:|---|",
    ]
    for f in ordered[:rows]:
        share = 100 * f.seconds / total if total else 0.0
        lines.append(f"| {f.path} | {f.tests} | {f.seconds:.0f} | {share:.1f} % | {f.slowest[1]} ({f.slowest[0]:.0f}) |")
    rest = ordered[rows:]
    if rest:
        seconds = sum(f.seconds for f in rest)
        lines.append(f"| {len(rest)} other files | {sum(f.tests for f in rest)} | {seconds:.0f} | "
                     f"{100 * seconds / total if total else 0.0:.1f} % | |")
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    """`text` with what stands between START and END replaced by `block`; ValueError when a marker is missing."""
    if START not in text or END not in text or text.index(START) > text.index(END):
        raise ValueError(f"{DOC.relative_to(ROOT)} has no {START} ... {END} block: add the two markers where the "
                         "table goes")
    head, rest = text.split(START, 1)
    return f"{head}{START}\n{block}\n{END}{rest.split(END, 1)[1]}"


class LoadSampler:
    """The 1-minute load average every `every` seconds while a run goes (its range is what the table says)."""

    def __init__(self, every: float = 15.0):
        self.every, self.values, self._stop = every, [], threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self.values.append(os.getloadavg()[0])
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.values.append(os.getloadavg()[0])

    def describe(self) -> str:
        return f"{min(self.values):.1f}-{max(self.values):.1f}" if self.values else "unknown"


def _commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "an unknown commit"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="store_true", help="run pytest (the arguments after --) with a JUnit report")
    parser.add_argument("--junit", nargs="+", type=Path, default=[], help="read these JUnit XML reports instead")
    parser.add_argument("--load", help="the load average during the run the reports come from (with --junit)")
    parser.add_argument("--command", help="the command the reports come from (with --junit)")
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--print", action="store_true", help="print the table instead of writing docs/development.md")
    parser.add_argument("pytest_args", nargs="*", help="pytest's arguments (after --)")
    args = parser.parse_args(argv)
    if args.run == bool(args.junit):
        parser.error("give --run (and pytest's arguments after --) or --junit REPORT...")
    rc = 0
    if args.run:
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "junit.xml"
            command = [sys.executable, "-m", "pytest", *args.pytest_args, f"--junitxml={report}"]
            with LoadSampler() as load:
                started = time.monotonic()
                rc = subprocess.call(command, cwd=ROOT)
                wall = time.monotonic() - started
            if not report.is_file():
                print(f"pytest wrote no report (exit {rc})", file=sys.stderr)
                return rc or 1
            files = read_reports([report])
        what = f"python -m pytest {shlex.join(args.pytest_args)}".strip() + f" ({wall / 60:.1f} min wall)"
        load_text = load.describe()
    else:
        files, what, load_text = read_reports(args.junit), args.command or "pytest", args.load or "unknown"
    block = table(files, when=date.today().isoformat(), command=what, load=load_text, commit=_commit(),
                  rows=args.rows)
    if args.print:
        print(block)
    else:
        DOC.write_text(replace_block(DOC.read_text(), block))
        print(f"wrote the table of {len(files)} files into {DOC.relative_to(ROOT)}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
