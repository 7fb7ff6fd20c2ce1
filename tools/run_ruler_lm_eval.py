"""lm-eval's own RULER needle tasks on the demo model, unpatched and patched, through rope-extend's lm-eval glue.

    PYTHONPATH=$PWD python tools/run_ruler_lm_eval.py -o eval/reports/smollm2-string-ruler \
        --tasks niah_single_1 niah_multikey_2 --length 8192 --limit 20 --dtype bfloat16 \
        --spec method=string --spec method=string,local_value=512

Each (variant, task) is one resumable step: its lm-eval result is written to OUT/<variant>/<task>.json when it
finishes, and a rerun of the same command skips the finished ones. OUT/steps.jsonl records every step's command,
wall time and machine. The prompts are lm-eval's (`lm_eval.tasks.ruler`, generated for the model's tokenizer: the
same prompts for every variant, the first --limit of each length); scoring is lm-eval's (`score,none` = share of
the needle values the answer contains). OUT/summary.md pools them, with Wilson intervals and the paired
difference to the unpatched model on the same prompts.

Needs `pip install ".[ruler]"` (lm-eval imports wonderwords and nltk for these tasks; nltk's failed download of
punkt_tab is harmless: only the essay haystacks split sentences).

`--engine vllm` runs the same tasks through lm-eval's own vLLM backend (`--model vllm`), on each variant written as
a checkpoint folder whose config.json carries its scaling (the weights linked), after checking with the vLLM port
that vLLM serves the variant as rope-extend computes it up to the prompt and its answer (refused otherwise). It
runs under vLLM's Python with lm-eval, rope-extend from the checkout (`make vllm` and the lm-eval layer):

    PY=$(python -m rope_extend.engines.vllm.env --with lm-eval --print-python)
    PYTHONPATH=$PWD $PY tools/run_ruler_lm_eval.py --engine vllm -o OUT-vllm --tasks niah_single_1 --length 4096 \
        --limit 5 --spec method=yarn,factor=2
    PYTHONPATH=$PWD $PY tools/run_ruler_lm_eval.py -o OUT-hf ...           # the transformers side, same Python
    PYTHONPATH=$PWD $PY tools/run_ruler_lm_eval.py --compare OUT-hf OUT-vllm  # every answer and score side by side `niah_multikey_1` (and every `essay` haystack)
loads Paul Graham's essays from the Hugging Face Hub, which this machine cannot reach: use the `needle`-haystack
multikey task `niah_multikey_2` (distractor needles as the haystack) offline.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def machine() -> dict:
    import torch
    import transformers

    sys.path.insert(0, str(ROOT / "bench"))
    from common import cpu_name  # bench/common.py: the CPU's name a record prints

    return {"host": platform.node(), "cpu": cpu_name(), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def per_sample_scores(result: dict, task: str) -> list[float]:
    """lm-eval's per-document scores (log_samples), in document order."""
    samples = result.get("samples", {}).get(task, [])
    out = []
    for s in sorted(samples, key=lambda s: s["doc_id"]):
        value = None
        for key, v in s.items():
            if key.isdigit() and isinstance(v, (int, float)) and v >= 0:
                value = float(v)
        out.append(value)
    return out


def run_step(model_path, spec, task, length, limit, dtype, device) -> dict:
    from rope_extend.eval.lm_tasks import run_lm_eval
    from rope_extend.eval.variants import apply_spec, load_model

    model, tok = load_model(model_path, dtype=dtype, device=device)
    report = apply_spec(model, spec)
    result = run_lm_eval(model, tok, [task], lengths=[length], limit=limit, log_samples=True,
                         metadata={"tokenizer": str(model_path)})
    scores = per_sample_scores(result, task)
    return {"task": task, "length": length, "limit": limit, "spec": spec, "dtype": dtype, "device": device,
            "patch_report": str(report) if report is not None else None,
            "results": result["results"][task], "scores": scores,
            "outputs": [s.get("resps") for s in sorted(result.get("samples", {}).get(task, []),
                                                       key=lambda s: s["doc_id"])]}


def run_step_vllm(model_path, spec, task, length, limit, work: Path) -> dict:
    """The same step through lm-eval's vLLM backend (see the module docstring)."""
    from rope_extend import compat
    from rope_extend.engines.runs import linked_folder
    from rope_extend.engines.vllm.run import VLLM_RUN as VLLM
    from rope_extend.eval.lm_tasks import run_lm_eval_vllm
    from rope_extend.source import load_source, plan_source
    from rope_extend.spec import load_spec

    source = load_source(model_path, config_only=True)
    raw = source.raw
    plan = None if spec is None else plan_source(source, load_spec(spec))  # the one plan of this step
    max_model_len = length + ANSWER_BUDGET
    served = VLLM.eval_serving(plan, raw, max_model_len, [max_model_len - 1])
    why = served.verdicts[max_model_len - 1]
    if why:
        raise SystemExit(f"vLLM does not serve {spec or 'the unpatched model'} as rope-extend computes it at "
                         f"{max_model_len - 1} tokens ({why}); run this variant with the transformers engine")
    folder = Path(model_path)
    if plan is not None:
        out = compat.portable_config_dict(raw, plan.slots, plan.max_position_embeddings, plan.marker)
        import hashlib

        folder = work / f"checkpoint-{hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]}"
        if not folder.exists():
            linked_folder(Path(model_path), out, folder)
    os.environ.update(served.settings.env)
    result = run_lm_eval_vllm(folder, [task], lengths=[length], max_model_len=max_model_len, limit=limit,
                              log_samples=True)
    import lm_eval
    import vllm

    samples = sorted(result.get("samples", {}).get(task, []), key=lambda s: s["doc_id"])
    return {"task": task, "length": length, "limit": limit, "spec": spec, "dtype": "float32",
            "engine": f"lm-eval {getattr(lm_eval, '__version__', '')} vllm backend, vLLM {vllm.__version__} (CPU)",
            "checkpoint": str(folder), "max_model_len": max_model_len, "results": result["results"][task],
            "scores": per_sample_scores(result, task), "outputs": [s.get("resps") for s in samples]}


# Room for RULER's answer (lm-eval's niah tasks generate up to 128 tokens) and lm-eval's re-tokenisation slack.
ANSWER_BUDGET = 128 + 64


def compare(hf_dir: Path, vllm_dir: Path) -> str:
    """Every (variant, task) both folders hold: answers equal and scores equal, prompt by prompt."""
    lines = ["| variant | task | prompts | same answer | same score | transformers mean | vLLM mean |",
             "|---|---|---|---|---|---|---|"]
    for path in sorted(vllm_dir.glob("*/*.json")):
        other = hf_dir / path.parent.name / path.name
        if not other.is_file():
            continue
        a, b = json.loads(other.read_text()), json.loads(path.read_text())
        same = sum(x == y for x, y in zip(a["outputs"], b["outputs"]))
        scores = sum(x == y for x, y in zip(a["scores"], b["scores"]))
        mean = [sum(x or 0 for x in r["scores"]) / max(1, len(r["scores"])) for r in (a, b)]
        lines.append(f"| {path.parent.name} | {b['task']} | {len(b['outputs'])} | {same} | {scores} | "
                     f"{mean[0]:.2f} | {mean[1]:.2f} |")
    text = "\n".join(lines) + "\n"
    (vllm_dir / "compare.md").write_text(f"Against `{hf_dir}`:\n\n" + text)
    return text


def summarize(out: Path) -> str:
    from rope_extend.eval.stats import newcombe_paired_interval, wilson_interval

    rows = []
    base = {}
    records = {}
    for path in sorted(out.glob("*/*.json")):
        rec = json.loads(path.read_text())
        records[(path.parent.name, rec["task"])] = rec
        if path.parent.name == "unpatched":
            base[rec["task"]] = rec["scores"]
    lines = ["| variant | task | length | all needles found [95 % Wilson] k/n | paired difference vs unpatched "
             "[95 % Newcombe]: gained / lost |", "|---|---|---|---|---|"]
    for (variant, task), rec in sorted(records.items(), key=lambda kv: (kv[0][1], kv[0][0] != "unpatched", kv[0][0])):
        s = [x for x in rec["scores"] if x is not None]
        k = sum(1 for x in s if x >= 1.0)
        lo, hi = wilson_interval(k, len(s))
        paired = ""
        if variant != "unpatched" and task in base:
            b = base[task]
            mine, ref = [x is not None and x >= 1.0 for x in rec["scores"]], [y is not None and y >= 1.0 for y in b]
            est, dlo, dhi = newcombe_paired_interval(mine, ref)
            gained = sum(1 for x, y in zip(mine, ref) if x and not y)
            lost = sum(1 for x, y in zip(mine, ref) if y and not x)
            paired = f"{est:+.2f} [{dlo:+.2f}, {dhi:+.2f}]: +{gained} / -{lost}"
        mean = sum(s) / len(s) if s else float("nan")
        rows.append(f"| {variant} | {task} | {rec['length']} | {k / max(1, len(s)):.2f} [{lo:.2f}, {hi:.2f}] "
                    f"{k}/{len(s)} (mean score {mean:.2f}) | {paired} |")
    text = "\n".join(lines + rows) + "\n"
    (out / "summary.md").write_text(text)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tasks", nargs="+", default=["niah_single_1", "niah_multikey_2"])
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--spec", action="append", default=[], help="inline spec (method=string,...) or a YAML path")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--engine", choices=["transformers", "vllm"], default="transformers")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("HF_OUT", "VLLM_OUT"),
                    help="compare two finished runs' answers prompt by prompt, and stop")
    args = ap.parse_args(argv)
    if args.compare:
        print(compare(*args.compare))
        return 0

    from rope_extend.eval.variants import make_variants
    from rope_extend.spec import parse_inline_spec

    model_path = args.model
    if model_path == "smollm2":
        from rope_extend.demo_model import smollm2_path

        model_path = smollm2_path()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    variants = make_variants([parse_inline_spec(s) for s in args.spec], include_baseline=not args.no_baseline)
    command = "PYTHONPATH=$PWD python " + shlex.join(["tools/run_ruler_lm_eval.py", *(argv or sys.argv[1:])])
    for task in args.tasks:  # one task for every variant first: a cut-off run still leaves paired cells
        for variant in variants:
            dest = out / variant.name / f"{task}.json"
            if dest.exists():
                print(f"{variant.name} {task}: done earlier ({dest})", flush=True)
                continue
            print(f"{variant.name} {task}: {args.limit} prompts of {args.length} tokens ...", flush=True)
            started = datetime.now(timezone.utc).isoformat(timespec="seconds")
            t0 = time.perf_counter()
            if args.engine == "vllm":
                from rope_extend.demo_model import cache_root

                rec = run_step_vllm(model_path, variant.spec_dict(), task, args.length, args.limit,
                                    cache_root() / "ruler-vllm-work")
            else:
                rec = run_step(model_path, variant.spec_dict(), task, args.length, args.limit, args.dtype,
                               args.device)
            rec["seconds"] = round(time.perf_counter() - t0, 1)
            rec["variant"] = variant.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_suffix(".tmp")
            tmp.write_text(json.dumps(rec, indent=1, default=str))
            tmp.replace(dest)
            with open(out / "steps.jsonl", "a") as fh:
                fh.write(json.dumps({"command": command, "variant": variant.name, "task": task,
                                     "started": started, "seconds": rec["seconds"], "machine": machine()}) + "\n")
            print(f"{variant.name} {task}: {rec['results']} in {rec['seconds']} s", flush=True)
    print(summarize(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
