"""Helpers shared by the benchmarks: child-process runs with peak RSS, interleaved timing, the demo model, the CPU's
name for a report."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_child(code: str, *args: str, env: dict | None = None) -> dict:
    """Run `code` in a fresh Python; return its JSON result plus wall seconds and peak RSS (MiB) of that child."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=str(ROOT),
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    out, err = proc.stdout.read(), proc.stderr.read()
    if status != 0:
        raise RuntimeError(f"child failed ({status}):\n{err[-3000:]}")
    result = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    result.setdefault("wall_s", wall)
    result["peak_rss_mib"] = usage.ru_maxrss / 1024
    return result


def interleaved(fns: dict, repeats: int = 5) -> dict[str, list[float]]:
    """Time each function `repeats` times, interleaved A B A B ... so machine noise hits all alike."""
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            started = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - started)
    return times


def median(values):
    return statistics.median(values)


def demo_model() -> Path:
    """The SmolLM2 checkpoint path, resolved in a child: importing rope_extend (torch, transformers) here would
    inflate every later child's peak RSS, which counts the parent's memory at fork time."""
    code = "import json; from rope_extend.demo_model import smollm2_path; print(json.dumps({'path': str(smollm2_path())}))"
    return Path(run_child(code)["path"])


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), for the device line a benchmark prints."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
