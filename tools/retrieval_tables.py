"""Markdown tables for docs/results-retrieval.md and docs/train.md from eval folders: the inside-window ceiling, the
beyond-window cells read against it, perplexity where the folders have it, and paired differences.
Usage: python tools/retrieval_tables.py DIR [DIR ...] [--vs NAME] [--variant NAME ...]

Records of several folders are pooled (a case is identified by variant, spec fingerprint and case id, so the same
prompt run in two folders counts once). Records of the old probe (no haystack) are labelled "filler, old probe";
``--exclude-depth 1.0`` drops one depth (e.g. to read old-probe cells without their depth-100 % format artifact)."""

import argparse
from collections import defaultdict

from rope_extend.eval.report import (
    OLD_PROBE,
    _acc_cell,
    _table,
    beyond_window_table,
    ceiling_table,
    differences,
    differences_table,
    haystack_of,
    perplexity_table,
    probe_table,
    task_label,
    variants_of,
)
from rope_extend.eval.runner import read_results
from rope_extend.eval.variants import BASELINE


def pooled_records(dirs, variants=(), skip_old_probe: bool = False, exclude_depths=()) -> list[dict]:
    """The records of every folder in *dirs*, each case once (by variant, spec fingerprint and case id); only
    *variants* (and the unpatched rows) when given, without old-probe records or *exclude_depths* when asked."""
    seen, records = set(), []
    for d in dirs:
        for r in read_results(d):
            key = (r["variant"], r.get("fingerprint"), r["case_id"])
            wanted = not variants or r["variant"] in variants or r["variant"] == BASELINE
            wanted = wanted and not (skip_old_probe and r["kind"] != "perplexity" and haystack_of(r) == OLD_PROBE)
            if key not in seen and wanted and r.get("depth") not in exclude_depths:
                seen.add(key)
                records.append(r)
    return records


def per_depth_table(records: list[dict], min_length: int = 0) -> str:
    """k/n per task/haystack, length and depth for every variant (lengths >= *min_length*), plus each cell's
    accuracy [95 % Wilson] over all its depths."""
    recs = [r for r in records if r["kind"] != "perplexity" and r["length"] >= min_length]
    variants = variants_of(recs)
    by = defaultdict(list)
    for r in recs:
        by[(task_label(r), r["length"], r["depth"], r["variant"])].append(float(r["metrics"]["score"]))
    rows = []
    for label in dict.fromkeys(task_label(r) for r in recs):
        for L in sorted({r["length"] for r in recs if task_label(r) == label}):
            depths = sorted({r["depth"] for r in recs if task_label(r) == label and r["length"] == L})
            for d in depths:
                cells = [by.get((label, L, d, v)) for v in variants]
                rows.append([label, str(L), f"{d:.0%}"] + [f"{sum(c):g}/{len(c)}" if c else "–" for c in cells])
            rows.append([label, str(L), "all"] + [_acc_cell(x for d in depths for x in by.get((label, L, d, v), []))
                                                  for v in variants])
    return _table(["task/haystack", "length", "depth"] + variants, rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--vs", action="append", default=[], help="reference variant for paired differences")
    ap.add_argument("--exclude-depth", type=float, action="append", default=[], help="leave out this depth")
    ap.add_argument("--per-depth-from", type=int, help="also print k/n per depth for lengths >= this")
    ap.add_argument("--skip-old-probe", action="store_true", help="leave out probe records of the old probe")
    ap.add_argument("--variant", action="append", default=[],
                    help="keep only these variants (repeatable; the unpatched rows are kept for the ceiling)")
    args = ap.parse_args()
    records = pooled_records(args.dirs, args.variant, args.skip_old_probe, args.exclude_depth)
    if args.per_depth_from is not None:
        print("## Per depth\n\n" + per_depth_table(records, args.per_depth_from) + "\n")
    t = perplexity_table(records)
    if t:
        print("## Perplexity [95 % block bootstrap]\n\n" + t + "\n")
    print("## Ceiling (unpatched, inside the window)\n\n" + ceiling_table(records) + "\n")
    print("## All cells\n\n" + probe_table(records) + "\n")
    t = beyond_window_table(records)
    if t:
        print("## Beyond the window, against the ceiling\n\n" + t + "\n")
    for ref in args.vs or [BASELINE]:
        diffs = differences(records, reference=ref)
        if diffs:
            print(f"## Paired differences vs {ref}\n\n" + differences_table(diffs) + "\n")


if __name__ == "__main__":
    main()
