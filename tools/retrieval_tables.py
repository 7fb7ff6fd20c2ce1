"""Markdown tables for docs/results-retrieval.md from eval folders: the inside-window ceiling, the beyond-window
cells read against it, and paired differences. Usage: python tools/retrieval_tables.py DIR [DIR ...] [--vs NAME]

Records of several folders are pooled (a case is identified by variant, spec fingerprint and case id, so the same
prompt run in two folders counts once). Records of the old probe (no haystack) are labelled "filler, old probe";
``--exclude-depth 1.0`` drops one depth (e.g. to read old-probe cells without their depth-100 % format artifact)."""

import argparse

from rope_extend.eval.report import (
    beyond_window_table,
    ceiling_table,
    differences,
    differences_table,
    probe_table,
)
from rope_extend.eval.runner import read_results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--vs", action="append", default=[], help="reference variant for paired differences")
    ap.add_argument("--exclude-depth", type=float, action="append", default=[], help="leave out this depth")
    args = ap.parse_args()
    seen, records = set(), []
    for d in args.dirs:
        for r in read_results(d):
            key = (r["variant"], r.get("fingerprint"), r["case_id"])
            if key not in seen and r.get("depth") not in args.exclude_depth:
                seen.add(key)
                records.append(r)
    print("## Ceiling (unpatched, inside the window)\n\n" + ceiling_table(records) + "\n")
    print("## All cells\n\n" + probe_table(records) + "\n")
    t = beyond_window_table(records)
    if t:
        print("## Beyond the window, against the ceiling\n\n" + t + "\n")
    for ref in args.vs or ["unpatched"]:
        diffs = [d for d in differences(records, reference=ref) if "passkey" in d.what]
        if diffs:
            print(f"## Paired differences vs {ref}\n\n" + differences_table(diffs) + "\n")


if __name__ == "__main__":
    main()
