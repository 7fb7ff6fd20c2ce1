"""Before/after evaluation runner: the unpatched model and each RoPE spec, side by side.

Results are appended to ``<out_dir>/results.jsonl`` one line per finished case (flushed and
fsynced), so a killed run loses at most the case in flight; rerunning with the same
``out_dir`` skips every finished case.  A case is identified by
``(variant name, spec fingerprint, case_id)``: changing a variant's spec recomputes it.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar

from .suite import Case, Suite, load_suite
from .variants import Variant, apply_spec, load_model, make_variants, original_length

RESULTS_FILE = "results.jsonl"
REPORT_FILE = "report.md"
RUN_FILE = "run.json"


def read_results(path: str | os.PathLike) -> list[dict]:
    """Records from a ``results.jsonl`` (or a directory holding one); a torn last line is ignored."""
    p = Path(path)
    if p.is_dir():
        p = p / RESULTS_FILE
    if not p.is_file():
        return []
    out = []
    with open(p, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # partially written line from a killed run
    return out


def _key(rec: dict) -> tuple:
    return (rec["variant"], rec.get("fingerprint"), rec["case_id"])


def _append(path: Path, rec: dict) -> None:
    # Make sure we start on a fresh line even if a previous run died mid-write.
    needs_nl = path.is_file() and path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
    with open(path, "a", encoding="utf-8") as f:
        if needs_nl:
            f.write("\n")
        f.write(json.dumps(rec, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _cost(case: Case) -> float:
    """Rough relative cost (for the ETA): linear + quadratic attention term."""
    L = case.length
    c = L * (1.0 + L / 16384.0)
    return c * (1.3 if case.kind != "perplexity" else 1.0)


def _config_original_length(model_path) -> int:
    from ..facts import read_rope
    from ..files import load_config

    return read_rope(load_config(Path(model_path))).original_length()


class _Evaluator:
    """Runs cases on one loaded model variant (caches the tokenised text)."""

    _text_cache: ClassVar[dict] = {}

    def __init__(self, model, tokenizer, original: int, seed: int):
        self.model, self.tok, self.original, self.seed = model, tokenizer, original, seed

    def text_ids(self, source):
        from .perplexity import tokenize_text
        from .texts import load_text

        key = (id(type(self.tok)), getattr(self.tok, "name_or_path", ""), len(self.tok), str(source))
        if key not in self._text_cache:
            self._text_cache[key] = tokenize_text(self.tok, load_text(source))
        return self._text_cache[key]

    def run(self, case: Case) -> dict:
        if case.kind == "perplexity":
            from .perplexity import perplexity_at_length

            p = case.params
            return perplexity_at_length(
                self.model,
                self.text_ids(p.get("text")),
                case.length,
                original_length=self.original,
                bucket_size=int(p.get("bucket_size", 1024)),
                chunk_size=int(p.get("chunk_size", 1024)),
                start=int(p.get("start", 0)),
            )
        if case.kind == "entropy":
            from ..entropy import attention_entropy

            p = case.params
            per_layer = attention_entropy(
                self.model, self.text_ids(p.get("text")), [case.length], queries=int(p.get("queries", 128))
            )[case.length]
            return {"mean_entropy": sum(per_layer) / len(per_layer), "per_layer": per_layer}
        from .probes import make_probe, run_probe

        sample = make_probe(
            self.tok, case.kind, case.length, 0.5 if case.depth is None else case.depth,
            index=case.index, seed=self.seed, **case.params,
        )
        res = run_probe(self.model, self.tok, sample)
        res["needle_positions"] = sample.needle_positions
        return res


def _preflight(suite: Suite, cases: list[Case], model_path=None, tokenizer=None) -> None:
    """Fail fast, before any model work: the perplexity text must be long enough and every
    probe prompt must fit its length (a prompt is never truncated)."""
    if not cases:
        return
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    ev = _Evaluator(None, tokenizer, 0, suite.seed)
    from .probes import make_probe

    for c in cases:
        if c.kind in ("perplexity", "entropy"):
            n = ev.text_ids(c.params.get("text")).numel() - int(c.params.get("start", 0))
            if c.length > n:
                raise ValueError(
                    f"perplexity text {c.params.get('text') or 'pydoc_topics'!r} has only {n} tokens; "
                    f"the suite asks for {c.length}"
                )
        else:
            make_probe(tokenizer, c.kind, c.length, 0.5 if c.depth is None else c.depth,
                       index=c.index, seed=suite.seed, **c.params)


def run_eval(
    model_path: str | os.PathLike,
    specs: list | dict | None = None,
    suite: str | os.PathLike | dict | Suite = "quick",
    out_dir: str | os.PathLike = "eval-out",
    *,
    dtype: str = "float32",
    device_map: str | None = None,
    device: str | None = None,
    text: str | os.PathLike | None = None,
    include_baseline: bool = True,
    resume: bool = True,
    progress: bool = True,
    plots: bool = True,
    loader: Callable[[], tuple[Any, Any]] | None = None,
    on_record: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Evaluate the unpatched model and each spec on *suite*; write results, report and plots.

    Args:
        model_path: HF checkpoint directory (or hub id) of the *unpatched* model.
        specs: RoPE specs (``RopeSpec``, dict, YAML path, or ``f(model)`` callable), or a
            ``{name: spec}`` dict.  Each is applied with ``rope_extend.patch_model`` to a
            freshly loaded copy of the model.
        suite: bundled suite name (``quick``, ``full``), YAML path, dict or ``Suite``.
        out_dir: where ``results.jsonl``, ``report.md`` and the PNG plots go.
        dtype / device_map / device: model loading (``float32`` by default; ``device_map``
            e.g. ``"auto"`` needs accelerate).
        text: perplexity text file overriding the suite's (default: the suite's, else the
            stdlib docs prose).
        include_baseline: also evaluate the unpatched model (the "before" column).
        resume: skip cases already in ``results.jsonl`` (``False`` starts a fresh file).
        loader: optional ``() -> (model, tokenizer)`` replacing ``load_model`` (tests, custom loading).
        on_record: called with every new record after it has been written.

    Returns:
        All records for this run's variants (resumed + new), in suite order.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / RESULTS_FILE
    suite_obj = load_suite(suite)
    if text is not None and suite_obj.perplexity is not None:
        suite_obj.perplexity = {**suite_obj.perplexity, "text": str(text)}
    variants = make_variants(specs, include_baseline=include_baseline)

    preflight_tok = None
    if loader is None:
        original = _config_original_length(model_path)
    else:
        m, preflight_tok = loader()
        original = original_length(m)
        del m
    cases = suite_obj.cases(original)

    if not resume and results_path.exists():
        results_path.rename(out / f"results.{int(time.time())}.jsonl.bak")
    done = {_key(r): r for r in read_results(results_path)}

    todo: list[tuple[Variant, list[Case]]] = []
    for v in variants:
        pending = [c for c in cases if (v.name, v.fingerprint, c.case_id) not in done]
        todo.append((v, pending))

    (out / RUN_FILE).write_text(
        json.dumps(
            {
                "model_path": str(model_path),
                "original_length": original,
                "suite": suite_obj.to_dict(),
                "suite_source": suite_obj.source,
                "variants": [{"name": v.name, "spec": v.spec_dict(), "fingerprint": v.fingerprint} for v in variants],
                "dtype": dtype,
                "device_map": device_map,
            },
            indent=2,
            default=str,
        )
    )

    if any(p for _, p in todo):
        _preflight(suite_obj, [c for c in cases if any(c in p for _, p in todo)], model_path, preflight_tok)

    total_cost = sum(_cost(c) for _, p in todo for c in p)
    prog = _progress(progress)
    with prog:
        task = prog.add_task("evaluating", total=total_cost or 1.0)
        for v, pending in todo:
            if not pending:
                continue
            prog.update(task, description=f"{v.name}: loading")
            model, tok = loader() if loader is not None else load_model(
                model_path, dtype=dtype, device_map=device_map, device=device
            )
            report = apply_spec(model, v.spec)
            ev = _Evaluator(model, tok, original, suite_obj.seed)
            for case in pending:
                prog.update(task, description=f"{v.name}: {case.case_id}")
                t0 = time.perf_counter()
                metrics = ev.run(case)
                rec = {
                    "variant": v.name,
                    "fingerprint": v.fingerprint,
                    "spec": v.spec_dict(),
                    "case_id": case.case_id,
                    "kind": case.kind,
                    "length": case.length,
                    "depth": case.depth,
                    "index": case.index,
                    "original_length": original,
                    "metrics": metrics,
                    "seconds": round(time.perf_counter() - t0, 3),
                    "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                }
                if report is not None and case is pending[0]:
                    rec["patch_report"] = _jsonable(report)
                _append(results_path, rec)
                done[_key(rec)] = rec
                if on_record is not None:
                    on_record(rec)
                prog.advance(task, _cost(case))
            del model, ev
            gc.collect()
        prog.update(task, description="done")

    records = []
    for v in variants:
        for c in cases:
            r = done.get((v.name, v.fingerprint, c.case_id))
            if r is not None:
                records.append(r)

    from .report import write_report

    write_report(records, out, plots=plots, meta=json.loads((out / RUN_FILE).read_text()))
    return records


def _jsonable(obj):
    """JSON-friendly view of a patch report (dataclass / pydantic / plain)."""
    import dataclasses

    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json", exclude_none=True)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    return str(obj)


def _progress(enabled: bool):
    from rich.progress import (
        BarColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        disable=not enabled,
    )


def summary_markdown(results) -> str:
    """Compact markdown tables (perplexity, passkey, needle) for model cards.

    *results*: records from :func:`run_eval`, a ``results.jsonl`` path, or an output directory.
    """
    from .report import summary_tables

    if isinstance(results, (str, os.PathLike)):
        results = read_results(results)
    return summary_tables(list(results))
