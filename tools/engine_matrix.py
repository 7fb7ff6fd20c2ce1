"""docs/engine-matrix.md: every RoPE model type transformers ships x every registered serving engine.

Rows: the zoo (tests/tiny.py::zoo_types, every causal-LM model type of the running transformers whose modeling code
has a rotary embedding), each as its tiny config (tests/tiny.py::zoo_config) saved the way `save_pretrained` writes
config.json, with the `architectures` its causal-LM class writes. For each type:

- its own scheme: `rope-extend engines MODEL` on that config (the audit, `rope_extend.engines.audit`): every ported
  engine against transformers' own rotary embedding of the config;
- each method rope-extend writes for it at s = tiny.ZOO_FACTOR (the parity report's port rows,
  `rope_extend.engines.parity.parity_many`, as `rope-extend engines SOURCE --method M` computes them), or the plan's
  one-line refusal.

Columns: every registered engine (`rope_extend.engines.registry.serving_engines()`): transformers, the reference,
run as a library; every other engine through its port. A cell is one word (`VERDICTS`) and, where it is not
"identical", a numbered note with the reason. The measured cells are read from the evidence run's records
(`--run`, below) and shown beside the port's, dated.

    # the doc (the port cells computed now, the measured cells from eval/reports/engine-matrix/results.jsonl)
    python tools/engine_matrix.py docs/engine-matrix.md
    # the evidence: the tiny model of each type (with weights and a tokenizer) served in a real engine, per method
    nice -n 15 python tools/engine_matrix.py --run vllm --types llama mistral -o eval/reports/engine-matrix

The evidence run is resumable: one JSON line per (engine, model type, method) is appended to OUT/results.jsonl as
each type finishes (the command, the equivalent `rope-extend engines ... --run` command, each route's requests as the
report's run rows give them with the port's verdict of the same route, the seconds, the load average, the date); a
cell already recorded is skipped when the same command runs again.
tests/test_engine_matrix.py checks the doc's port cells of a deterministic sample of model types (`sample`) against
what this computes today, and its measured cells against the records.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the zoo: tests/tiny.py

import tiny  # noqa: E402

DOC = ROOT / "docs" / "engine-matrix.md"
RECORDS = ROOT / "eval" / "reports" / "engine-matrix"
RESULTS = "results.jsonl"
FACTOR = float(tiny.ZOO_FACTOR)
L = tiny.ZOO_ORIGINAL
# Per-method settings the tiny window needs: string's default local_value (128) must lie below the window L = 32.
TINY_WINDOW_SETTINGS = {"string": {"local_value": L // 4}}
# The measured models: the zoo config widened to what the engines serve (vLLM's CPU attention takes head sizes 32 and
# up: vllm/v1/attention/backends/cpu_attn.py get_supported_head_sizes), with the vocabulary of a tiny BPE tokenizer
# (`rope_extend.eval.toy_models.tiny_tokenizer`, which the reference needs to tokenise the evaluation text).
SERVED_WIDTH = {"hidden_size": 128, "head_dim": 32}
TOKENIZER_VOCAB = 300

IDENTICAL, UP_TO_L, LONG_ONLY, DIFFERS = "identical", "up to L", "at s·L only", "differs"
UNCHECKED, NOT_SERVED, REFUSED, FAILED = "unchecked", "not served", "refused", "failed"
VERDICTS = {
    IDENTICAL: "the engine serves it as transformers computes it (own scheme) or as rope-extend does (a method): "
               "max |Δcos|, |Δsin| within float32 tolerance for the short request (L tokens) and the long one "
               "(s·L tokens); measured: every prompt token's |Δ logprob| within the run tolerance, no NaN",
    UP_TO_L: "identical for the short request only: the long one differs or is not served (e.g. the command's "
             "context length is L)",
    LONG_ONLY: "identical for the long request only: the short one differs (a dynamic method applied statically)",
    DIFFERS: "served, and not identical on any request",
    UNCHECKED: "the engine's rules here do not cover this config (an unknown rope_type, a config feature its port "
               "does not model, an architecture it routes elsewhere): not known to serve it identically",
    NOT_SERVED: "no route of the engine serves it (an attention-level method; a request beyond the context)",
    REFUSED: "rope-extend's plan refuses the method for this model type (its one-line error), or (measured) the "
             "engine refused to load the model, in its own words",
    FAILED: "the audit could not compute this type, or (measured) the engine failed: its error",
}


@dataclass(frozen=True)
class Cell:
    """One engine's verdict on one (model type, scheme or method), with the reason where it is not identical."""

    verdict: str
    note: str | None = None


# --- the zoo's configs -------------------------------------------------------------------------------------------------
def zoo_types() -> list[str]:
    return tiny.zoo_types()


def sample(types: Sequence[str], count: int = 5) -> list[str]:
    """A deterministic sample of `count` model types, evenly spaced in sorted order (what the test checks)."""
    ordered = sorted(types)
    step = max(1, len(ordered) // count)
    return ordered[::step][:count]


def architectures(model_type: str) -> list[str]:
    """What `save_pretrained` of the type's causal-LM class writes as `architectures`."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    return [name] if name else []


def save_config(config, model_type: str, folder: Path) -> dict:
    """config.json as `save_pretrained` writes it, with the causal-LM class's `architectures`; returned as a dict."""
    folder.mkdir(parents=True, exist_ok=True)
    config.architectures = architectures(model_type)
    config.save_pretrained(folder)
    return json.loads((folder / "config.json").read_text())


def one_line(exc: BaseException | str, limit: int = 400) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, BaseException):
        text = f"{type(exc).__name__}: {text}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- the specs ---------------------------------------------------------------------------------------------------------
def methods(kind: str = "all"):
    """rope-extend's registered methods: "frequency" (written into config.json), "attention" (acting on attention),
    or "all"."""
    from rope_extend.methods import all_methods

    out = all_methods()
    if kind == "frequency":
        return [m for m in out if not m.acts_on_attention]
    if kind == "attention":
        return [m for m in out if m.acts_on_attention]
    return out


def specs(folder: Path, names: Iterable[str] | None = None) -> dict[str, dict | Cell]:
    """{method: the spec written for the type in `folder`, or the plan's refusal (`Cell(REFUSED, message)`)}: each
    method's `example_spec` at FACTOR (LongRoPE's factors sized to the type's rotary dimension), with the tiny window's
    settings (`TINY_WINDOW_SETTINGS`)."""
    from transformers import AutoConfig

    from rope_extend import compat
    from rope_extend.plan import plan_patch
    from rope_extend.spec import load_spec

    chosen = [m for m in methods() if names is None or m.name in set(names)]
    text = compat.text_config(AutoConfig.from_pretrained(folder))
    half = None
    for method in methods():  # the rotary dimension, from any method the plan takes (LongRoPE's lists need it)
        if method.name == "longrope":
            continue
        try:
            plan = plan_patch(text, load_spec(method.example_spec(FACTOR, 8)))
        except Exception:  # (refused: the next method)
            continue
        half = plan.rotary_dims[plan.targets[0]] // 2
        break
    out: dict[str, dict | Cell] = {}
    for method in chosen:
        spec = {**method.example_spec(FACTOR, half or 8), **TINY_WINDOW_SETTINGS.get(method.name, {})}
        try:
            plan_patch(text, load_spec(spec))
        except Exception as exc:  # (the plan's refusal is the cell)
            out[method.name] = Cell(REFUSED, one_line(str(exc)))
            continue
        out[method.name] = spec
    return out


def spec_flags(spec: dict) -> str:
    """The spec as `rope-extend engines` flags."""
    flags = [f"--method {spec['method']}"]
    if "factor" in spec:
        flags.append(f"--factor {spec['factor']:g}")
    for key, value in spec.items():
        if key not in ("method", "factor"):
            flags.append(f"--set {key}={json.dumps(value, separators=(',', ':'))}")
    return " ".join(flags)


# --- verdicts ----------------------------------------------------------------------------------------------------------
def row_cell(row) -> Cell:
    """A parity row's verdict (port, or the installed transformers' run): both requests identical, one of them, or
    why not."""
    from rope_extend.engines.served import Delta, NotServed

    if row.unchecked:
        return Cell(UNCHECKED, next(r.reason for r in (row.short, row.long) if isinstance(r, NotServed)))
    short, long = (isinstance(r, Delta) and r.identical for r in (row.short, row.long))
    if short and long:
        return Cell(IDENTICAL)
    why = "; ".join(row.warnings) or "; ".join(row.reasons())
    if short:
        return Cell(UP_TO_L, why)
    if long:
        return Cell(LONG_ONLY, why)
    if any(isinstance(r, Delta) for r in (row.short, row.long)):
        return Cell(DIFFERS, why)
    reason = next(r.reason for r in (row.short, row.long) if isinstance(r, NotServed))
    return Cell(NOT_SERVED, reason)


def audit_cell(verdict, short: int) -> Cell:
    """An audit verdict (`engines.audit.Verdict`) as a cell."""
    if verdict.identical:
        return Cell(IDENTICAL)
    if verdict.identical is None:
        return Cell(UNCHECKED, verdict.why)
    return Cell(UP_TO_L if verdict.up_to else DIFFERS, verdict.why)


def run_cell(route: dict) -> Cell:
    """A measured route (a record's `routes` entry: its short and long request as the report gives them) as a cell:
    the engine's refusal in its own words, or the Δ logprob verdict."""
    short, long = route["short"], route["long"]
    same = [r.get("served") and r.get("identical") for r in (short, long)]
    if all(same):
        return Cell(IDENTICAL)
    words = "; ".join(f"{label} request: {_run_words(r)}" for label, r in (("short", short), ("long", long))
                      if not (r.get("served") and r.get("identical")))
    if same[0]:
        return Cell(UP_TO_L, words)
    if same[1]:
        return Cell(LONG_ONLY, words)
    if any(r.get("served") for r in (short, long)):
        return Cell(DIFFERS, words)
    if any("refused to start" in r.get("reason", "") for r in (short, long)):
        return Cell(REFUSED, _run_words(short))
    return Cell(NOT_SERVED, words)


def _run_words(result: dict) -> str:
    if not result.get("served"):
        return one_line(result.get("reason", ""), 300)
    nan = f", NaN from token {result.get('first_nan')}" if result.get("nan") else ""
    return (f"Δ logprob max {result['max_abs_dlogprob']:.2g}, mean {result['mean_abs_dlogprob']:.2g} over "
            f"{result['tokens']} tokens{nan}")


# --- the port cells ----------------------------------------------------------------------------------------------------
@dataclass
class TypeRow:
    """Everything the doc says of one model type: its own scheme (or why not audited) and each method's cells."""

    model_type: str
    scheme: str | None  # the audit's scheme in words (None: not audited, `own` says why)
    own: dict[str, Cell]  # engine title -> own-scheme cell
    methods: dict[str, dict[str, Cell] | Cell]  # method -> {engine title: cell}, or the plan's refusal
    unbuilt: str | None = None  # the tiny config could not be built


def engines():
    """The registered engines, the reference (transformers) first."""
    from rope_extend.engines.registry import serving_engines

    return serving_engines()


def compute(types: Sequence[str], names: Iterable[str] | None = None) -> list[TypeRow]:
    """The port cells of every type in `types` (the methods `names`, default all)."""
    import logging

    import transformers

    from rope_extend.engines.audit import audit
    from rope_extend.engines.hint import COMMAND
    from rope_extend.engines.parity import parity_many

    transformers.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    rows: list[TypeRow] = []
    items, where = [], []
    aliases: dict[str, list[str]] = {}  # how a note names the type (its folder, its model_type): "this model type"
    ported = [engine for engine in engines() if engine.ported]
    reference = next(engine for engine in engines() if not engine.ported)
    with tempfile.TemporaryDirectory(prefix="engine-matrix-") as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for model_type in types:
            folder = Path(tmp) / model_type
            try:
                raw = save_config(tiny.zoo_config(model_type), model_type, folder)
            except Exception as exc:  # (a type whose tiny config does not build: said)
                rows.append(TypeRow(model_type, None, {}, {}, unbuilt=one_line(exc)))
                continue
            row = TypeRow(model_type, None, {}, {})
            text = raw["text_config"] if isinstance(raw.get("text_config"), dict) else {}
            types_named = [f"'{t}'" for t in dict.fromkeys([model_type, text.get("model_type") or model_type])]
            aliases[model_type] = [repr(folder), repr(str(folder)), str(folder),
                                   *(f"model type {t}" for t in types_named), *types_named]
            try:
                report = audit(folder)
            except Exception as exc:  # (the audit's refusal, or its failure, is the cell)
                why = one_line(str(exc)) if isinstance(exc, ValueError) else f"the audit fails: {one_line(exc)}"
                row.own = {engine.title: Cell(FAILED, why) for engine in ported}
            else:
                row.scheme = report.scheme.split(", original length")[0]
                verdicts = {v.engine: v for v in report.verdicts()}
                row.own = {engine.title: audit_cell(verdicts[engine.row_name], report.short) for engine in ported
                           if engine.row_name in verdicts}
            for method, spec in specs(folder, names).items():
                if isinstance(spec, Cell):
                    row.methods[method] = spec
                else:
                    items.append((raw, spec))
                    where.append((row, method))
            rows.append(row)
        reports = _reports(items, parity_many)
    for (row, method), report in zip(where, reports):
        if isinstance(report, Cell):  # the report itself failed (a port that crashes on this config)
            row.methods[method] = {engine.title: report for engine in engines()}
            continue
        cells = {}
        for parity_row in report.rows:
            if parity_row.serves is None:  # the installed transformers, run
                cells.setdefault(reference.title, row_cell(parity_row))
        for engine in ported:
            mine = [r for r in report.rows if r.serves and r.serves[0] == engine.title]
            chosen = next((r for r in mine if r.serves[1] == COMMAND), mine[0] if mine else None)
            if chosen is not None:
                cells[engine.title] = row_cell(chosen)
        row.methods[method] = cells
    for row in rows:
        known = aliases.get(row.model_type, [])
        row.own = {title: _generic(cell, known) for title, cell in row.own.items()}
        row.methods = {method: _generic(cells, known) if isinstance(cells, Cell) else
                       {title: _generic(cell, known) for title, cell in cells.items()}
                       for method, cells in row.methods.items()}
    return rows


def _generic(cell: Cell, names: list[str]) -> Cell:
    """The cell's note with the type's names (its temporary folder, its model_type) said as "this model type", so
    that one reason shared by many types is one note."""
    if not cell.note:
        return cell
    note = cell.note
    for name in names:
        note = note.replace(name, "this model type")
    return Cell(cell.verdict, note)


def _reports(items: list, parity_many) -> list:
    """`parity_many(items)`, or where it fails, each item's report alone, an item that fails itself giving
    `Cell(FAILED, its error)`."""
    try:
        return parity_many(items, other_line=False)
    except Exception:  # one item breaks the batch: find it
        if len(items) == 1:
            raise
    out = []
    for item in items:
        try:
            out += parity_many([item], other_line=False)
        except Exception as exc:  # (what the doc says of it)
            out.append(Cell(FAILED, f"rope-extend engines fails on this config: {one_line(exc)}"))
    return out


# --- the measured cells ------------------------------------------------------------------------------------------------
def read_records(folder: Path = RECORDS) -> list[dict]:
    path = folder / RESULTS
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def measured(records: Sequence[dict]) -> dict[tuple[str, str, str], tuple[Cell, dict]]:
    """{(engine title, model type, method): (the measured cell of the card's command route, the record)}, the latest
    record of each cell winning."""
    out = {}
    for record in records:
        key = (record["engine_title"], record["model_type"], record["method"])
        if "error" in record:
            out[key] = (Cell(FAILED, one_line(record["error"], 300)), record)
            continue
        routes = record["routes"]
        chosen = next((r for r in routes if r["line"] == "command"), routes[0] if routes else None)
        if chosen is None:
            continue
        out[key] = (run_cell(chosen), record)
    return out


# --- the page ----------------------------------------------------------------------------------------------------------
OWN, REFUSED_TABLE = "Own schemes", "Refused for every method"
TYPE = "model type"
CELL = re.compile(r"^(?P<verdict>[^\[;(]+?)(?: \[(?P<note>\d+)\])?"
                  r"(?:; run (?P<run>[^\[;(]+?)(?: \[(?P<run_note>\d+)\])? \((?P<date>\d{4}-\d{2}-\d{2})\))?$")


def _shown(cell: Cell, run: tuple[Cell, dict] | None = None) -> tuple:
    """A verdict cell as the page holds it: (verdict, note, measured verdict, its note, its date)."""
    note = " ".join(cell.note.split()) if cell.note else None
    if run is None:
        return (cell.verdict, note, None, None, None)
    measured_cell, record = run
    run_note = " ".join(measured_cell.note.split()) if measured_cell.note else None
    return (cell.verdict, note, measured_cell.verdict, run_note, record["finished"][:10])


def tables(rows: Sequence[TypeRow], records: Sequence[dict] = ()) -> dict[str, tuple[list[str], dict[str, list]]]:
    """The page's tables, {title: (columns, {model type: cells})}: a text cell is a 1-tuple, a verdict cell a
    5-tuple (`_shown`). What `render` writes and `parse` reads back."""
    titles = [engine.title for engine in engines()]
    ported = [engine.title for engine in engines() if engine.ported]
    runs = measured(records)
    out: dict[str, tuple[list[str], dict[str, list]]] = {}
    own = {}
    for row in rows:
        if row.unbuilt:
            continue
        cells = [(_plain(row.scheme or "not audited"),)]
        cells += [_shown(row.own[title]) if title in row.own else ("—",) for title in ported]
        own[row.model_type] = cells
    out[OWN] = (["RoPE of the tiny config (the audit)", *ported], own)
    written = [row for row in rows if not row.unbuilt and
               not all(isinstance(cells, Cell) for cells in row.methods.values())]
    for method in methods():
        table = {}
        for row in written:
            cells = row.methods.get(method.name)
            if cells is None:
                continue
            if isinstance(cells, Cell):  # the plan refuses it: one cell, the rest empty
                table[row.model_type] = [_shown(cells)] + [("—",)] * (len(titles) - 1)
                continue
            table[row.model_type] = [_shown(cells[title], runs.get((title, row.model_type, method.name)))
                                     if title in cells else ("—",) for title in titles]
        out[f"`{method.name}`"] = (titles, table)
    refused = {}
    for row in rows:
        if row.unbuilt:
            refused[row.model_type] = [(_plain(f"the tiny config does not build: {row.unbuilt}"),)]
        elif row not in written:
            reasons = [cells.note for cells in row.methods.values() if isinstance(cells, Cell)]
            refused[row.model_type] = [(_plain(max(sorted(set(reasons)), key=reasons.count)),)]
    out[REFUSED_TABLE] = (["why (rope-extend's plan, in one line)"], refused)
    return out


def _plain(text: str) -> str:
    """Text for a table cell: one line, no column separator."""
    return " ".join(text.split()).replace("|", "/")


def _text(cell: tuple, notes: dict[str, int]) -> str:
    if len(cell) == 1:
        return cell[0]
    verdict, note, run, run_note, date = cell

    def numbered(text):
        if text is None:
            return ""
        notes.setdefault(text, len(notes) + 1)
        return f" [{notes[text]}]"

    out = verdict + numbered(note)
    if run is not None:
        out += f"; run {run}{numbered(run_note)} ({date})"
    return out


BEGIN, END = "<!-- ENGINE-MATRIX:BEGIN (tools/engine_matrix.py) -->", "<!-- ENGINE-MATRIX:END -->"


def render(rows: Sequence[TypeRow], records: Sequence[dict] = (), seconds: float | None = None) -> str:
    """docs/engine-matrix.md."""
    import transformers

    from rope_extend.engines.runs import LOGPROB_TOL, MEAN_TOL

    data = tables(rows, records)
    notes: dict[str, int] = {}
    body: list[str] = []
    for title, (columns, table) in data.items():
        body += ["", f"## {title}", "", _intro(title), "", "| " + " | ".join([TYPE, *columns]) + " |",
                 "|" + "---|" * (len(columns) + 1)]
        body += ["| " + " | ".join([f"`{model_type}`", *(_text(c, notes) for c in cells)]) + " |"
                 for model_type, cells in table.items()]
    load = os.getloadavg()[0]
    timing = "" if seconds is None else f" in {seconds:.0f} s"
    engines_lines = []
    runs = measured(records)
    for engine in engines():
        room = "/".join(type(engine).__module__.split(".")[:3])
        what = (f"transformers {transformers.__version__}, the installed library, run: its rotary module built from "
                "the written config.json "
                "(the reference: no own-scheme column)" if not engine.ported
                else f"rope-extend's port of {engine.version} (`{room}/`)")
        mine = [record for (title, _, _), (_, record) in runs.items() if title == engine.title]
        labels = sorted({record["routes"][0]["engine"] for record in mine if record.get("routes")})
        dates = sorted(record["finished"][:10] for record in mine)
        ran = (f"{'; '.join(labels)}: {len(mine)} cells, {dates[0]}" + (f" to {dates[-1]}" if dates[-1] != dates[0]
                                                                       else "")) if mine else "—"
        engines_lines.append(f"| {engine.title} | {what} | {ran} |")
    head = [
        "# Engine compatibility matrix",
        "",
        f"Every causal-LM model type of transformers {transformers.__version__} whose modeling code has a rotary "
        f"embedding ({len(rows)} types: tests/tiny.py::zoo_types, the zoo the suite builds), its own RoPE scheme and "
        "each method rope-extend writes for it, in every serving engine rope-extend knows "
        "(`rope_extend.engines.registry`). Users find these differences one model at a time in engine trackers; this "
        "page computes them all.",
        "",
        f"Generated by `python tools/engine_matrix.py docs/engine-matrix.md`{timing} on a "
        f"{platform.machine()} CPU with {os.cpu_count()} cores (load average {load:.1f}); do not edit by hand. "
        "tests/test_engine_matrix.py checks the port cells of 5 model types (a deterministic sample, "
        f"`engine_matrix.sample`: {', '.join(sample([row.model_type for row in rows]))}) against what the command "
        "computes today, that every type is on the page, and every measured cell against the records it is read from.",
        "",
        f"Each type is its tiny config (tests/tiny.py::zoo_config: hidden 64, 4 heads of 16 over 2 KV heads, "
        f"max_position_embeddings L = {L}, the type's own RoPE base and layer types with the scaling of its class "
        "defaults removed), saved as `save_pretrained` writes config.json, with the `architectures` of its causal-LM "
        f"class. A method is written at s = {FACTOR:g} (`RopeMethod.example_spec`; LongRoPE's factors sized to the "
        f"type's rotary dimension; string with local_value {TINY_WINDOW_SETTINGS['string']['local_value']}, below the "
        f"tiny window) and checked for a short request (L = {L} tokens) and a long one (s·L = {int(L * FACTOR)} "
        "tokens), as `rope-extend engines SOURCE --method M --factor S` does (the parity report's port rows); an "
        "engine's cell is its card command's route (this checkpoint; llama.cpp: the GGUF converted from it). The own "
        "scheme is `rope-extend engines MODEL` (the audit: each engine's port against transformers' own rotary "
        "embedding of the config).",
        "",
        "## Engines",
        "",
        "| engine | what its port cells run | measured here (run cells) |",
        "|---|---|---|",
        *engines_lines,
        "",
        "## Key",
        "",
        *(f"- **{word}**: {meaning}" for word, meaning in VERDICTS.items()),
        f"- `[n]`: note n (at the end), the reason in the engine's or rope-extend's words; `; run V (date)`: the "
        "verdict measured that day in the real engine on the type's tiny model with weights (the same config "
        f"widened to head_dim {SERVED_WIDTH['head_dim']}), every prompt token's log-probability against transformers "
        f"running rope-extend's RoPE (identical: |Δ logprob| <= {LOGPROB_TOL:g} each, <= {MEAN_TOL:g} on average, "
        "no NaN); section Measured lists every such cell with its numbers.",
        "",
        "## Summary",
        "",
        *_summary(data),
    ]
    tail = ["", "## Notes", ""] + [f"[{n}] {text}" for text, n in notes.items()]
    tail += ["", "## Measured", "", *_measured_section(data, records)]
    return "\n".join([*head, "", BEGIN, *body, *tail, "", END, ""])


def _intro(title: str) -> str:
    if title == OWN:
        return ("The type's own RoPE (the tiny config's, scaling defaults removed) in each engine, against "
                "transformers' own rotary embedding of the config (`rope-extend engines MODEL`); the short and the "
                "long request are both L here (the window).")
    if title == REFUSED_TABLE:
        return "Types rope-extend writes no method for (absent from the method tables above)."
    name = title.strip("`")
    method = next(m for m in methods() if m.name == name)
    if method.acts_on_attention:
        return (f"{name} acts on attention: nothing in config.json carries it, so every engine serves the model "
                "without it (its own RoPE and attention); only `rope_extend.patch_model` applies it.")
    return f"`rope-extend engines SOURCE {spec_flags(method.example_spec(FACTOR, 8)).split(' --set')[0]}`."


def _summary(data) -> list[str]:
    """How many types each engine serves identically, per table."""
    titles = [engine.title for engine in engines()]
    lines = ["| | " + " | ".join(titles) + " |", "|" + "---|" * (len(titles) + 1)]
    for title, (columns, table) in data.items():
        if title == REFUSED_TABLE:
            continue
        counts = []
        for engine in titles:
            if engine not in columns:
                counts.append("—")
                continue
            i = columns.index(engine)
            verdicts = [cells[i][0] for cells in table.values() if len(cells[i]) > 1 and cells[i][0] != REFUSED]
            found = {word: verdicts.count(word) for word in VERDICTS if verdicts.count(word)}
            counts.append(", ".join(f"{n} {word}" for word, n in found.items()) or "—")
        refused = sum(cells[0][0] == REFUSED for cells in table.values())
        what = (f"{len(table)} types" if title == OWN else f"{len(table) - refused} types written"
                + (f", {refused} refused" if refused else ""))
        lines.append(f"| {title.lower() if title == OWN else title} ({what}) | " + " | ".join(counts) + " |")
    return lines


def _measured_section(data, records: Sequence[dict]) -> list[str]:
    runs = measured(records)
    if not runs:
        return ["No cell measured yet: `nice -n 15 python tools/engine_matrix.py --run ENGINE` records them in "
                "eval/reports/engine-matrix/results.jsonl."]
    by_engine: dict[str, list] = {}
    for (title, model_type, method), (cell, record) in runs.items():
        by_engine.setdefault(title, []).append((model_type, method, cell, record))
    out = []
    for title, cells in by_engine.items():
        types = list(dict.fromkeys(t for t, *_ in cells))
        dates = sorted(record["finished"][:10] for *_, record in cells)
        commands = sorted({record["command"] for *_, record in cells})
        seconds = {}
        for *_, record in cells:
            seconds[(record["model_type"], tuple(record["batch_methods"]), record["finished"])] = record["batch_seconds"]
        loads = [record["load_before"][0] for *_, record in cells]
        out += [f"### {title}", "",
                f"{len(cells)} cells measured ({len(types)} model types: {', '.join(f'`{t}`' for t in types)}), "
                f"{dates[0]} to {dates[-1]}, in {sum(seconds.values()) / 3600:.1f} h on {cells[0][3]['device']} "
                f"(load average {min(loads):.1f} to {max(loads):.1f} at the start of each model type), by "
                + "; ".join(f"`{c}`" for c in commands) + ". Each cell's own command (`cell_command` in "
                "eval/reports/engine-matrix/results.jsonl) is `rope-extend engines FOLDER --method M ... --run "
                f"{cells[0][3]['engine']}` on the type's served model. Each row: the card command's route (this "
                "checkpoint), its requests' Δ logprob against transformers running rope-extend's RoPE or the engine's "
                "refusal, the verdict, what the engine's port says of the same served config, and the verdict of the "
                "engine's other routes.", "", *_agreement(cells), "",
                "| model type | method | short request (L tokens) | long request (s·L tokens) | verdict | port of the "
                "served config | other routes | date |",
                "|---|---|---|---|---|---|---|---|"]
        for model_type, method, cell, record in cells:
            if "error" in record:
                out.append(f"| `{model_type}` | `{method}` | failed: {_plain(record['error'])[:300]} | | {FAILED} | | | "
                           f"{record['finished'][:10]} |")
                continue
            routes = record["routes"]
            chosen = next((r for r in routes if r["line"] == "command"), routes[0])
            others = "; ".join(f"{r['route']}: {run_cell(r).verdict}" for r in routes if r is not chosen) or "—"
            port = chosen["port"]["verdict"] if chosen.get("port") else "—"
            out.append(f"| `{model_type}` | `{method}` | {_plain(_run_words(chosen['short']))[:200]} | "
                       f"{_plain(_run_words(chosen['long']))[:200]} | {cell.verdict} | {port} | {_plain(others)} | "
                       f"{record['finished'][:10]} |")
        out.append("")
    return out


def _agreement(cells: list) -> list[str]:
    """Where the measured verdict is the port's (of the served config), where not, and every contradiction of the card
    a run found (`ParityReport.contradictions`)."""
    same, other, contradicted = 0, [], []
    for model_type, method, cell, record in cells:
        if "error" in record:
            continue
        chosen = next((r for r in record["routes"] if r["line"] == "command"), record["routes"][0])
        port = chosen["port"]["verdict"] if chosen.get("port") else None
        if port == cell.verdict:
            same += 1
        else:
            other.append(f"`{model_type}` `{method}` (port: {port}, run: {cell.verdict})")
        contradicted += [f"`{model_type}` `{method}`: {_plain(c)[:240]}" for c in record.get("contradictions", [])]
    out = [f"The run's verdict is the port's in {same} of {same + len(other)} cells"
           + (f"; otherwise in {len(other)}: {', '.join(other)}." if other else ".")]
    out.append(f"Contradictions of the card (a route it lists as identical measured otherwise): {len(contradicted)}"
               + (": " + "; ".join(contradicted) if contradicted else "") + ".")
    return out


def parse(text: str) -> dict[str, tuple[list[str], dict[str, list]]]:
    """The tables of a page `render` wrote, each cell as `tables` gives it (notes resolved to their text)."""
    body = text.split(BEGIN, 1)[1].split(END, 1)[0]
    notes_part = body.split("\n## Notes\n", 1)[1].split("\n## Measured", 1)[0]
    notes = {}
    for line in notes_part.strip().splitlines():
        number, _, note = line.partition("] ")
        notes[number.lstrip("[")] = note
    out = {}
    for section in body.split("\n## Notes\n", 1)[0].split("\n## ")[1:]:
        title, _, rest = section.partition("\n")
        lines = [line for line in rest.splitlines() if line.startswith("| ")]
        columns = lines[0].strip("| ").split(" | ")[1:]
        table = {}
        for line in lines[1:]:
            fields = line[2:-2].split(" | ")
            table[fields[0].strip("`")] = [_parse_cell(field, notes) for field in fields[1:]]
        out[title] = (columns, table)
    return out


def _parse_cell(field: str, notes: dict[str, str]) -> tuple:
    match = CELL.match(field)
    if match is None or match["verdict"] not in VERDICTS:
        return (field,)
    note, run_note = (notes.get(match[k]) if match[k] else None for k in ("note", "run_note"))
    return (match["verdict"], note, match["run"], run_note, match["date"])


# --- the evidence run --------------------------------------------------------------------------------------------------
# The engines' own architectures first (what vLLM and SGLang implement natively, or vLLM through its Transformers
# backend: gpt_neox, olmo2, starcoder2, phi, smollm3, olmo3), then more of their families.
MEASURED_FIRST = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "olmo2", "gpt_neox", "granite",
                  "gemma", "stablelm", "starcoder2", "cohere", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "phi",
                  "exaone4", "glm4", "smollm3", "ernie4_5", "granitemoe", "olmo3", "cohere2", "ministral3")


def served_model(model_type: str, work: Path) -> Path:
    """The tiny model of `model_type` with weights and a tokenizer, saved in `work/<type>` (reused when there): the
    zoo config widened to `SERVED_WIDTH`, the vocabulary of `tiny_tokenizer(TOKENIZER_VOCAB)`, the type's own
    `tie_word_embeddings`, seed 0."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rope_extend.eval.toy_models import tiny_tokenizer

    folder = work / model_type
    if (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file():
        return folder
    tokenizer = tiny_tokenizer(TOKENIZER_VOCAB)
    config = tiny.zoo_config(model_type)
    data = config.to_dict()
    text = data["text_config"] if isinstance(data.get("text_config"), dict) else data
    # the type's own embedding tying (the zoo unties every type; an engine's model may tie by construction: Gemma 2's
    # vLLM model has no lm_head)
    default = AutoConfig.for_model(model_type)
    default = default.get_text_config() if hasattr(default, "get_text_config") else default
    text.update(SERVED_WIDTH, vocab_size=len(tokenizer), tie_word_embeddings=bool(default.tie_word_embeddings))
    data.pop("transformers_version", None)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(type(config).from_dict(data), attn_implementation="eager").float().eval()
    try:
        with torch.no_grad():
            model(torch.arange(3, 3 + L, dtype=torch.long)[None, :])
    except Exception as exc:  # the widened config is not one this type's modeling code runs: said so, not the engine
        raise ValueError(f"the served model (the zoo config widened to {SERVED_WIDTH}) does not run in transformers: "
                         f"{one_line(exc)}") from None
    tmp = folder.with_name(f".{model_type}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(folder)
    return folder


def _routes(report) -> list[dict]:
    """The run rows of a report, each with the port row of the same card line (the served config's port verdict)."""
    from rope_extend.engines.parity import PORT

    out = []
    for row in report.rows:
        if not row.served_by_engine:
            continue
        port = next((r for r in report.rows if r.kind == PORT and r.serves == row.serves), None)
        data = row.to_dict()
        out.append({"line": row.serves[1], "route": row.route, "engine": row.engine, "version": row.version,
                    "device": row.device, "short": data["short"], "long": data["long"],
                    "port": None if port is None else row_cell(port).__dict__})
    return out


def run_cells(run: str, types: Sequence[str], names: Sequence[str], out: Path, work: Path, command: str,
              retry_failed: bool = False) -> int:
    """Serve the tiny model of each type in the real engine `run` (a `--run` name) for every method in `names`, one
    `parity_many` per type (one engine worker for its methods; a failing batch is rerun method by method), appending
    a record per cell to OUT/results.jsonl. Returns the number of cells recorded."""
    from rope_extend.engines.parity import parity_many
    from rope_extend.engines.runs import resolve_runs

    ((engine, _route),) = resolve_runs([run])
    out.mkdir(parents=True, exist_ok=True)
    done = {(r["engine"], r["model_type"], r["method"]) for r in read_records(out)
            if not (retry_failed and "error" in r)}
    machine = f"{platform.machine()} CPU, {os.cpu_count()} cores"
    recorded = 0
    for model_type in types:
        folder, built = None, None
        try:
            folder = served_model(model_type, work)
            wanted = specs(folder, names)  # a method the plan refuses is not served (the doc shows the refusal)
        except Exception as exc:  # (a type whose served model does not build: recorded as failed)
            wanted, built = dict.fromkeys(names), one_line(exc, 2000)
        todo = {m: s for m, s in wanted.items() if not isinstance(s, Cell) and (run, model_type, m) not in done}
        if not todo:
            continue
        batches = [list(todo)]
        while batches:
            batch = batches.pop(0)
            load_before, started = os.getloadavg(), time.time()
            error, reports = built, None
            if error is None:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        reports = parity_many([(str(folder), todo[m]) for m in batch], other_line=False, runs=[run])
                except KeyboardInterrupt:
                    raise
                except Exception as exc:  # (the engine failed: method by method, then recorded)
                    if len(batch) > 1:
                        batches = [[m] for m in batch] + batches
                        continue
                    error = one_line(exc, 2000)
            seconds = time.time() - started
            lines = []
            for i, method in enumerate(batch):
                spec = todo[method]
                record = {
                    "engine": run, "engine_title": engine.title, "model_type": model_type, "method": method,
                    "spec": spec, "factor": FACTOR, "short_tokens": L, "long_tokens": int(L * FACTOR),
                    "served_model": {**SERVED_WIDTH, "tokenizer_vocab": TOKENIZER_VOCAB, "seed": 0,
                                     "folder": None if folder is None else str(folder)},
                    "command": command,
                    "cell_command": None if spec is None else
                    f"rope-extend engines {folder} {spec_flags(spec)} --run {run}",
                    "batch_methods": batch, "batch_seconds": round(seconds, 1),
                    "load_before": [round(x, 2) for x in load_before],
                    "load_after": [round(x, 2) for x in os.getloadavg()],
                    "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "device": machine,
                }
                if error is not None:
                    record["error"] = error
                else:
                    report = reports[i]
                    record["routes"] = _routes(report)
                    record["contradictions"] = report.contradictions()
                lines.append(json.dumps(record))
            with open(out / RESULTS, "a") as f:
                f.write("".join(line + "\n" for line in lines))
            recorded += len(lines)
            print(f"engine-matrix: {run} {model_type} {', '.join(batch)}: {seconds:.0f} s"
                  + (f" (failed: {error[:200]})" if error else ""), file=sys.stderr, flush=True)
    return recorded


# --- the command -------------------------------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("doc", nargs="?", default=str(DOC), help="the page to write (default docs/engine-matrix.md)")
    parser.add_argument("--run", action="append", default=[],
                        help="serve the tiny models in this real engine (a `rope-extend engines --run` name: vllm, "
                             "sglang, ...) and record the cells, instead of writing the doc; repeatable")
    parser.add_argument("--types", nargs="+", help=f"model types to serve (default: {', '.join(MEASURED_FIRST)}; "
                        "'all': the whole zoo)")
    parser.add_argument("--methods", nargs="+", help="methods to serve (default: every frequency method)")
    parser.add_argument("-o", "--out", default=str(RECORDS), help="where the records go (default %(default)s)")
    parser.add_argument("--work", default=None, help="where the served models are built (default "
                        "$ROPE_EXTEND_CACHE/engine-matrix-models)")
    parser.add_argument("--retry-failed", action="store_true", help="serve again the cells recorded as failed")
    args = parser.parse_args(argv)
    if args.run:
        import signal

        from rope_extend.demo_model import cache_root

        # stopped with SIGTERM or SIGINT (also when started in the background, where SIGINT is ignored): an interrupt,
        # on which the engines' workers are stopped at once
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.default_int_handler)

        types = list(MEASURED_FIRST) if not args.types else zoo_types() if args.types == ["all"] else args.types
        names = args.methods or [m.name for m in methods("frequency")]
        work = Path(args.work) if args.work else cache_root() / "engine-matrix-models"
        command = shlex.join(["python", "tools/engine_matrix.py", *argv])
        for run in args.run:
            count = run_cells(run, types, names, Path(args.out), work, command, args.retry_failed)
            print(f"engine-matrix: {run}: {count} cells recorded in {Path(args.out) / RESULTS}")
        return 0
    started = time.time()
    path = Path(args.doc)
    path.write_text(render(compute(zoo_types()), read_records(Path(args.out)), seconds=time.time() - started))
    print(f"engine-matrix: wrote {path} in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
