"""The README's result tables, computed from the eval records committed under eval/reports (pooled as
tools/retrieval_tables.py pools them), so every number in them is one the code derives from the records today:

    python tools/readme_results.py              # print the tables
    python tools/readme_results.py README.md    # rewrite them between the README's RESULTS markers, and
                                                # rope_extend/measured.json (what `inspect --recommend` quotes)

tests/test_readme.py fails while README.md holds other tables than these. The runs behind each folder are the steps
of tools/run_retrieval_evidence.sh; their commands and the full tables are in docs/results-retrieval.md."""

from __future__ import annotations

import sys
import textwrap
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from retrieval_tables import pooled_records

from rope_extend.eval.report import _table, ceilings, haystack_of, task_label
from rope_extend.eval.stats import newcombe_paired_interval, wilson_interval
from rope_extend.eval.variants import BASELINE

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "eval" / "reports"
CEILING = ["smollm2-ceiling", "smollm2-ceiling-prose"]
PASSKEY = ["smollm2-passkey-2x", "smollm2-passkey-2x-attn", "smollm2-passkey-2x-dyn", "smollm2-passkey-2x-20",
           "smollm2-passkey-2x-20-dyn", "smollm2-passkey-2x-paper", "smollm2-passkey-2x-dynyarn",
           "smollm2-passkey-4x", "smollm2-passkey-4x-dc", "smollm2-passkey-4x-dyn", "smollm2-passkey-4x-yarn",
           "smollm2-passkey-4x-logn", "smollm2-passkey-4x-dc-logn"]
# perplexity folders in groups, each pooled with the unpatched run of its first folder (same blocks, same kernels)
PERPLEXITY = [["smollm2-paper", "smollm2-ppl-attn", "smollm2-ppl-2x-freq"], ["smollm2-ppl-4x", "smollm2-ppl-4x-attn"]]
NEEDLES = ["smollm2-needles-2x", "smollm2-needles-ceiling"]
# STRING inside the window (bf16 on the CPU): the same prompts for the unpatched model and each STRING variant
# and the authors' evaluation recipe (S = int(0.33 N) per test length N, their factor 0.1 ln 2 + 1) on those prompts
STRING = ["smollm2-string-filler-cpu-bfloat16", "smollm2-string-prose-cpu-bfloat16", "smollm2-string-authors-cpu-bfloat16"]
STRING_VARIANTS = [("string", "`string` (S 2703, W 128)"), ("string-2", "`string` W 512"),
                   ("string-authors", "the authors' recipe (S = 0.33·N, factor 1.0693)")]
TEXTS = ("pydoc_topics", "debian_licenses")  # docs / licences, the order of every perplexity cell
REFERENCE = "dynamic"  # paired differences against the best frequency method at 2L and 4L (by its passkey)

# label, the variant at 2L (x2), 4L (x4) and 8L (x8); None where that run was not made
ROWS = [
    ("unpatched", BASELINE, BASELINE, None),
    ("`linear` (PI)", "linear-x2", None, None),
    ("`ntk`", "ntk-x2", None, None),
    ("`yarn`", "yarn-x2", "yarn-x4", "yarn-x8"),
    ("`dynamic-yarn`", "dynamic-yarn-x2", None, None),
    ("`llama3`", "llama3-x2", None, None),
    ("`dynamic` (NTK)", "dynamic-x2", "dynamic-x4", "dynamic-x8"),
    ("`self-extend`", "self-extend-x2", "self-extend-x4", None),
    ("`self-extend` + `log_n`", None, "self-extend-x4-logn", None),
    # dual-chunk's records ran the defaults before issue 51 (local_window L/16, no length scale): labelled so
    ("`dual-chunk`" + (DC_EARLIER := " (L/16, no scale)"), "dual-chunk-x2", "dual-chunk-x4", None),
    ("`dual-chunk` + `log_n`" + DC_EARLIER, None, "dual-chunk-x4-logn", None),
]
# What a row ran when it is not the method's defaults today, by the label's qualifier: measured.json carries it as
# the entry's "ran", which `inspect --recommend` prints beside the numbers.
RAN = {DC_EARLIER: "its defaults before ChunkLlama 847ae71: L/16, no scale"}
# Records measured on a GPU (folder suffix -DEVICE-DTYPE, as tools/run_retrieval_evidence.sh names them with DEVICE
# and DTYPE set): the 8L column comes from GPU_8L alone, and the note under the table counts, over every GPU folder,
# the prompts that the CPU float32 folders ran too and how many of them scored the same on both devices.
GPU_DEVICE = "one NVIDIA H200, bf16, SDPA"
GPU_8L = ["smollm2-passkey-8x-freq-cuda-bfloat16"]
GPU = ["smollm2-passkey-2x-se-cuda-bfloat16", "smollm2-passkey-4x-freq-cuda-bfloat16", *GPU_8L]


def _records(folders: list[str], reports: Path) -> list[dict]:
    return pooled_records([reports / f for f in folders], skip_old_probe=True)


def _count(scores: list[float]) -> str:
    lo, hi = wilson_interval(sum(scores), len(scores))
    return f"{sum(scores):g}/{len(scores)} [{lo:.0%}, {hi:.0%}]".replace("%", " %")


def ceiling_table(reports: Path = REPORTS) -> str:
    """The unpatched model inside its window: k/n per depth at 0.25L-L on both haystacks, with each length's
    accuracy over all depths [95 % Wilson]."""
    recs = [r for r in _records(CEILING, reports) if r["kind"] == "passkey" and r["variant"] == BASELINE]
    cols = sorted({(haystack_of(r), r["length"]) for r in recs}, key=lambda c: (c[0] != "filler", c[1]))
    by = defaultdict(list)
    for r in recs:
        by[(haystack_of(r), r["length"], r["depth"])].append(float(r["metrics"]["score"]))
    rows = []
    for d in sorted({r["depth"] for r in recs}):
        rows.append([f"{d:.0%}"] + [f"{sum(by[(h, L, d)]):g}/{len(by[(h, L, d)])}" for h, L in cols])
    rows.append(["all [95 %]"] + [_count([x for (hh, LL, _), v in by.items() if (hh, LL) == c for x in v])
                                  for c in cols])
    names = {"filler": "filler", "pydoc_topics": "prose"}
    return _table(["depth"] + [f"{names.get(h, h)} {L // 1024}k" for h, L in cols], rows)


def _passkey_cell(recs: list[dict], flagged: list) -> tuple[str, float]:
    scores = [float(r["metrics"]["score"]) for r in recs]
    cell = _count(scores)
    valid = [float(r["metrics"]["score"]) for r in recs if r["depth"] not in flagged]
    if flagged and valid:
        cell += f" · {sum(valid):g}/{len(valid)}"
    return cell, sum(scores) / len(scores)


def _paired_cell(recs: list[dict], ref: list[dict]) -> str:
    mine = {r["case_id"]: float(r["metrics"]["score"]) for r in recs}
    theirs = {r["case_id"]: float(r["metrics"]["score"]) for r in ref}
    shared = sorted(set(mine) & set(theirs))
    if not shared:
        return "–"
    est, lo, hi = newcombe_paired_interval([mine[c] for c in shared], [theirs[c] for c in shared])
    mark = "**" if lo > 0 or hi < 0 else ""
    return f"{mark}{est:+.2f} [{lo:+.2f}, {hi:+.2f}]{mark}, {len(shared)}"


def _ppl(by: dict, variant: str | None, length: int) -> tuple[str, list[float]]:
    values = [by.get((variant, t, length)) for t in TEXTS]
    if variant is None or None in values:
        return "–", []
    return " / ".join(f"{v:.2f}" for v in values), values


def _perplexities(reports: Path) -> tuple[dict, dict]:
    """``{(variant, text, length): ppl}`` over every group, and the same for each variant's own group's unpatched
    run (``{(variant, text, length): unpatched ppl}``), so an inside-window change compares runs of one kind."""
    ppl, base = {}, {}
    for group in PERPLEXITY:
        recs = [r for r in _records(group, reports) if r["kind"] == "perplexity"]
        unpatched = {(r["metrics"].get("text"), r["length"]): r["metrics"]["ppl"] for r in recs
                     if r["variant"] == BASELINE}
        for r in recs:
            key = (r["variant"], r["metrics"].get("text"), r["length"])
            ppl.setdefault(key, r["metrics"]["ppl"])
            if key[1:] in unpatched:
                base.setdefault(key, unpatched[key[1:]])
    return ppl, base


def _inside_cost(ppl: dict, base: dict, variant: str, orig: int) -> str:
    """The perplexity change against the unpatched model at every length inside the window, both texts; a
    method that leaves the model unchanged there (dynamic scaling) differs from another run's unpatched numbers
    only by float noise (1e-7 relative), which is reported as the original model."""
    changes = [ppl[k] / base[k] - 1 for k in ppl if k[0] == variant and k[2] <= orig and k in base]
    if not changes:
        return "–"
    lo, hi = min(changes), max(changes)
    if max(abs(lo), abs(hi)) < 1e-5:  # float noise between runs (reduction order), not a change of model
        return "0 (the original model)"
    return f"{lo:+.1%} to {hi:+.1%}".replace("%", " %").replace("-0.0 %", "0.0 %").replace("+0.0 %", "0.0 %")


def methods_table(reports: Path = REPORTS) -> str:
    """One row per method: passkey at 2L and 4L (classic filler) with the accuracy on the depths the ceiling does
    not flag and the paired difference against dynamic NTK, passkey at 8L from the GPU records, perplexity at 2L
    and 4L on both texts, and the perplexity change inside the window; under it, the device note."""
    recs = _records(PASSKEY + CEILING, reports)
    orig = next(r["original_length"] for r in recs if r.get("original_length"))
    flagged = ceilings(recs).get("passkey/filler", {}).get("flagged", [])
    cells = defaultdict(list)
    for r in recs:
        if task_label(r) == "passkey/filler" and r["length"] > orig:
            cells[(r["variant"], r["length"])].append(r)
    gpu = defaultdict(list)  # kept apart from the CPU cells: (variant, length) -> records
    for r in _records(GPU_8L, reports):
        if task_label(r) == "passkey/filler" and r["length"] == 8 * orig:
            gpu[(r["variant"], r["length"])].append(r)
    ppl, base = _perplexities(reports)
    best: dict[int, float] = defaultdict(lambda: -1.0)
    low: dict[int, float] = defaultdict(lambda: float("inf"))
    rows = []
    for label, v2, v4, v8 in ROWS:
        row = [label]
        for factor, v in ((2, v2), (4, v4)):
            got = cells.get((v, factor * orig))
            if not got:
                row += ["–", "–"]
                continue
            cell, acc = _passkey_cell(got, flagged)
            best[factor] = max(best[factor], acc)
            ref = cells.get((f"{REFERENCE}-x{factor}", factor * orig), [])
            row += [cell, "·" if v == f"{REFERENCE}-x{factor}" else _paired_cell(got, ref)]
        got = gpu.get((v8, 8 * orig))
        if got:
            cell, acc = _passkey_cell(got, flagged)
            best[8] = max(best[8], acc)
        row.append(cell if got else "–")
        for factor, v in ((2, v2), (4, v4)):
            text, values = _ppl(ppl, v, factor * orig)
            row.append(text)
            if values and v != BASELINE:
                low[factor] = min(low[factor], sum(values))
        inside = [f"x{f}: {_inside_cost(ppl, base, v, orig)}" for f, v in ((2, v2), (4, v4)) if v and v != BASELINE]
        row.append("; ".join(inside) if inside else "0")
        rows.append(row)
    for row, (_, v2, v4, v8) in zip(rows, ROWS):  # bold the best passkey rate and the lowest perplexity per column
        for col, got in ((1, cells.get((v2, 2 * orig))), (3, cells.get((v4, 4 * orig))), (5, gpu.get((v8, 8 * orig)))):
            factor = {1: 2, 3: 4, 5: 8}[col]
            if got and sum(float(r["metrics"]["score"]) for r in got) / len(got) == best[factor]:
                row[col] = f"**{row[col]}**"
        for col, factor, v in ((6, 2, v2), (7, 4, v4)):
            values = _ppl(ppl, v, factor * orig)[1]
            if values and v != BASELINE and sum(values) == low[factor]:
                row[col] = f"**{row[col]}**"
    header = ["method", f"passkey at 2L ({2 * orig // 1024}k) [95 %] · valid depths",
              f"vs `{REFERENCE}` x2, paired [95 %], pairs", f"passkey at 4L ({4 * orig // 1024}k)",
              f"vs `{REFERENCE}` x4", f"passkey at 8L ({8 * orig // 1024}k), GPU bf16",
              "perplexity at 2L, docs / licences", "perplexity at 4L",
              "inside the window (2k, 8k): perplexity vs unpatched"]
    return _table(header, rows) + "\n\n" + gpu_note(reports)


def gpu_agreement(reports: Path = REPORTS) -> tuple[int, int, list[int]]:
    """``(same, shared, lengths)``: of the prompts in the GPU folders that a CPU float32 folder also ran (same variant, spec
    fingerprint and case id), how many scored the same on both devices, and at which prompt lengths."""
    cpu_folders = sorted(p.name for p in reports.glob("smollm2-*") if (p / "results.jsonl").exists() and p.name not in GPU)
    cpu = {(r["variant"], r.get("fingerprint"), r["case_id"]): r["metrics"]["score"]
           for r in _records(cpu_folders, reports) if "score" in r["metrics"]}
    shared = [(cpu[k], r["metrics"]["score"], r["length"]) for r in _records(GPU, reports)
              if (k := (r["variant"], r.get("fingerprint"), r["case_id"])) in cpu]
    return sum(a == b for a, b, _ in shared), len(shared), sorted({L for _, _, L in shared})


def gpu_note(reports: Path = REPORTS) -> str:
    same, shared, lengths = gpu_agreement(reports)
    at = ", ".join(f"{L // 1024}k" for L in lengths)
    return textwrap.fill(f"GPU bf16: {GPU_DEVICE}, this project's `rope-extend eval` (`eval/reports/*-cuda-bfloat16`); "
                         f"every other cell: CPU fp32. The prompts run on both devices ({at}) score the same on {same} "
                         f"of {shared}.", width=116, break_on_hyphens=False, break_long_words=False)


def needles_table(reports: Path = REPORTS) -> str:
    """RULER-style needles at 2L against the model's own ceiling (the unpatched model at L, same format)."""
    recs = [r for r in _records(NEEDLES, reports) if r["kind"] != "passkey"]
    orig = next(r["original_length"] for r in recs if r.get("original_length"))
    variants = list(dict.fromkeys(r["variant"] for r in recs if r["length"] > orig))
    rows = []
    for task in dict.fromkeys(r["kind"] for r in recs):
        inside = [float(r["metrics"]["score"]) for r in recs
                  if r["kind"] == task and r["variant"] == BASELINE and r["length"] == orig]
        row = [f"`{task}`", _count(inside)]
        for v in variants:
            row.append(_count([float(r["metrics"]["score"]) for r in recs
                               if r["kind"] == task and r["variant"] == v and r["length"] == 2 * orig]))
        rows.append(row)
    return _table(["task (classic filler)", f"ceiling: unpatched at {orig // 1024}k"]
                  + [f"{v} at {2 * orig // 1024}k" for v in variants], rows)


def string_table(reports: Path = REPORTS) -> str:
    """STRING inside the window: passkey k/n [95 % Wilson] per haystack and length, unpatched and each STRING
    variant, with each variant's paired difference to the unpatched model on the same prompts [95 % Newcombe]."""
    recs = [r for r in _records(STRING, reports) if r["kind"] == "passkey"]
    lengths = sorted({r["length"] for r in recs if r["variant"] != BASELINE})  # the suites' (older 2k rows aside)
    by = defaultdict(list)
    for r in recs:
        by[(r["variant"], haystack_of(r), r["length"])].append(r)
    names = {"filler": "filler", "pydoc_topics": "prose"}
    rows = []
    for h in sorted({haystack_of(r) for r in recs}, key=lambda h: h != "filler"):
        for L in lengths:
            base = by[(BASELINE, h, L)]
            row = [f"{names.get(h, h)} {L // 1024}k", _count([float(r["metrics"]["score"]) for r in base])]
            for variant, _ in STRING_VARIANTS:
                mine = by[(variant, h, L)]  # (a cell not run: "–")
                row += [_count([float(r["metrics"]["score"]) for r in mine]) if mine else "–", _paired_cell(mine, base)]
            rows.append(row)
    head = ["passkey", "unpatched"]
    for _, label in STRING_VARIANTS:
        head += [label, "vs unpatched, paired [95 %], pairs"]
    return _table(head, rows)


MEASURED = ROOT / "rope_extend" / "measured.json"


def _method_of(label: str) -> str:
    """A ROWS label as `rope-extend` names the method: "`dynamic` (NTK)" -> "dynamic", "`self-extend` + `log_n`" ->
    "self-extend + log_n"."""
    return label.replace("`", "").split(" (")[0]


def measured(reports: Path = REPORTS) -> dict:
    """What the methods table holds, per ratio and method, as data: passkey k/n on the classic filler (CPU fp32 at
    2L and 4L, GPU bf16 at 8L) and perplexity beyond the window (docs, licences) at 2L and 4L. `rope-extend inspect
    --recommend` quotes it (rope_extend.measured); tests/test_readme.py fails while rope_extend/measured.json differs."""
    recs = _records(PASSKEY + CEILING, reports)
    orig = next(r["original_length"] for r in recs if r.get("original_length"))
    passkey = defaultdict(list)
    for r in recs:
        if task_label(r) == "passkey/filler" and r["length"] > orig:
            passkey[(r["variant"], r["length"], "CPU fp32")].append(float(r["metrics"]["score"]))
    for r in _records(GPU_8L, reports):
        if task_label(r) == "passkey/filler" and r["length"] == 8 * orig:
            passkey[(r["variant"], r["length"], f"GPU: {GPU_DEVICE}")].append(float(r["metrics"]["score"]))
    ppl, _ = _perplexities(reports)
    ratios: dict[str, dict] = {}
    for label, *variants in ROWS:
        if label == "unpatched":
            continue
        for factor, variant in zip((2, 4, 8), variants):
            if variant is None:
                continue
            entry = {}
            for (v, length, device), scores in passkey.items():
                if v == variant and length == factor * orig:
                    entry["passkey"] = {"found": int(sum(scores)), "prompts": len(scores), "device": device}
            values = _ppl(ppl, variant, factor * orig)[1]
            if values:
                entry["perplexity"] = dict(zip(TEXTS, values))
            if entry:
                for qualifier, ran in RAN.items():
                    if label.endswith(qualifier):
                        entry["ran"] = ran
                ratio = ratios.setdefault(str(factor), {"length": factor * orig, "methods": {}})
                ratio["methods"][_method_of(label)] = entry
    return {"model": "SmolLM2-135M", "original_length": orig, "made_by": "tools/readme_results.py from eval/reports",
            "texts": list(TEXTS), "ratios": ratios}


def measured_json(reports: Path = REPORTS) -> str:
    import json

    return json.dumps(measured(reports), indent=1, sort_keys=True) + "\n"


TABLES = {"ceiling": ceiling_table, "methods": methods_table, "needles": needles_table, "string": string_table}


def markers(name: str) -> tuple[str, str]:
    return f"<!-- RESULTS:{name}:BEGIN (tools/readme_results.py) -->", f"<!-- RESULTS:{name}:END -->"


def rewrite(text: str, tables: dict[str, str]) -> str:
    for name, table in tables.items():
        start, end = markers(name)
        if start not in text or end not in text:
            raise ValueError(f"README has no {start} ... {end} pair: add the markers where table {name!r} goes")
        head, rest = text.split(start, 1)
        text = head + start + "\n" + table + "\n" + end + rest.split(end, 1)[1]
    return text


def main() -> None:
    tables = {name: make() for name, make in TABLES.items()}
    if len(sys.argv) > 1:
        path = Path(sys.argv[1])
        path.write_text(rewrite(path.read_text(), tables))
        MEASURED.write_text(measured_json())
    else:
        print("\n\n".join(f"{name}:\n\n{t}" for name, t in tables.items()))


if __name__ == "__main__":
    main()
