"""Run one of the suite's long checks (tests/checks/, behind `make *-check`) and keep its record in the repository.

The suite keeps a short version of each on the 2-layer model (tests/test_*.py, with planted bugs that fail it);
these run the same comparisons on the demo model itself at 12k tokens, or train it, which `make test` cannot afford.
Each run writes OUT/README.md (what ran, when, on which commit and machine, at which load average; every test's
outcome and seconds, and what it printed: the numbers) and OUT/results.json (the same, for tools), then exits with
pytest's status. A failed run is recorded too: the record says so.

    make llamacpp-check   # python tools/run_check.py tests/checks/test_gguf_llamacpp_long.py -o eval/reports/llamacpp-parity-smollm2
    make eval-check       # ... tests/checks/test_eval_smollm2_long.py -o eval/reports/eval-check-smollm2
    make train-check      # ... tests/checks/test_train_smollm2_long.py -o eval/reports/train-check-smollm2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/ and bench/ are not packages: their folders
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from common import cpu_name  # bench/common.py: the CPU's name a record prints
from test_durations import LoadSampler

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()


def read_cases(report: Path) -> list[dict]:
    """Every testcase of a JUnit report (pytest's, with junit_logging=all): name, outcome, seconds, output."""
    cases = []
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "error"
            elif child.tag == "skipped":
                outcome = "skipped"
        output = "\n".join((child.text or "").strip() for child in case if child.tag in ("system-out", "system-err"))
        message = next((child.get("message", "") for child in case if child.tag in ("failure", "error")), "")
        cases.append({"test": case.get("name"), "outcome": outcome, "seconds": round(float(case.get("time") or 0), 1),
                      "message": message[:2000], "output": output.strip()})
    return cases


def printed(output: str) -> list[str]:
    """What a test printed, without pytest's capture headers and progress bars."""
    return [line for line in output.splitlines() if line.strip() and not re.fullmatch(r"-+ Captured \w+ -+", line)
            and not re.search(r"\d+/\d+ \[[^]]*(it/s|s/it)\]", line)]


def readme(record: dict) -> str:
    lines = [
        f"# {record['name']}",
        "",
        f"`{record['command']}` on {record['commit']} ({record['date']}): **{record['summary']}**, "
        f"{record['wall_s'] / 60:.1f} min wall, on {record['machine']} at load average {record['load']} "
        "(written by tools/run_check.py: do not edit).",
        "",
        "| test | outcome | seconds |",
        "|---|---|---:|",
    ]
    lines += [f"| {c['test']} | {c['outcome']} | {c['seconds']:.0f} |" for c in record["cases"]]
    for case in record["cases"]:
        shown = [*case["message"].splitlines(), *printed(case["output"])]
        if shown:
            lines += ["", f"## {case['test']}", "", "```", *shown, "```"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("test_file", type=Path, help="a file of tests/checks/ (or a suite file, with -- -m check)")
    parser.add_argument("-o", "--out", type=Path, required=True, help="the record's folder (eval/reports/NAME)")
    parser.add_argument("--readme", action="store_true", help="rewrite OUT/README.md from OUT/results.json only")
    argv = sys.argv[1:] if argv is None else list(argv)
    ours, pytest_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = parser.parse_args(ours)  # what follows `--` goes to pytest as it is (e.g. `-m check`)
    args.pytest_args = pytest_args
    out = args.out if args.out.is_absolute() else ROOT / args.out
    if args.readme:
        (out / "README.md").write_text(readme(json.loads((out / "results.json").read_text())))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "junit_logging=all",
                   str(args.test_file), *args.pytest_args, f"--junitxml={report}"]
        started = time.monotonic()
        with LoadSampler() as load:
            rc = subprocess.call(command, cwd=ROOT)
        wall = time.monotonic() - started
        if not report.is_file():
            print(f"pytest wrote no report (exit {rc}): no record written", file=sys.stderr)
            return rc or 1
        cases = read_cases(report)
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "error", "skipped")}
    record = {
        "name": out.name,
        "command": f"python tools/run_check.py {args.test_file} -o {args.out}",
        "commit": _git("rev-parse", "--short", "HEAD") + ("+changes" if _git("status", "--porcelain") else ""),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} CPUs ({platform.machine()}, {cpu_name()})",
        "load": load.describe(),
        "wall_s": round(wall, 1),
        "returncode": rc,
        "summary": ", ".join(f"{n} {k}" for k, n in counts.items() if n),
        "cases": cases,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "README.md").write_text(readme(record))
    print(f"{record['summary']} in {wall / 60:.1f} min: the record is {out.relative_to(ROOT)}/README.md")
    return rc


if __name__ == "__main__":
    sys.exit(main())
