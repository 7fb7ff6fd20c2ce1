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
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..formatting import fmt_clock
from ..outputs import EVAL_RUN_FILE, check_replaceable
from .jobs import Evaluator, Job, plan_jobs
from .suite import Suite, load_suite
from .variants import (
    Variant,
    Window,
    applies,
    apply_spec,
    load_model,
    make_variants,
    model_window,
    spec_words,
)

RESULTS_FILE = "results.jsonl"
RUN_FILE = EVAL_RUN_FILE  # also what marks a folder as an eval output (outputs.py)


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


def config_window(source) -> Window:
    """The window SOURCE's config (its text part) serves as shipped (`variants.model_window`: Llama 3.1's 131072,
    with llama3's pre-scaling 8192 beside it): what the suite's lengths are laid out from. `source`: a
    `source.Source`, or what `source.load_source` takes."""
    from ..source import Source, load_source

    loaded = source if isinstance(source, Source) else load_source(source, config_only=True)
    return model_window(loaded.config)


def _plan(loaded, spec):
    """The plan of a variant's spec on SOURCE; a refusal's suggestions in --spec keys, not `patch`'s flags."""
    from ..errors import Suggests
    from ..source import plan_source

    try:
        return plan_source(loaded, spec)
    except Suggests as exc:
        raise exc.worded(spec_words(spec)) from None


def check_memory(name: str, folder: Path, config, cases: list, dtype: str, device: str | None,
                 device_map: str | None, skip: bool = False) -> None:
    """Refuse in one line, before any weights load, a run whose longest pending case needs more memory than the
    device has (`rope_extend.memory`): the probes decode with a key/value cache, entropy holds one layer's
    attention probabilities."""
    from .. import memory

    if not cases:
        return
    entropy = [c.length for c in cases if c.kind == "entropy"]
    ways = memory.WaysOut(length="--suite SUITE.yaml with lengths up to ~{fits} tokens")
    memory.check_inference(name, folder, config, dtype, max(c.length for c in cases),
                           kv_cache=any(c.is_probe for c in cases), scores_length=max(entropy, default=0),
                           device=device, device_map=device_map, ways=ways, skip=skip)


def run_eval(
    model_path: str | os.PathLike,
    specs: list | dict | None = None,
    suite: str | os.PathLike | dict | Suite = "quick",
    out_dir: str | os.PathLike = "eval-out",
    *,
    dtype: str = "float32",
    device_map: str | None = None,
    device: str | None = None,
    text: str | os.PathLike | list | None = None,
    include_baseline: bool = True,
    resume: bool = True,
    progress: bool = True,
    plots: bool = True,
    share: bool = True,
    interleave: bool = False,
    loader: Callable[[], tuple[Any, Any]] | None = None,
    on_record: Callable[[dict], None] | None = None,
    memory_check: bool = True,
    engine: str = "transformers",
    engine_args: dict | None = None,
    worker=None,
) -> list[dict]:
    """Evaluate the unpatched model and each spec on *suite*; write results, report and plots.

    Args:
        model_path: the *unpatched* model: a checkpoint folder, a Hub id (resolved through the Hub cache, as
            ``patch`` resolves SOURCE) or the alias ``smollm2``.
        specs: RoPE specs (``RopeSpec``, dict, YAML path, or ``f(model)`` callable), or a
            ``{name: spec}`` dict.  Each is applied with ``rope_extend.patch_model`` to a
            freshly loaded copy of the model.
        suite: bundled suite name (``quick``, ``full``, ``paper``), YAML path, dict or ``Suite``.
        out_dir: where ``results.jsonl``, ``report.md`` and the PNG plots go.
        dtype / device_map / device: model loading (``float32`` by default; ``device_map``
            e.g. ``"auto"`` needs accelerate).
        text: perplexity text file(s) replacing the suite's texts.
        include_baseline: also evaluate the unpatched model (the "before" column).
        resume: skip cases already in ``results.jsonl`` (``False`` starts a fresh file).
        share: one forward for all perplexity lengths of a text on length-independent variants (the same numbers up
            to rounding: in bfloat16 dual-chunk's tokens in its first chunk round otherwise inside a longer forward).
        interleave: evaluate round by round across variants (see :func:`~rope_extend.eval.jobs.plan_jobs`).
        loader: optional ``() -> (model, tokenizer)`` replacing ``load_model`` (tests, custom loading).
        on_record: called with every new record after it has been written.
        memory_check: refuse, before loading, a run that needs more memory than the device has
            (``rope_extend.memory``; ``--no-memory-check`` turns it off). Transformers' estimate: not made for a
            run engine, which sizes its own KV cache at start.
        engine: ``transformers`` (the reference: each variant patched in this process) or a run engine registered
            in :mod:`rope_extend.engines.runs` (``vllm``: each variant served by a real vLLM as the card serves the
            original model with the method; see :mod:`rope_extend.eval.backends`: variants it does not serve
            identically are refused before anything loads, and the unpatched model's cases beyond its window are
            left out). ``engine_args``: the run engine's arguments passed through (its ``options``: for vLLM
            ``tensor_parallel_size``, ``pipeline_parallel_size``); ``worker``: a running worker of that engine to
            use (the caller closes it).

    Returns:
        All records for this run's variants (resumed + new), in suite order.
    """
    from ..engines.runs import REFERENCE, check_engine_args, lookup

    served_by = lookup(engine)  # a run engine's adapter; None: the reference, transformers in this process
    check_engine_args(engine_args or {}, engine)
    if served_by is not None and (loader is not None or device_map or device or dtype != "float32"):
        raise ValueError(f"--engine {engine}: the model is served by {served_by.title} in float32 (--dtype, "
                         f"--device, --device-map and a custom loader apply to {REFERENCE})")
    out = Path(out_dir)
    check_replaceable(out, "eval")  # a new or empty folder, or an eval output (resumed): never a user's folder
    _check_same_engine(out, engine, resume)
    results_path = out / RESULTS_FILE
    suite_obj = load_suite(suite)
    if text is not None:
        suite_obj = suite_obj.with_texts([str(t) for t in (text if isinstance(text, list | tuple) else [text])])
    variants = make_variants(specs, include_baseline=include_baseline)

    plans: dict[str, Any] = {}  # variant name -> its PatchPlan on SOURCE's config, applied to the loaded model
    if loader is None:
        from .. import compat
        from ..patch import verify_or_explain
        from ..source import load_source

        loaded = load_source(model_path)  # a folder, a Hub id (through the Hub cache) or an alias: as `patch`
        folder, config = loaded.folder, loaded.config
        window, preflight_tok = config_window(loaded), None
        for variant in variants:  # each spec planned once (or its plan given), on SOURCE's config, before any
            if variant.spec is not None and not callable(variant.spec):  # weights load: a spec the model refuses (a
                plan = variant.plan  # shipped scheme without replace_existing...) is one line now
                plan = plan if plan is not None else _plan(loaded, variant.rope_spec())
                if plan.changed:  # checked as patch_model checks it (stock transformers rebuilds it, a forward runs)
                    verify_or_explain(plan, config)
                plans[variant.name] = plan
    else:
        m, preflight_tok = loader()
        window = model_window(m.config)
        del m
    original = window.length  # what every length, label and ceiling counts from (records: "original_length")
    cases = suite_obj.cases(original)
    serving, excluded = {}, frozenset()
    if served_by is not None:  # planned once, before anything loads: refuses what it does not serve identically
        from .backends import plan_engine

        preflight_tok = preflight_tok or _tokenizer(folder)
        sampler = Evaluator(None, preflight_tok, original, suite_obj.seed)
        serving = plan_engine(served_by, folder, variants, plans,
                              {v.name: [c for c in cases if applies(c, v)] for v in variants},
                              lambda c: sampler.probe(c).max_new_tokens)
        excluded = frozenset((name, case_id) for name, s in serving.items() for case_id in s.left_out)
        for name, s in serving.items():
            if s.left_out and progress:
                print(f"rope-extend: eval --engine {engine}: {len(s.left_out)} case(s) of {name} left out: {s.why}",
                      file=sys.stderr, flush=True)
    done = {_key(r): r for r in read_results(results_path)} if resume else {}
    _check_resumed_plans(out, done, variants, plans)
    jobs = plan_jobs(cases, variants, set(done), share=share, interleave=interleave, excluded=excluded)
    if loader is None:
        check_memory(str(model_path), folder, compat.text_config(config), [c for j in jobs for c in j.cases], dtype,
                     device, device_map, skip=not memory_check or served_by is not None)

    if jobs and loader is None:  # a model without a tokenizer is one line before the output folder appears
        preflight_tok = preflight_tok or _tokenizer(folder)
    out.mkdir(parents=True, exist_ok=True)  # only now: a bad suite, spec, model or size leaves no empty folder
    if not resume and results_path.exists():
        results_path.rename(out / f"results.{int(time.time())}.jsonl.bak")
    meta = _run_meta(model_path, original, suite_obj, variants, dtype, device_map)
    if window.pre_scaling is not None:
        meta.update(pre_scaling_length=window.pre_scaling, shipped_scheme=window.scheme)
    meta["device"] = None if device_map else (device or "cpu")
    meta["expected_records"] = sum(applies(c, v) and (v.name, c.case_id) not in excluded
                                   for c in cases for v in variants)
    meta["engine"] = engine if served_by is not None else f"{REFERENCE} {_transformers_version()}"
    if served_by is not None:
        meta["left_out"] = {name: f"{len(s.left_out)} case(s): {s.why}" for name, s in serving.items() if s.left_out}
    (out / RUN_FILE).write_text(json.dumps(meta, indent=2, default=str))

    if jobs:
        preflight_tok = preflight_tok or _tokenizer(folder)
        pending = {c.case_id: c for j in jobs for c in j.cases}
        Evaluator(None, preflight_tok, original, suite_obj.seed).preflight(list(pending.values()))

    own_worker = served_by is not None and worker is None and bool(jobs)

    def load(v: Variant) -> Evaluator:
        nonlocal worker
        if served_by is not None:  # the variant served by the run engine, with the settings planned above
            from .backends import EngineBackend

            if worker is None:
                worker = served_by.open()
            settings = serving[v.name].settings
            served_by.load(worker, folder, settings, route=served_by.eval_route, engine_args=engine_args)
            ev = Evaluator(None, preflight_tok, original, suite_obj.seed, backend=EngineBackend(worker, preflight_tok))
            ev.patch_report = {"engine": worker.label(served_by.eval_route), **served_by.describe(settings)}
            return ev
        model, tok = loader() if loader is not None else load_model(
            folder, dtype=dtype, device_map=device_map, device=device
        )
        ev = Evaluator(model, tok, original, suite_obj.seed)
        if v.name in plans:  # the plan made before loading, executed on the model loaded from the same SOURCE
            from ..patch import apply_patch

            ev.patch_report = apply_patch(model, plans[v.name])
        else:
            ev.patch_report = apply_spec(model, v.spec)
        return ev

    def record(rec: dict) -> None:
        _append(results_path, rec)
        done[_key(rec)] = rec
        if on_record is not None:
            on_record(rec)

    try:
        run_jobs(jobs, load, original, record, progress)
    finally:
        if own_worker and worker is not None:
            worker.close()
    if served_by is not None and worker is not None:
        meta["engine"] = worker.label(served_by.eval_route)
        (out / RUN_FILE).write_text(json.dumps(meta, indent=2, default=str))
    records = [done[k] for v in variants for c in cases if (k := (v.name, v.fingerprint, c.case_id)) in done]
    write_outputs(records, out, plots=plots, meta=meta)
    return records


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _tokenizer(model_path):
    from .variants import load_tokenizer

    return load_tokenizer(model_path)


def _check_resumed_plans(out: Path, done: dict, variants: list[Variant], plans: dict[str, Any]) -> None:
    """A variant's fingerprint is its spec as written; the parameters it resolves to (a method's defaults) can move
    between releases. Resuming records whose resolved parameters differ from this run's plan would pool two models
    under one name: refused, naming what changed."""
    for v in variants:
        plan = plans.get(v.name)
        if plan is None:
            continue
        now = _jsonable(plan.spec)
        for rec in done.values():
            then = (rec.get("patch_report") or {}).get("spec")
            if (rec["variant"], rec.get("fingerprint")) != (v.name, v.fingerprint) or not isinstance(then, dict):
                continue
            changed = sorted(k for k in then.keys() & now.keys() if then[k] != now[k])
            if changed:
                what = ", ".join(f"{k} {then[k]!r} then, {now[k]!r} now" for k in changed)
                raise ValueError(f"{out}: variant {v.name!r} was evaluated with other resolved parameters ({what}: "
                                 "the method's defaults changed); resuming would pool two models under one name: "
                                 "use another output folder, name the parameters in the spec, or --no-resume")


def _check_same_engine(out: Path, engine: str, resume: bool) -> None:
    """A resumed folder holds one engine's records: mixing transformers and vLLM numbers would compare engines,
    not variants. run.json's `engine` starts with the engine's name (its label: 'vLLM 0.32.0 ...')."""
    from ..engines.runs import REFERENCE

    if not resume or not (out / RUN_FILE).is_file() or not read_results(out):
        return
    previous = json.loads((out / RUN_FILE).read_text()).get("engine") or REFERENCE
    if previous.split()[0].lower() != engine:
        raise ValueError(f"{out} holds an evaluation run with {previous}; --engine {engine} needs another output "
                         "folder (or --no-resume to start over)")


def run_jobs(jobs: list[Job], load: Callable[[Variant], Evaluator], original: int,
             record: Callable[[dict], None], progress: bool = True) -> None:
    """Execute *jobs* in order, loading a variant's model when the variant changes; every record goes to
    ``record`` as soon as its job finishes (the patch report rides on a variant's first record of the run)."""
    lines = LineProgress(jobs) if progress and not _is_terminal(sys.stderr) else None
    prog = _progress(progress and lines is None)  # the rich bar draws only on a terminal
    with prog:
        task = prog.add_task("evaluating", total=sum(j.cost() for j in jobs) or 1.0)
        current, ev, reported = None, None, set()
        for job in jobs:
            v = job.variant
            if current is not v:
                prog.update(task, description=f"{v.name}: loading")
                if lines:
                    lines.loading(v.name)
                ev = None
                gc.collect()
                ev, current = load(v), v
            prog.update(task, description=f"{v.name}: {job.cases[-1].case_id}")
            report = None if v.name in reported else ev.patch_report
            reported.add(v.name)
            started = time.perf_counter()
            for rec in execute_job(ev, job, original, report):
                record(rec)
            prog.advance(task, job.cost())
            if lines:
                lines.finished(job, time.perf_counter() - started)
        ev = None
        gc.collect()
        prog.update(task, description="done")


def execute_job(ev: Evaluator, job: Job, original: int, patch_report=None) -> list[dict]:
    """Run one job and return its records (one per case; a shared forward's time is split evenly)."""
    t0 = time.perf_counter()
    metrics = ev.run(job)
    seconds = round((time.perf_counter() - t0) / len(job.cases), 3)
    finished = datetime.now(timezone.utc).isoformat(timespec="seconds")
    v = job.variant
    records = []
    for case, m in zip(job.cases, metrics):
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
            **({"haystack": case.haystack} if case.is_probe else {}),
            "metrics": m,
            "seconds": seconds,
            "finished_at": finished,
        }
        if len(job.cases) > 1:
            rec["shared_forward"] = job.length
        if patch_report is not None and not records:
            rec["patch_report"] = _jsonable(patch_report)
        records.append(rec)
    return records


def _run_meta(model_path, original: int, suite: Suite, variants: list[Variant], dtype, device_map) -> dict:
    return {
        "model_path": str(model_path),
        "original_length": original,
        "suite": suite.to_dict(),
        "suite_source": suite.source,
        "variants": [{"name": v.name, "spec": v.spec_dict(), "fingerprint": v.fingerprint} for v in variants],
        "dtype": dtype,
        "device_map": device_map,
    }


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


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class LineProgress:
    """Progress where stderr is not a terminal (a log file, CI, `nohup`, a cluster job): one line per finished job
    (a job is one forward or one shared-prefix group of prompts; it writes one record per case) with its time, the
    elapsed time and an ETA from the planned cost still to run, and one line when a variant's model is loaded."""

    def __init__(self, jobs: list[Job], stream=None):
        self.stream = stream
        self.total_jobs, self.total_cost = len(jobs), sum(j.cost() for j in jobs) or 1.0
        self.done_jobs, self.done_cost, self.started = 0, 0.0, time.perf_counter()

    def _print(self, message: str) -> None:
        print(f"rope-extend: eval {message}", file=self.stream or sys.stderr, flush=True)

    def loading(self, variant: str) -> None:
        self._print(f"[{self.done_jobs}/{self.total_jobs}] loading {variant} "
                    f"({fmt_clock(time.perf_counter() - self.started)} elapsed)")

    def finished(self, job: Job, seconds: float) -> None:
        self.done_jobs += 1
        self.done_cost += job.cost()
        elapsed = time.perf_counter() - self.started
        eta = elapsed / self.done_cost * max(0.0, self.total_cost - self.done_cost)
        cases = job.cases[0].case_id + (f" +{len(job.cases) - 1} cases" if len(job.cases) > 1 else "")
        self._print(f"[{self.done_jobs}/{self.total_jobs}] {job.variant.name}: {cases} ({seconds:.1f} s; "
                    f"{fmt_clock(elapsed)} elapsed, ETA {fmt_clock(eta)})")


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


def rebuild_report(out_dir: str | os.PathLike, plots: bool = True, compare=(), compare_variants=()) -> Path:
    """Rewrite ``report.md`` (and the plots) of *out_dir* from its ``results.jsonl`` and ``run.json``: for a run
    still in progress or stopped early (the header then says how many cases are missing). The plots also draw the
    records of the *compare* folders on the same cases (see :func:`compare_records`)."""
    out = Path(out_dir)
    meta, records = run_records(out)
    before = compare_records(records, compare, compare_variants)
    return write_outputs(records, out, plots=plots, meta=meta, plot_records=before + records if before else None)


def compare_records(records: list[dict], folders, variants=()) -> list[dict]:
    """The records of eval *folders* (in their runs' variant order) on the cases *records* ran, for variants
    *records* lacks (only *variants* when given), each variant and case once, marked with their ``source``
    folder: e.g. the base model's eval as the "before" of a trained checkpoint's."""
    cases = {r["case_id"] for r in records}
    own = {r["variant"] for r in records}
    seen, out = set(), []
    for folder in folders:
        theirs = run_records(folder)[1] if (Path(folder) / RUN_FILE).is_file() else read_results(folder)
        if not theirs:
            raise FileNotFoundError(f"{folder} has no {RESULTS_FILE}: --compare takes an eval output folder")
        for r in theirs:
            key = (r["variant"], r["case_id"])
            if r["case_id"] in cases and r["variant"] not in own and (not variants or r["variant"] in variants) \
                    and key not in seen:
                seen.add(key)
                out.append({**r, "source": str(folder)})
    return out


def write_outputs(records: list[dict], out: Path, plots: bool = True, meta: dict | None = None,
                  plot_records: list[dict] | None = None) -> Path:
    """report.md and, with `plots`, the PNGs it links (drawn first, so the report names only files that exist),
    from *plot_records* when given (the report's records with others beside them). A plot that fails is left out:
    the report is written from the records all the same, names it, and a warning line says so."""
    from .plots import make_plots
    from .report import write_report

    failed: dict[str, str] = {}
    images = make_plots(records if plot_records is None else plot_records, out, failed) if plots else {}
    path = write_report(records, out, images=images, meta=meta, failed_plots=failed)
    for title, why in failed.items():
        print(f"rope-extend: warning: plot {title!r} could not be drawn ({why}); {path} was written without it",
              file=sys.stderr, flush=True)
    return path


def run_records(out_dir: str | os.PathLike) -> tuple[dict, list[dict]]:
    """``(run.json, the records of that run's variants in its variant order)`` of an eval output folder."""
    out = Path(out_dir)
    if not (out / RUN_FILE).is_file():
        raise FileNotFoundError(f"{out / RUN_FILE} not found: {out} is not a rope-extend eval output folder")
    meta = json.loads((out / RUN_FILE).read_text())
    order = {(v["name"], v["fingerprint"]): i for i, v in enumerate(meta.get("variants", []))}
    records = [r for r in read_results(out) if (r["variant"], r.get("fingerprint")) in order]
    records.sort(key=lambda r: order[(r["variant"], r.get("fingerprint"))])
    return meta, records


def summary_markdown(results) -> str:
    """Compact markdown tables (perplexity, passkey, needle) for model cards.

    *results*: records from :func:`run_eval`, a ``results.jsonl`` path, or an output directory.
    """
    from .report import summary_tables

    if isinstance(results, (str, os.PathLike)):
        results = read_results(results)
    return summary_tables(list(results))
