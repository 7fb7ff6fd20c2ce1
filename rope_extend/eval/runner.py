"""Before/after evaluation runner: the unpatched model and each RoPE spec, side by side.

Results are appended to ``<out_dir>/results.jsonl`` one line per finished case (flushed and
fsynced), so a killed run loses at most the case in flight; rerunning with the same
``out_dir`` skips every finished case.  A case is identified by
``(variant name, spec fingerprint, case_id)``: changing a variant's spec recomputes it.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

from ..flags import LoadOptions
from ..formatting import fmt_clock
from ..outputs import EVAL_RUN_FILE, check_replaceable
from ..terminal import KEEP, shell_path, wrap
from .cpu_threads import CpuThreads
from .jobs import Evaluator, Job, plan_jobs
from .options import EvalOptions
from .suite import Suite, load_suite
from .texts import check_text
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


def say(message: str, prefix: str = "rope-extend: eval ") -> None:
    """*message* on stderr after *prefix*, wrapped between words at the terminal's width (80 columns when stderr is
    not a terminal, or $COLUMNS), continuation lines under the prefix: a value joined by `terminal.KEEP` (a time
    and its unit, a variant's name) is never cut."""
    import shutil

    width = shutil.get_terminal_size((80, 24)).columns
    lines = wrap(prefix + message, width, hang=" " * min(len(prefix) + 2, width // 3))
    print("\n".join(lines), file=sys.stderr, flush=True)


def _word(text: str) -> str:
    """*text* as one word for `wrap` (its spaces kept, never a line break)."""
    return str(text).replace(" ", KEEP)


def check_dtype(dtype) -> None:
    """ValueError naming the choices for a --dtype `load_model` cannot load weights in (the names of
    `memory.DTYPE_BYTES`, and auto; a torch dtype passes), in `memory.load_dtype`'s words, before torch loads."""
    from ..memory import DTYPE_BYTES

    if isinstance(dtype, str) and dtype != "auto" and dtype not in DTYPE_BYTES:
        raise ValueError(f"--dtype {dtype!r} is not a dtype to load weights in; use one of auto, "
                         f"{', '.join(DTYPE_BYTES)}")


def say_resumed(out: Path, model: str, suite: Suite, variants, engine: str) -> None:
    """At once, before anything heavy loads: how many of this run's cases OUT's results.jsonl holds already ("16 of
    16 cases done"), when OUT is an earlier run of the same model with the same engine (its run.json gives the
    window the cases are laid out from)."""
    from .variants import applies

    try:
        meta = json.loads((out / RUN_FILE).read_text())
    except (OSError, ValueError):
        return
    if meta.get("model_path") != model or not meta.get("original_length") or meta.get("left_out"):
        return  # another model, or an engine's run that left cases out (counted once it is planned)
    if str(meta.get("engine") or engine).split()[0].lower() != engine:
        return  # another engine's run: refused once the engines are imported (`_check_same_engine`)
    cases = suite.cases(int(meta["original_length"]))
    wanted = {(v.name, v.fingerprint, c.case_id) for v in variants for c in cases if applies(c, v)}
    done = len(wanted & {_key(r) for r in read_results(out)})
    if not done:
        return
    where = shell_path(out / RESULTS_FILE)
    if done == len(wanted):
        say(f"{done} of {len(wanted)} cases done in {where}: nothing to run, rewriting the report")
    else:
        say(f"resuming: {done} of {len(wanted)} cases done in {where}")


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


def check_memory(name: str, folder: Path, config, cases: list, load: LoadOptions, skip: bool = False) -> None:
    """Refuse in one line, before any weights load as `load` says, a run whose longest pending case needs more
    memory than the device has (`rope_extend.memory`): the probes decode with a key/value cache, entropy holds one
    layer's attention probabilities."""
    from .. import memory

    if not cases:
        return
    entropy = [c.length for c in cases if c.kind == "entropy"]
    ways = memory.WaysOut(length="--suite SUITE.yaml with lengths up to ~{fits} tokens")
    memory.check_inference(name, folder, config, load.dtype, max(c.length for c in cases),
                           kv_cache=any(c.is_probe for c in cases), scores_length=max(entropy, default=0),
                           device=load.device, device_map=load.device_map, ways=ways, skip=skip)


def run_eval(
    model_path: str | os.PathLike,
    specs: list | dict | None = None,
    suite: str | os.PathLike | dict | Suite = "quick",
    out_dir: str | os.PathLike = "eval-out",
    options: EvalOptions | None = None,
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
        options: how it runs (`eval.options.EvalOptions`: how the weights load, the texts, the baseline, resuming,
            plots, the engine...; the defaults when None).

    Returns:
        All records for this run's variants (resumed + new), in suite order.
    """
    options = options or EvalOptions()
    out = Path(out_dir)
    suite_obj, variants = _check_arguments(out, suite, specs, options)  # before torch loads: one line at once
    if options.progress and options.resume:
        say_resumed(out, str(model_path), suite_obj, variants, options.engine)
    engine = _run_engine(out, options)
    model = _read_model(model_path, variants, options.loader)
    cases = suite_obj.cases(model.original)
    serving = {} if engine is None else _plan_serving(engine, model, variants, cases, suite_obj.seed, options)
    excluded = frozenset((name, case_id) for name, s in serving.items() for case_id in s.left_out)
    done = {_key(r): r for r in read_results(out / RESULTS_FILE)} if options.resume else {}
    _check_resumed_plans(out, done, variants, model.plans)
    jobs = plan_jobs(cases, variants, set(done), share=options.share, interleave=options.interleave,
                     excluded=excluded)
    _check_before_loading(str(model_path), model, jobs, engine, options)
    meta = _start_output(out, model_path, model, suite_obj, variants, cases, serving, engine, options)
    if jobs:
        pending = {c.case_id: c for j in jobs for c in j.cases}
        Evaluator(None, model.loaded_tokenizer(), model.original, suite_obj.seed).preflight(list(pending.values()))
    load = _load_in_process(model, suite_obj.seed, options) if engine is None else \
        _EngineLoader(engine, model, serving, suite_obj.seed, options)
    _evaluate(jobs, load, model.original, done, out, options, in_process=engine is None)
    if engine is not None and load.worker is not None:
        meta["engine"] = load.worker.label(engine.eval_route)
        (out / RUN_FILE).write_text(json.dumps(meta, indent=2, default=str))
    records = [done[k] for v in variants for c in cases if (k := (v.name, v.fingerprint, c.case_id)) in done]
    write_outputs(records, out, plots=options.plots, meta=meta)
    return records


@dataclass
class EvalModel:
    """The model a run evaluates, read once before any weights load: SOURCE's folder and config (None with a custom
    `loader`), the window the suite's lengths count from, each spec variant's plan on that config (by name), and its
    tokenizer (loaded when first needed)."""

    folder: Path | None
    config: Any
    window: Window
    plans: dict[str, Any]
    tokenizer: Any = None

    @property
    def original(self) -> int:
        """What every length, label and ceiling counts from (the records' `original_length`)."""
        return self.window.length

    def loaded_tokenizer(self):
        if self.tokenizer is None:
            self.tokenizer = _tokenizer(self.folder)
        return self.tokenizer


def _check_arguments(out: Path, suite, specs, options: EvalOptions) -> tuple[Suite, list[Variant]]:
    """What can be checked without torch or transformers, first (a bad argument is one line at once, issue 66): the
    output folder (a new or empty folder, or an eval output, resumed: never a user's folder), the dtype, the suite
    and its texts; then the variants."""
    check_replaceable(out, "eval")
    check_dtype(options.dtype)
    suite_obj = load_suite(suite)
    if options.text is not None:
        suite_obj = suite_obj.with_texts(options.text)
    for name in suite_obj.texts():
        check_text(name)
    return suite_obj, make_variants(specs, include_baseline=options.include_baseline)


def _run_engine(out: Path, options: EvalOptions):
    """The run engine's adapter (None: the reference, transformers in this process), its arguments checked, and OUT
    holding no other engine's records."""
    from ..engines.runs import REFERENCE, check_engine_args, lookup

    engine = lookup(options.engine)
    check_engine_args(options.engine_args.given(), options.engine)
    if engine is not None and (options.loader is not None or options.device_map or options.device
                               or options.dtype != "float32"):
        raise ValueError(f"--engine {options.engine}: the model is served by {engine.title} in float32 (--dtype, "
                         f"--device, --device-map and a custom loader apply to {REFERENCE})")
    _check_same_engine(out, options.engine, options.resume)
    return engine


def _read_model(model_path, variants: list[Variant], loader) -> EvalModel:
    """SOURCE (a folder, a Hub id through the Hub cache, or an alias: as `patch` resolves it) and each spec planned
    once (or its plan given) on its config, before any weights load: a spec the model refuses (a shipped scheme
    without replace_existing...) is one line now. With a custom `loader`: the window and tokenizer of its model."""
    if loader is not None:
        loaded_model, tokenizer = loader()
        window = model_window(loaded_model.config)
        del loaded_model
        return EvalModel(None, None, window, {}, tokenizer)
    from ..source import load_source

    loaded = load_source(model_path)
    plans = {v.name: v.plan if v.plan is not None else _plan(loaded, v.rope_spec())
             for v in variants if v.spec is not None and not callable(v.spec)}
    return EvalModel(loaded.folder, loaded.config, config_window(loaded), plans)


def _plan_serving(engine, model: EvalModel, variants: list[Variant], cases: list, seed: int,
                  options: EvalOptions) -> dict:
    """How the run engine serves each variant (`backends.EngineServing`, by name), planned once before anything
    loads (`backends.plan_engine`): a variant it does not serve identically is refused; the cases it leaves out
    are said."""
    from .backends import plan_engine

    sampler = Evaluator(None, model.loaded_tokenizer(), model.original, seed)
    serving = plan_engine(engine, model.folder, variants, model.plans,
                          {v.name: [c for c in cases if applies(c, v)] for v in variants},
                          lambda c: sampler.probe(c).max_new_tokens)
    for name, s in serving.items():
        if s.left_out and options.progress:
            say(f"{len(s.left_out)} case(s) of {_word(name)} left out: {s.why}",
                f"rope-extend: eval --engine {options.engine}: ")
    return serving


def _check_before_loading(name: str, model: EvalModel, jobs: list[Job], engine, options: EvalOptions) -> None:
    """Before OUT appears, for the variants that run: each plan checked as `patch_model` checks it (stock
    transformers rebuilds it, a forward runs), the memory the longest case needs (transformers' estimate: a run
    engine sizes its own KV cache at start), and the tokenizer loaded (a model without one is one line)."""
    if options.loader is not None:
        return
    from .. import compat
    from ..patch import verify_or_explain

    for variant in dict.fromkeys(j.variant.name for j in jobs):  # only a variant that runs is checked, once
        if variant in model.plans and model.plans[variant].changed:
            verify_or_explain(model.plans[variant], model.config)
    check_memory(name, model.folder, compat.text_config(model.config), [c for j in jobs for c in j.cases], options,
                 skip=not options.memory_check or engine is not None)
    if jobs:
        model.loaded_tokenizer()


def _start_output(out: Path, model_path, model: EvalModel, suite: Suite, variants: list[Variant], cases: list,
                  serving: dict, engine, options: EvalOptions) -> dict:
    """OUT created (only now: a bad suite, spec, model or size leaves no empty folder), a fresh run's earlier
    results.jsonl kept as a .bak, and run.json written (what the report and a resumed run read); returns it."""
    out.mkdir(parents=True, exist_ok=True)
    if not options.resume and (out / RESULTS_FILE).exists():
        (out / RESULTS_FILE).rename(out / f"results.{int(time.time())}.jsonl.bak")
    excluded = {(name, case_id) for name, s in serving.items() for case_id in s.left_out}
    meta = _run_meta(model_path, model.original, suite, variants, options.dtype, options.device_map)
    if model.window.pre_scaling is not None:
        meta.update(pre_scaling_length=model.window.pre_scaling, shipped_scheme=model.window.scheme)
    meta["device"] = None if options.device_map else (options.device or "cpu")
    meta["expected_records"] = sum(applies(c, v) and (v.name, c.case_id) not in excluded
                                   for c in cases for v in variants)
    if engine is None:
        from ..engines.runs import REFERENCE

        meta["engine"] = f"{REFERENCE} {_transformers_version()}"
    else:
        meta["engine"] = options.engine
        meta["left_out"] = {name: f"{len(s.left_out)} case(s): {s.why}" for name, s in serving.items() if s.left_out}
    (out / RUN_FILE).write_text(json.dumps(meta, indent=2, default=str))
    return meta


def _load_in_process(model: EvalModel, seed: int, options: EvalOptions) -> Callable[[Variant], Evaluator]:
    """A variant's evaluator in this process: the model loaded (`variants.load_model`, or the custom loader) and
    patched with the plan made before loading from the same SOURCE (or with its spec: a callable, or a custom
    loader's model)."""

    def load(v: Variant) -> Evaluator:
        loaded, tok = options.loader() if options.loader is not None else load_model(
            model.folder, dtype=options.dtype, device_map=options.device_map, device=options.device)
        ev = Evaluator(loaded, tok, model.original, seed)
        if v.name in model.plans:
            from ..patch import apply_patch

            ev.patch_report = apply_patch(loaded, model.plans[v.name])
        else:
            ev.patch_report = apply_spec(loaded, v.spec)
        return ev

    return load


class _EngineLoader:
    """A variant's evaluator in a run engine: served by its worker with the settings planned before loading. The
    worker is opened on the first variant, unless the caller gave one (which the caller then closes)."""

    def __init__(self, engine, model: EvalModel, serving: dict, seed: int, options: EvalOptions):
        self.engine, self.model, self.serving, self.seed = engine, model, serving, seed
        self.worker, self.owned = options.worker, options.worker is None
        self.engine_args = options.engine_args.given() or None

    def __call__(self, v: Variant) -> Evaluator:
        from .backends import EngineBackend

        if self.worker is None:
            self.worker = self.engine.open()
        settings = self.serving[v.name].settings
        route = self.engine.eval_route
        self.engine.load(self.worker, self.model.folder, settings, route=route, engine_args=self.engine_args)
        tok = self.model.tokenizer
        ev = Evaluator(None, tok, self.model.original, self.seed, backend=EngineBackend(self.worker, tok))
        ev.patch_report = {"engine": self.worker.label(route), **self.engine.describe(settings)}
        return ev

    def close(self, now: bool = False) -> None:
        if self.owned and self.worker is not None:
            self.worker.close(now=now)


def _evaluate(jobs: list[Job], load: Callable[[Variant], Evaluator], original: int, done: dict, out: Path,
              options: EvalOptions, in_process: bool) -> None:
    """Run the jobs (`run_jobs`), each record appended to results.jsonl as it finishes and kept in `done`; a model
    on this process's CPU gets torch's threads fitted to the load before each job. A run engine's worker is stopped
    at the end, at once on an interrupt or a failure."""

    def record(rec: dict) -> None:
        _append(out / RESULTS_FILE, rec)
        done[_key(rec)] = rec
        if options.on_record is not None:
            options.on_record(rec)

    cpu = in_process and options.device_map is None and (options.device or "cpu") == "cpu"
    threads = CpuThreads() if cpu and jobs else None
    close = getattr(load, "close", lambda now=False: None)
    try:
        with threads or contextlib.nullcontext():
            run_jobs(jobs, load, original, record, options.progress, threads)
    except BaseException:  # an interrupt or a failure: the engine is stopped at once
        close(now=True)
        raise
    close()


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
             record: Callable[[dict], None], progress: bool = True, threads: CpuThreads | None = None) -> None:
    """Execute *jobs* in order, loading a variant's model when the variant changes; every record goes to
    ``record`` as soon as its job finishes (the patch report rides on a variant's first record of the run).
    *threads*: fits torch's CPU threads to the machine's load before each job (`cpu_threads`)."""
    lines = LineProgress(jobs) if progress and not _is_terminal(sys.stderr) else None
    prog = progress_bar(progress and lines is None, max(len(j.variant.name) for j in jobs) if jobs else 0)
    with prog:  # (the rich bar draws only on a terminal)
        task = prog.add_task("evaluating", total=sum(j.cost() for j in jobs) or 1.0, case="")
        current, ev, reported, said = None, None, set(), None
        for job in jobs:
            v = job.variant
            if current is not v:
                prog.update(task, description=f"{v.name}: loading", case="")
                if lines:
                    lines.loading(v.name)
                ev = None
                gc.collect()
                ev, current = load(v), v
            prog.update(task, description=v.name, case=job.cases[-1].case_id)
            report = None if v.name in reported else ev.patch_report
            reported.add(v.name)
            if threads is not None:
                threads.fit()
                if lines and threads.describe() != said:
                    said = threads.describe()
                    lines.note(said)
            started = time.perf_counter()
            for rec in execute_job(ev, job, original, report):
                record(rec)
            prog.advance(task, job.cost())
            if lines:
                lines.finished(job, time.perf_counter() - started)
        ev = None
        gc.collect()
        prog.update(task, description="done", case="")


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
    elapsed time and an ETA from the planned cost still to run, and one line when a variant's model is loaded. Each
    is wrapped between values at the terminal's width (`say`), continuation lines indented under the prefix."""

    def __init__(self, jobs: list[Job], stream=None):
        self.stream = stream
        self.total_jobs, self.total_cost = len(jobs), sum(j.cost() for j in jobs) or 1.0
        self.done_jobs, self.done_cost, self.started = 0, 0.0, time.perf_counter()

    def _print(self, message: str) -> None:
        if self.stream is None:
            say(message)
        else:
            print(f"rope-extend: eval {message.replace(KEEP, ' ')}", file=self.stream, flush=True)

    def loading(self, variant: str) -> None:
        self._print(f"[{self.done_jobs}/{self.total_jobs}] loading {_word(variant)} "
                    f"({fmt_clock(time.perf_counter() - self.started)}{KEEP}elapsed)")

    def note(self, message: str) -> None:
        self._print(message)

    def finished(self, job: Job, seconds: float) -> None:
        self.done_jobs += 1
        self.done_cost += job.cost()
        elapsed = time.perf_counter() - self.started
        eta = elapsed / self.done_cost * max(0.0, self.total_cost - self.done_cost)
        cases = job.cases[0].case_id + (f" +{len(job.cases) - 1}{KEEP}cases" if len(job.cases) > 1 else "")
        self._print(f"[{self.done_jobs}/{self.total_jobs}] {_word(job.variant.name)}: {cases} ({seconds:.1f}{KEEP}s; "
                    f"{fmt_clock(elapsed)}{KEEP}elapsed, ETA{KEEP}{fmt_clock(eta)})")


WIDE = 110  # a terminal this wide shows the running case beside the bar


def progress_bar(enabled: bool, name_width: int = 0, console=None):
    """The rich bar on a terminal: the variant, a bar where there is room, the share done, the elapsed time and the
    ETA, each column whole at any width from 60 columns (the running case too where the terminal is `WIDE`).
    *console*: rich's Console to draw on (default: stderr's)."""
    import shutil

    from rich.progress import (
        BarColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    width = console.width if console is not None else shutil.get_terminal_size((80, 24)).columns
    fixed = name_width + len(": loading") + 30  # the name, " 100%", "0:00:00", "ETA", "0:00:00" and the gaps
    columns = [TextColumn("[bold]{task.description}")]
    if width - fixed >= 12:
        columns.append(BarColumn(bar_width=min(40, width - fixed - 2)))
    columns += [TaskProgressColumn(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn()]
    if width >= WIDE:
        columns.append(TextColumn("{task.fields[case]}"))
    return Progress(*columns, disable=not enabled, console=console)


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
        theirs = run_records(folder).records if (Path(folder) / RUN_FILE).is_file() else read_results(folder)
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
        say(f"plot {title!r} could not be drawn ({why}); {shell_path(path)} was written without it", "rope-extend: warning: ")
    return path


class RunRecords(NamedTuple):
    """An eval output folder's run.json (`meta`) and the records of that run's variants, in its variant order."""

    meta: dict
    records: list[dict]


def run_records(out_dir: str | os.PathLike) -> RunRecords:
    """``(run.json, the records of that run's variants in its variant order)`` of an eval output folder."""
    out = Path(out_dir)
    if not (out / RUN_FILE).is_file():
        raise FileNotFoundError(f"{out / RUN_FILE} not found: {out} is not a rope-extend eval output folder")
    meta = json.loads((out / RUN_FILE).read_text())
    order = {(v["name"], v["fingerprint"]): i for i, v in enumerate(meta.get("variants", []))}
    records = [r for r in read_results(out) if (r["variant"], r.get("fingerprint")) in order]
    records.sort(key=lambda r: order[(r["variant"], r.get("fingerprint"))])
    return RunRecords(meta, records)


def summary_markdown(results) -> str:
    """Compact markdown tables (perplexity, passkey, needle) for model cards.

    *results*: records from :func:`run_eval`, a ``results.jsonl`` path, or an output directory.
    """
    from .report import summary_tables

    if isinstance(results, (str, os.PathLike)):
        results = read_results(results)
    return summary_tables(list(results))
