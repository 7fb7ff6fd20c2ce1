"""CLI startup: `rope-extend --help`, `--version`, `methods`, `validate` against a bare `python -c pass`.

    python bench/cli_startup.py [--repeats 5]

Each command runs in a fresh interpreter (`python -m rope_extend ...`, as the console script does), interleaved
with the bare interpreter start so machine noise hits all alike; best of `--repeats` wall times. Also reported:
whether the command imported torch (it must not: tests/test_cli_startup.py checks that too).
Goal: each command <= 0.5 s over the bare interpreter start.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from common import ROOT

GOAL_S = 0.5
COMMANDS = {
    "--help": ["--help"],
    "--version": ["--version"],
    "methods": ["methods"],
    "validate": ["validate", "configs/yarn-x8.yaml"],
}
# prints whether torch was imported by the time the command finished (the console script's own path)
PROBE = (
    "import sys, runpy; sys.argv = ['rope-extend', *sys.argv[1:]]\n"
    "try:\n    runpy.run_module('rope_extend', run_name='__main__')\n"
    "except SystemExit:\n    pass\n"
    "print('torch imported' if 'torch' in sys.modules else 'torch not imported', file=sys.stderr)\n"
)


def wall(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, cwd=ROOT)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("COLUMNS", "100")
    runs = {"python -c pass": [sys.executable, "-c", "pass"]}
    runs |= {f"rope-extend {name}": [sys.executable, "-m", "rope_extend", *argv] for name, argv in COMMANDS.items()}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for argv in runs.values():  # warm the file cache and the bytecode once, untimed
        wall(argv)
    for _ in range(args.repeats):
        for name, argv in runs.items():
            times[name].append(wall(argv))
    bare = min(times["python -c pass"])
    print(f"best of {args.repeats}, wall seconds (load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs)")
    print(f"{'command':<24} {'best':>7} {'over bare':>10}  {'torch':<18} goal <= {GOAL_S} s over bare")
    worst = 0.0
    for name, argv in runs.items():
        best = min(times[name])
        torch_note = ""
        if name != "python -c pass":
            probe = subprocess.run([sys.executable, "-c", PROBE, *argv[3:]], capture_output=True, text=True, cwd=ROOT)
            torch_note = probe.stderr.strip().splitlines()[-1]
            worst = max(worst, best - bare)
        print(f"{name:<24} {best:7.3f} {best - bare:+10.3f}  {torch_note:<18}")
    print(f"worst over bare: {worst:.3f} s -> {'met' if worst <= GOAL_S else 'NOT met'}")


if __name__ == "__main__":
    main()
