"""`rope-extend eval` in transformers and in vLLM, side by side on the same suite: speed ratio and equal numbers.

    nice -n 10 python bench/eval_engines.py                      # the demo model, quick suite, unpatched + yarn x2
    python bench/eval_engines.py --suite smoke --spec method=ntk,factor=2 -o /tmp/bench-eval-engines

Runs `python -m rope_extend eval MODEL --suite S --spec ... -o OUT/<engine> [--engine vllm]` for each engine, in
turn, each in a fresh child process with one CPU thread (OMP_NUM_THREADS=1 for transformers,
VLLM_CPU_OMP_THREADS_BIND=0 for vLLM: the same cores for both), and measures the child's wall and CPU seconds
(os.wait4: vLLM's worker and engine processes included). Then every case both ran is compared: perplexity within
1e-3 (relative), every probe answer the same text; the unpatched model's cases beyond its window are not served by
vLLM (its cos/sin cache has L rows) and are listed as such. OUT/results.jsonl holds one line per engine run (its
command, seconds, load average, date), OUT/README.md the table; an engine whose eval folder finished is not rerun
(delete its folder to time it again).

Default OUT: eval/reports/bench-eval-engines.
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
from pathlib import Path

from common import ROOT, cpu_name

ENGINES = ("transformers", "vllm")


def run_eval(engine: str, args, out: Path) -> dict:
    folder = out / engine
    cmd = [sys.executable, "-m", "rope_extend", "eval", args.model, "--suite", args.suite, "-o", str(folder),
           "--no-plots"]
    for spec in args.spec:
        cmd += ["--spec", spec]
    if engine != "transformers":
        cmd += ["--engine", engine]
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_OMP_THREADS_BIND="0", HF_HUB_OFFLINE="1")
    load_before = os.getloadavg()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed:\n{err[-3000:]}")
    return {
        "engine": engine, "command": shlex.join(["python", *cmd[1:]]),
        "wall_s": round(time.perf_counter() - started, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "load_before": [round(x, 1) for x in load_before], "load_after": [round(x, 1) for x in os.getloadavg()],
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": f"{cpu_name()}, {os.cpu_count()} cores, 1 thread per engine",
        "left_out": [line for line in err.splitlines() if "left out" in line],
    }


def records(folder: Path) -> dict:
    out = {}
    for line in (folder / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        out[(r["variant"], r["case_id"])] = r
    return out


def compare(out: Path) -> list[str]:
    hf, vl = records(out / "transformers"), records(out / "vllm")
    lines = ["| variant | case | transformers | vLLM | agree |", "|---|---|---|---|---|"]
    for key, a in hf.items():
        b = vl.get(key)
        if a["kind"] == "perplexity":
            left = f"ppl {a['metrics']['ppl']:.4f}"
            if b is None:
                lines.append(f"| {key[0]} | {key[1]} | {left} | not served | - |")
                continue
            rel = abs(b["metrics"]["ppl"] / a["metrics"]["ppl"] - 1)
            lines.append(f"| {key[0]} | {key[1]} | {left} | ppl {b['metrics']['ppl']:.4f} | "
                         f"{'yes' if rel <= 1e-3 else 'NO'} ({rel:.1e} relative) |")
        else:
            left = f"{a['metrics']['output']!r} (score {a['metrics']['score']:g})"
            if b is None:
                lines.append(f"| {key[0]} | {key[1]} | {left} | not served | - |")
                continue
            same = a["metrics"]["output"] == b["metrics"]["output"]
            lines.append(f"| {key[0]} | {key[1]} | {left} | {b['metrics']['output']!r} | "
                         f"{'yes' if same else 'NO'} |")
    return [line.replace("\n", " ") for line in lines]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--suite", default="quick")
    ap.add_argument("--spec", action="append", default=None, help="inline spec (default: method=yarn,factor=2)")
    ap.add_argument("-o", "--output", type=Path, default=ROOT / "eval" / "reports" / "bench-eval-engines")
    args = ap.parse_args(argv)
    args.spec = args.spec or ["method=yarn,factor=2"]
    out = args.output
    out.mkdir(parents=True, exist_ok=True)
    log = out / "results.jsonl"
    runs = {json.loads(line)["engine"]: json.loads(line) for line in log.read_text().splitlines()} \
        if log.is_file() else {}
    for engine in ENGINES:
        if engine in runs:
            continue
        print(f"[{engine}] evaluating ...", file=sys.stderr, flush=True)
        runs[engine] = run_eval(engine, args, out)
        with open(log, "a") as f:
            f.write(json.dumps(runs[engine]) + "\n")
        print(f"[{engine}] {runs[engine]['wall_s']} s wall, {runs[engine]['cpu_s']} s CPU", file=sys.stderr)
    hf, vl = runs["transformers"], runs["vllm"]
    command = "nice -n 10 python bench/eval_engines.py " + shlex.join(argv)
    text = [
        "# `rope-extend eval` in transformers and in vLLM, side by side\n",
        f"Command: `{command}` (each engine's own command below). Device: {hf['device']}. Date: "
        f"{hf['finished'][:10]}.\n",
        "| engine | wall s | CPU s (children included) | load average before / after | command |",
        "|---|---|---|---|---|",
    ]
    for r in (hf, vl):
        text.append(f"| {r['engine']} | {r['wall_s']} | {r['cpu_s']} | {r['load_before'][0]} / {r['load_after'][0]} "
                    f"| `{r['command']}` |")
    a, b = records(out / "transformers"), records(out / "vllm")
    common = [key for key in a if key in b]
    work = {name: sum(r[key]["seconds"] for key in common) for name, r in (("transformers", a), ("vllm", b))}
    text += ["", f"On the {len(common)} cases both ran (each record's seconds: model work, loading excluded): "
             f"transformers {work['transformers']:.0f} s, vLLM {work['vllm']:.0f} s, vLLM / transformers "
             f"**{work['vllm'] / work['transformers']:.2f}x**. Whole commands (starts and loads included"
             f"{'' if len(b) == len(a) else f'; vLLM evaluates {len(b)} cases of {len(a)}'}): wall "
             f"{vl['wall_s'] / hf['wall_s']:.2f}x, CPU {vl['cpu_s'] / hf['cpu_s']:.2f}x.",
             ""]
    text += [f"- {line.split('rope-extend: ', 1)[-1]}" for line in vl["left_out"]]
    text += ["", *compare(out), ""]
    (out / "README.md").write_text("\n".join(text))
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
