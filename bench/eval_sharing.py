"""Suite wall time before/after sharing work between cases, and proof that no number changed.

"Before" evaluates every case on its own (``share=False``: one forward per perplexity length, one full prefill
per probe prompt), which is what rope-extend did before; "after" is the default (``share=True``): static
variants get one forward per text for all perplexity lengths, and probe prompts of one length prefill their
common start once. Both runs write their own results.jsonl; the script compares every number.

    python bench/eval_sharing.py                       # the paper suite's shape at 1/16 of its lengths, 5 variants
    python bench/eval_sharing.py --scale 1             # the paper suite itself (hours on 2 CPU cores)
    python bench/eval_sharing.py --variants 2          # unpatched + PI only
    python bench/eval_sharing.py --plan-only --scale 1 # no model run: modelled compute of the paper suite itself

``--plan-only`` plans both ways with the real tokenizer and prompts and counts the work each job does: prefilled
tokens, and FLOPs modelled per token at position p as 2 * (non-embedding params + lm_head) + 4 * p * d * layers
(QK^T and AV); the decode steps (same in both) are left out. Seconds to run, so it covers the full suite.

Goal: after <= 0.6x before, identical numbers (losses within 1e-4, every probe answer the same).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, demo_model

sys.path.insert(0, str(ROOT))

SPECS = [{"method": m, "factor": 2} for m in ("linear", "ntk", "yarn", "dynamic-yarn")]


def paper_shaped(scale: float) -> dict:
    """The paper suite with every length multiplied by *scale* (same texts, depths and sample counts)."""
    from rope_extend.eval.suite import load_suite

    suite = load_suite("paper").to_dict()

    def scaled(lengths):
        return [f"{float(x[:-1]) * scale:g}x" if isinstance(x, str) else max(64, round(x * scale)) for x in lengths]

    suite["name"] = f"paper-x{scale:g}"
    suite["short_context"] = scaled(suite["short_context"])
    for section in ("perplexity", "passkey"):
        suite[section]["lengths"] = scaled(suite[section]["lengths"])
    return suite


def modelled_work(model_path, suite: dict, n_variants: int) -> dict:
    """Prefilled tokens and modelled FLOPs of the suite's jobs, without and with sharing."""
    from transformers import AutoConfig, AutoTokenizer

    from rope_extend.eval.jobs import Evaluator, plan_jobs
    from rope_extend.eval.probes import prefix_plan
    from rope_extend.eval.suite import Suite
    from rope_extend.eval.variants import make_variants
    from rope_extend.facts import read_rope

    cfg = AutoConfig.from_pretrained(str(model_path))
    d, layers = cfg.hidden_size, cfg.num_hidden_layers
    kv = cfg.num_key_value_heads * getattr(cfg, "head_dim", d // cfg.num_attention_heads)
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * cfg.intermediate_size
    linear = 2 * (layers * per_layer + d * cfg.vocab_size)
    attn = 4 * d * layers

    def cost(start: int, end: int) -> float:  # tokens at positions start..end-1
        return (end - start) * linear + attn * (end * end - start * start) / 2

    original = read_rope(cfg).original_length()
    cases = Suite.from_dict(suite).cases(original)
    variants = make_variants(SPECS[: n_variants - 1])
    ev = Evaluator(None, AutoTokenizer.from_pretrained(str(model_path)), original, 0)
    out = {}
    for name, share in (("before", False), ("after", True)):
        tokens = flops = 0.0
        for job in plan_jobs(cases, variants, set(), share=share):
            if job.cases[0].is_probe:
                samples = [ev.probe(c) for c in job.cases]
                for i, reused in prefix_plan(samples):
                    n = len(samples[i].input_ids)
                    tokens, flops = tokens + n - reused, flops + cost(reused, n)
            else:
                tokens, flops = tokens + job.length, flops + cost(0, job.length)
        out[name] = {"prefilled_tokens": int(tokens), "tflops": round(flops / 1e12, 2)}
    out["token_ratio"] = round(out["after"]["prefilled_tokens"] / out["before"]["prefilled_tokens"], 3)
    out["flop_ratio"] = round(out["after"]["tflops"] / out["before"]["tflops"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.0625, help="length multiplier for the paper suite")
    ap.add_argument("--variants", type=int, default=5, help="unpatched + the first N-1 of PI, NTK, YaRN, dynamic YaRN")
    ap.add_argument("--out", default=None, help="keep both runs' outputs here")
    ap.add_argument("--plan-only", action="store_true", help="modelled work only (no model run)")
    a = ap.parse_args()
    if a.plan_only:
        result = {"suite": paper_shaped(a.scale)["name"], "variants": a.variants,
                  **modelled_work(demo_model(), paper_shaped(a.scale), a.variants)}
        print(json.dumps(result, indent=2))
        return

    from rope_extend.eval.options import EvalOptions
    from rope_extend.eval.runner import run_eval

    model, suite = demo_model(), paper_shaped(a.scale)
    specs = SPECS[: a.variants - 1]
    out = Path(a.out or tempfile.mkdtemp(prefix="eval-sharing-"))
    walls, recs = {}, {}
    for name, share in (("before", False), ("after", True)):
        started = time.perf_counter()
        recs[name] = run_eval(model, specs, suite, out / name,
                              EvalOptions(progress=False, plots=False, share=share, resume=False))
        walls[name] = time.perf_counter() - started
        print(f"{name}: {walls[name]:.1f} s ({len(recs[name])} cases)", flush=True)

    before = {(r["variant"], r["case_id"]): r["metrics"] for r in recs["before"]}
    after = {(r["variant"], r["case_id"]): r["metrics"] for r in recs["after"]}
    assert before.keys() == after.keys()
    loss_diff = max((abs(before[k]["loss"] - after[k]["loss"]) for k in before if "loss" in before[k]), default=0.0)
    block_diff = max((max(abs(x - y) for x, y in zip(before[k]["block_losses"], after[k]["block_losses"]))
                      for k in before if "block_losses" in before[k]), default=0.0)
    probes = [k for k in before if "output" in before[k]]
    same = sum(before[k]["output"] == after[k]["output"] for k in probes)
    result = {
        "suite": suite["name"], "variants": a.variants, "cases": len(before),
        "before_s": round(walls["before"], 1), "after_s": round(walls["after"], 1),
        "ratio": round(walls["after"] / walls["before"], 3),
        "max_abs_loss_diff": loss_diff, "max_abs_block_loss_diff": block_diff,
        "probe_answers_identical": f"{same}/{len(probes)}",
    }
    print(json.dumps(result, indent=2))
    (out / "bench.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
