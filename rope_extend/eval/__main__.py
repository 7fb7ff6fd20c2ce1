"""``python -m rope_extend.eval MODEL --spec SPEC ... --suite quick --out DIR``.

A thin argparse front end to :func:`rope_extend.eval.runner.run_eval` (the ``rope-extend``
CLI exposes the same options).  ``--spec`` takes a spec YAML path or an inline spec
``method=yarn,factor=2``; repeat it for several variants.  ``MODEL`` may be ``smollm2``
for the bundled demo model.
"""

from __future__ import annotations

import argparse
import sys

import yaml


def parse_spec(text: str):
    if "=" in text and not text.endswith((".yaml", ".yml", ".json")):
        out = {}
        for item in text.split(","):
            k, _, v = item.partition("=")
            out[k.strip().replace("-", "_")] = yaml.safe_load(v.strip())
        return out
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rope_extend.eval", description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="checkpoint directory / hub id of the unpatched model, or 'smollm2'")
    ap.add_argument("--spec", action="append", default=[], help="spec YAML path or inline 'method=yarn,factor=2'")
    ap.add_argument("--suite", default="quick", help="bundled suite name (quick, full, smoke) or YAML path")
    ap.add_argument("--out", default="eval-out", help="output directory (results.jsonl, report.md, *.png)")
    ap.add_argument("--text", default=None, help="perplexity text file (default: stdlib docs prose)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device-map", default=None, help="e.g. 'auto' (needs accelerate)")
    ap.add_argument("--device", default=None, help="e.g. 'cuda' (ignored with --device-map)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unpatched model")
    ap.add_argument("--no-resume", action="store_true", help="start a fresh results.jsonl")
    ap.add_argument("--no-plots", action="store_true")
    a = ap.parse_args(argv)

    from .runner import run_eval, summary_markdown

    model = a.model
    if model == "smollm2":
        from rope_extend.demo_model import smollm2_path

        model = smollm2_path()
    records = run_eval(
        model, [parse_spec(s) for s in a.spec], a.suite, a.out,
        dtype=a.dtype, device_map=a.device_map, device=a.device, text=a.text,
        include_baseline=not a.no_baseline, resume=not a.no_resume, plots=not a.no_plots,
    )
    print(summary_markdown(records))
    print(f"report: {a.out}/report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
