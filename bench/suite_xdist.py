"""Does pytest-xdist pay on this machine? The same test files in one process and in `make test`'s two workers.

    python bench/suite_xdist.py [--repeats 1] [FILE ...]   (default: a 2-3 minute slice of test-core)

Each run is `python -m pytest -q -p no:cacheprovider -m "not engines and not check" FILES`, once with one process
(`make test XDIST=`) and once with `-n 2 --dist loadgroup` (the Makefile's XDIST), alternated so that machine noise
hits both alike; prints the wall times, the ratio and the load average, and writes them with the command and the
device to eval/reports/suite-xdist/README.md. The suite keeps xdist only where this ratio says it pays
(docs/development.md, "Timings").
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone

from common import ROOT, cpu_name

SLICE = ["tests/test_methods.py", "tests/test_engines.py", "tests/test_gguf.py", "tests/test_hub_push.py",
         "tests/test_reliability.py"]
MODES = {"one process": [], "xdist -n 2": ["-n", "2", "--dist", "loadgroup"]}


def run(files: list[str], extra: list[str]) -> tuple[float, str]:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not engines and not check",
               *extra, *files]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} failed:\n{done.stdout[-3000:]}")
    return wall, done.stdout.strip().splitlines()[-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", default=SLICE)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("-o", "--output", default="eval/reports/suite-xdist")
    args = ap.parse_args()
    load = [" ".join(f"{x:.1f}" for x in os.getloadavg())]
    walls: dict[str, list[float]] = {mode: [] for mode in MODES}
    said = ""
    for repeat in range(args.repeats):
        order = list(MODES) if repeat % 2 == 0 else list(MODES)[::-1]
        for mode in order:
            wall, said = run(args.files, MODES[mode])
            walls[mode].append(wall)
            print(f"{mode}: {wall:.0f} s ({said})", file=sys.stderr, flush=True)
    load.append(" ".join(f"{x:.1f}" for x in os.getloadavg()))
    best = {mode: min(values) for mode, values in walls.items()}
    ratio = best["one process"] / best["xdist -n 2"]
    command = "python bench/suite_xdist.py " + shlex.join(sys.argv[1:])
    device = f"{cpu_name()}, {os.cpu_count()} cores"
    lines = [
        "# pytest-xdist on this machine: one process against two workers",
        "",
        f"Written by `{command.strip()}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; device: {device}; "
        f"load average before / after: {load[0]} / {load[1]}; files: {', '.join(args.files)} ({said}).",
        "",
        "| mode | wall seconds (each run) | best |",
        "|---|---|---:|",
        *[f"| {mode} | {', '.join(f'{w:.0f}' for w in values)} | {best[mode]:.0f} |" for mode, values in walls.items()],
        "",
        f"One process / two workers: **{ratio:.2f}x** (best of {args.repeats}).",
        "",
    ]
    out = ROOT / args.output  # an absolute -o stays as given
    out.mkdir(parents=True, exist_ok=True)
    (out / "README.md").write_text("\n".join(lines))
    (out / "result.json").write_text(json.dumps({"command": command.strip(), "device": device, "load": load,
                                                 "files": args.files, "walls": walls, "ratio": round(ratio, 3)},
                                                indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
