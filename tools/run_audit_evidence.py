"""`rope-extend engines MODEL --run ...` on the models issue 64 names: the audit's verdicts in the real engines.

For each case -- Qwen2.5-7B-Instruct with the YaRN x4 its card tells users to add, Llama-3.1-8B's llama3,
Phi-3.5-mini-instruct's LongRoPE (short and long requests), Gemma 4's proportional RoPE as shipped and with `factor`
2 in its full-attention slot -- `python -m rope_extend engines MODEL --run vllm --run sglang --long-tokens N --json`
runs in a fresh process on the real config.json (tests/data/hub*, tests/real_configs: a Hub cache holding only
config.json, built here, offline). Then the deliberately wrong overrides: each engine's audit route for Qwen2.5
forged to serve a wrong override while its port rows (from the true route) say identical (vLLM: the YaRN factor
4.1, 2.5 % off; SGLang: transformers' YaRN magnitude copied into `attn_factor`, sgl-project/sglang#33558), run in
this process (`--wrong ENGINE`, the forging is the tests' own: tests/test_vllm_engine.py, test_sglang_engine.py).

One JSON line per case is appended to OUT/results.jsonl as it finishes (the command, exit status, the report, wall
seconds, the load average before and after, the date) and OUT/README.md is rewritten from the lines: resumable, a
finished case is skipped when the same command runs again.

    nice -n 10 python tools/run_audit_evidence.py -o eval/reports/audit-run
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
sys.path.insert(0, str(ROOT / "tests"))
RESULTS = "results.jsonl"
QWEN, LLAMA, PHI = "Qwen/Qwen2.5-7B-Instruct", "meta-llama/Llama-3.1-8B", "microsoft/Phi-3.5-mini-instruct"
CASES = ("qwen2.5-yarn4", "llama3.1-llama3", "phi3.5-longrope", "gemma4-proportional", "gemma4-proportional-factor2",
         "wrong-vllm", "wrong-sglang", "llama3.1-llama3-mlx", "qwen2.5-yarn4-mlx", "phi3.5-longrope-mlx",
         "gemma4-proportional-mlx")
ONE_ENGINE = "-mlx"  # a case served in that engine alone (mlx-cpu is the slow one: its own case)


def prepare(work: Path) -> dict[str, str]:
    """The Hub cache (config.json only) and the Gemma 4 folders; returns case -> MODEL argument."""
    import hubcache

    cache = work / "hub"
    hubcache.build_config(cache, QWEN, hubcache.QWEN_YARN)
    for repo in (LLAMA, PHI):
        hubcache.build_config(cache, repo)
    gemma = json.loads((ROOT / "tests" / "real_configs" / "gemma4_text-e2b.json").read_text())
    for name, factor in (("gemma4_text-e2b", None), ("gemma4_text-e2b-factor2", 2.0)):
        config = json.loads(json.dumps(gemma))
        if factor:
            config["rope_parameters"]["full_attention"]["factor"] = factor
        (work / name).mkdir(parents=True, exist_ok=True)
        (work / name / "config.json").write_text(json.dumps(config, indent=2))
    return {"qwen2.5-yarn4": QWEN, "llama3.1-llama3": LLAMA, "phi3.5-longrope": PHI,
            "gemma4-proportional": str(work / "gemma4_text-e2b"),
            "gemma4-proportional-factor2": str(work / "gemma4_text-e2b-factor2"),
            "wrong-vllm": QWEN, "wrong-sglang": QWEN, "llama3.1-llama3-mlx": LLAMA, "qwen2.5-yarn4-mlx": QWEN,
            "phi3.5-longrope-mlx": PHI, "gemma4-proportional-mlx": str(work / "gemma4_text-e2b")}


def forged_run(engine: str, tokens: int) -> int:
    """`rope-extend engines QWEN --run ENGINE --json` with ENGINE's audit route forged to serve a wrong override."""
    import dataclasses
    import math

    from rope_extend.cli import run
    from rope_extend.engines.registry import get_engine

    room = get_engine(engine)
    true_routes = room.audit_routes
    port = __import__(f"rope_extend.engines.{engine}.port", fromlist=["load_config"])

    def forged(model):
        _, full = port.load_config(dict(model.loaded))
        if engine == "vllm":
            return [dataclasses.replace(r, settings=dataclasses.replace(
                r.settings, hf_overrides={"rope_parameters": {**full, "factor": 4.1}})) for r in true_routes(model)]
        wrong = {"rope_parameters": {**full, "attn_factor": 0.1 * math.log(4) + 1}}
        return [dataclasses.replace(r, settings=dataclasses.replace(r.settings, override_args=wrong))
                for r in true_routes(model)]

    room.audit_routes = forged
    return run(["engines", QWEN, "--run", engine, "--long-tokens", str(tokens), "--json"])


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def done(out: Path) -> dict[str, dict]:
    path = out / RESULTS
    if not path.is_file():
        return {}
    return {r["case"]: r for r in map(json.loads, path.read_text().splitlines())}


def run_case(case: str, model: str, work: Path, tokens: int, runs: list[str]) -> dict:
    env = {"HF_HUB_CACHE": str(work / "hub"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    if case.endswith(ONE_ENGINE):
        runs = [ONE_ENGINE.removeprefix("-")]
    if case.startswith("wrong-"):
        engine = case.removeprefix("wrong-")
        argv = [sys.executable, str(Path(__file__).resolve()), "--forged", engine, "--long-tokens", str(tokens)]
    else:
        argv = [sys.executable, "-m", "rope_extend", "engines", model, *[f"--run={r}" for r in runs],
                "--long-tokens", str(tokens), "--json"]
    shown = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items() if k != "PYTHONPATH"),
                      "python", *map(shlex.quote, argv[1:])]).replace(str(ROOT) + "/", "")
    before, started = load(), time.perf_counter()
    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **env}, cwd=ROOT)
    seconds = round(time.perf_counter() - started, 1)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        report = None
    contradicted = [line for line in proc.stderr.splitlines() if line.startswith("contradicted:")]
    return {"case": case, "model": model, "command": shown, "exit_status": proc.returncode, "contradicted":
            contradicted, "started": date, "seconds": seconds, "load_before": before, "load_after": load(),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "niceness": os.nice(0),
            "report": report, "stderr_tail": proc.stderr[-3000:] if report is None else ""}


def readme(out: Path, records: dict[str, dict]) -> None:
    lines = ["# The audit, run: issue 64's models in the real engines",
             "", "Written by `tools/run_audit_evidence.py` from results.jsonl (one line per case: the command, the "
             "report, the load). Each row: a real engine serving a small random-weight model of the model's "
             "config.json through one audit route with the route's printed settings; max / mean |Δ logprob| of the "
             "prompt tokens against transformers running the same config.json on the same model and token ids, "
             "and what the engine's port gives the same route at the same lengths. A command recorded with "
             "`--run-tokens N` ran before that option was merged into `engines --long-tokens N` (the same meaning: "
             "the longest request the run serves).", ""]
    for case in CASES:
        r = records.get(case)
        if r is None:
            continue
        rep = r["report"] or {}
        run = rep.get("run", {})
        lines += [f"## {case}", "", f"`{r['command']}`", "",
                  f"{r['started'][:10]}, {r['machine']}, nice {r['niceness']}, load {r['load_before']} -> "
                  f"{r['load_after']}, {r['seconds']:.0f} s, exit status {r['exit_status']}"
                  + (f"; small model: {run['model']['architecture']}, {run['model']['layers']} layer"
                     f"{'s' if run['model']['layers'] != 1 else ''}, {run['model']['sharpened']}" if run else ""), ""]
        if not rep:
            lines += ["No report:", "", "```", r["stderr_tail"][-1500:], "```", ""]
            continue
        lines += [f"| engine | route | short ({run.get('short_tokens')}) | long ({run.get('long_tokens')}) | port "
                  "(same lengths) | agrees |", "|---|---|---|---|---|---|"]
        for row in rep["rows"]:
            if not row.get("served_by_engine"):
                continue
            cells = [_cell(row[k]) for k in ("short", "long")]
            port = ", ".join(_port(row["port_at_measured_lengths"][k]) for k in ("short", "long"))
            lines.append(f"| {row['engine']} | `{row['route']}` | {cells[0]} | {cells[1]} | {port} | "
                         f"{'yes' if row['agrees_with_port'] else 'NO'} |")
        verdicts = {v["engine"]: v for v in rep["verdicts"]}
        lines += ["", "The ports' verdicts (at the audited lengths "
                  f"{rep['short_tokens']} and {rep['long_tokens']}):", ""]
        for name, v in verdicts.items():
            if name.startswith("transformers") or name.startswith("llama.cpp"):
                continue
            word = {True: "identical", False: "DIFFERS", None: "not checked"}[v["identical"]]
            if v.get("up_to"):  # identical on the short request only, with the command that serves that window
                word = f"identical only up to {v['up_to']} tokens"
            lines.append(f"- {name}: {word}" + (f", with `{v['command']}`" if v.get("command") else ""))
        for line in r["contradicted"]:
            lines.append(f"- {line}")
        lines.append("")
    (out / "README.md").write_text("\n".join(lines))


def _cell(result: dict) -> str:
    if not result.get("served"):
        return f"not served: {result['reason'][:160]}"
    mark = "identical" if result["identical"] else "DIFFERS"
    return f"{mark} ({result['max_abs_dlogprob']:.2g} / {result['mean_abs_dlogprob']:.2g})"


def _port(result: dict) -> str:
    if not result.get("served"):
        if result.get("unchecked"):
            return "unchecked"
        return "not modelled" if result["reason"].startswith("not ") else "not served"
    return "identical" if result["identical"] else "differs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-o", "--out", default="eval/reports/audit-run")
    parser.add_argument("--work", default="/tmp/rope-extend-audit-evidence",
                        help="where the Hub cache (config.json only) and the Gemma 4 folders go")
    parser.add_argument("--long-tokens", type=int, default=8192)
    parser.add_argument("--runs", nargs="+", default=["vllm", "sglang"],
                        help="the engines of every case but those named ...-mlx (served in mlx-lm alone)")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--forged", choices=("vllm", "sglang"), help=argparse.SUPPRESS)
    parser.add_argument("--readme", action="store_true", help="only rewrite OUT/README.md from OUT/results.jsonl")
    args = parser.parse_args(argv)
    if args.forged:
        return forged_run(args.forged, args.long_tokens)
    out = Path(args.out)
    if args.readme:
        readme(out, done(out))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work).resolve()
    models = prepare(work)
    records = done(out)
    for case in args.cases:
        if case in records:
            print(f"{case}: done ({records[case]['started']})", flush=True)
            continue
        print(f"{case}: running", flush=True)
        record = run_case(case, models[case], work, args.long_tokens, args.runs)
        with open(out / RESULTS, "a") as f:
            f.write(json.dumps(record) + "\n")
        records[case] = record
        readme(out, records)
        print(f"{case}: exit {record['exit_status']} in {record['seconds']:.0f} s", flush=True)
    readme(out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
