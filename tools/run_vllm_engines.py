"""`rope-extend engines OUT --run vllm` on the checkpoints `rope-extend patch` writes, one method after another.

The evidence that a real vLLM serves each method as the card says: for every frequency method (or --methods),
`python -m rope_extend patch MODEL --method M --factor S -o WORK/M --overwrite` (config only, the weights linked),
then `python -m rope_extend engines WORK/M --run vllm [--run vllm-server] --json` in a fresh process. One JSON line
per method is appended to OUT/results.jsonl as it finishes (both commands, the report, wall seconds, the load
average before and after, the date, the device) and OUT/README.md is rewritten from the lines: resumable, a
finished method is skipped when the same command runs again.

    # the demo model at 2x (L = 8192: the long request is 16384 tokens), one CPU thread for vLLM and transformers
    nice -n 10 python tools/run_vllm_engines.py --model smollm2 --factor 2 -o eval/reports/vllm-engines-smollm2
    # make vllm-check: the suite's 2-layer model (window 256), every method and the server route too
    python tools/run_vllm_engines.py --model short-window --runs vllm vllm-server -o eval/reports/vllm-engines-tiny
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FREQUENCY_METHODS = ("linear", "ntk", "ntk-by-parts", "yarn", "dynamic", "dynamic-yarn", "llama3", "longrope")
RESULTS = "results.jsonl"


def model_path(name: str, work: Path) -> Path:
    if name == "smollm2":
        from rope_extend.demo_model import smollm2_path

        return smollm2_path()
    if name == "short-window":
        from rope_extend.eval.tiny import short_window_demo

        return short_window_demo(work / "short-window-demo")
    return Path(name)


def longrope_factors(half: int, factor: float) -> list[str]:
    """Illustrative LongRoPE factors (as the docs table's): long 1..s across the frequencies, short 1..1.5."""
    long = ",".join(f"{1.0 + (factor - 1.0) * i / (half - 1):.6g}" for i in range(half))
    short = ",".join(f"{1.0 + 0.5 * i / (half - 1):.6g}" for i in range(half))
    return ["--set", f"long_factor=[{long}]", "--set", f"short_factor=[{short}]"]


def run(cmd: list[str], env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc


def table(records: list[dict]) -> str:
    """The README's table: one line per (method, engine row) of the real runs, with the port's verdict beside."""
    from rope_extend.engines.parity import LOGPROB_TOL

    lines = ["| method | engine (run) | route | short request | long request | port says |", "|---|---|---|---|---|---|"]
    for rec in records:
        rows = rec["report"]["rows"]
        for row in rows:
            if row["checked"] != "run" or row["engine"].startswith("transformers"):
                continue
            port = next(p for p in rows if p["checked"] == "port" and p["engine"].startswith("vLLM")
                        and p["route"] == row["route"])
            cells = [_cell(row[k]) for k in ("short", "long")]
            said = " / ".join(_cell(port[k]) for k in ("short", "long"))
            lines.append(f"| {rec['method']} | {row['engine']} | {row['route']} | {cells[0]} | {cells[1]} | {said} |")
    return "\n".join(lines) + f"\n\nIdentical: no NaN and max |Δ logprob| <= {LOGPROB_TOL:g} (nats).\n"


def _cell(result: dict) -> str:
    if not result["served"]:
        return "cannot: " + result["reason"].replace("|", "/")[:160]
    mark = "identical" if result["identical"] else "DIFFERS"
    if "max_abs_dlogprob" in result:
        nan = f", {result['nan']} NaN from token {result['first_nan']}" if result["nan"] else ""
        return f"{mark} (Δlogprob {result['max_abs_dlogprob']:.2g}{nan}; {result['tokens']} tokens)"
    return f"{mark} ({max(result['max_abs_dcos'], result['max_abs_dsin']):.2g})"


def write_readme(out: Path, records: list[dict], argv: list[str]) -> None:
    command = "nice -n 10 python tools/run_vllm_engines.py " + shlex.join(argv)
    first = records[0] if records else {}
    text = [
        f"# `rope-extend engines --run` on {first.get('model', '?')}\n",
        "Written by `tools/run_vllm_engines.py` from `results.jsonl` (one line per method; the patch and engines "
        "commands of each are in its line).\n",
        f"Command: `{command}`\n",
        f"Device: {first.get('device', '?')}; vLLM: {first.get('vllm', '?')}; dates: "
        f"{', '.join(sorted({r['finished'][:10] for r in records}))}.\n",
        table(records),
        "| method | seconds | load average before / after |",
        "|---|---|---|",
    ]
    text += [f"| {r['method']} | {r['seconds']:.0f} | {r['load_before']} / {r['load_after']} |" for r in records]
    (out / "README.md").write_text("\n".join(text) + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2, short-window (the suite's model) or a folder")
    ap.add_argument("--factor", type=float, default=2.0)
    ap.add_argument("--methods", nargs="+", default=list(FREQUENCY_METHODS))
    ap.add_argument("--runs", nargs="+", default=["vllm"], help="vllm, vllm-server")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads for vLLM and for transformers")
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)

    from rope_extend.engines.vllm_env import ensure_vllm

    vllm = ensure_vllm()
    out = args.output
    out.mkdir(parents=True, exist_ok=True)
    from rope_extend.demo_model import cache_root

    work = cache_root() / "vllm-engines-work" / out.name  # the patched checkpoints (config only, weights linked)
    work.mkdir(parents=True, exist_ok=True)
    model = model_path(args.model, work)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), HF_HUB_OFFLINE="1",
               VLLM_CPU_OMP_THREADS_BIND="0" if args.threads == 1 else f"0-{args.threads - 1}")
    results = out / RESULTS
    records = [json.loads(line) for line in results.read_text().splitlines()] if results.is_file() else []
    key = {(r["model"], r["method"], r["factor"], tuple(r["runs"])) for r in records}
    for method in args.methods:
        if (args.model, method, args.factor, tuple(args.runs)) in key:
            continue
        ckpt = work / f"{method}-x{args.factor:g}"
        patch = [sys.executable, "-m", "rope_extend", "patch", str(model), "--method", method, "--factor",
                 f"{args.factor:g}", "-o", str(ckpt), "--overwrite"]
        if method == "longrope":
            patch += longrope_factors(32, args.factor)
        engines = [sys.executable, "-m", "rope_extend", "engines", str(ckpt), "--json"]
        for name in args.runs:
            engines += ["--run", name]
        load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
        started = time.perf_counter()
        print(f"[{method}] {shlex.join(patch[1:])}", file=sys.stderr, flush=True)
        run(patch, env)
        print(f"[{method}] {shlex.join(engines[1:])}", file=sys.stderr, flush=True)
        report = json.loads(run(engines, env).stdout)
        record = {
            "model": args.model, "method": method, "factor": args.factor, "runs": args.runs,
            "patch_command": shlex.join(["python", *patch[1:]]), "engines_command": shlex.join(["python", *engines[1:]]),
            "report": report, "seconds": round(time.perf_counter() - started, 1),
            "load_before": load_before, "load_after": " ".join(f"{x:.1f}" for x in os.getloadavg()),
            "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "device": f"{platform.processor() or platform.machine()} CPU, {os.cpu_count()} cores, {args.threads} "
                      "thread(s) for vLLM and transformers",
            "vllm": vllm.label,
        }
        with open(results, "a") as f:
            f.write(json.dumps(record) + "\n")
        records.append(record)
        write_readme(out, records, argv)
        print(f"[{method}] done in {record['seconds']:.0f} s", file=sys.stderr, flush=True)
    write_readme(out, records, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
