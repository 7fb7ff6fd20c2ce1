"""The parity report: does each engine serve a checkpoint with exactly rope-extend's RoPE?

For a checkpoint written by rope-extend (or SOURCE + spec, planned in memory), every route a user can take --
transformers 4.x / 5.x loading config.json, vLLM and SGLang serving it (or the original model with the printed
overrides), llama.cpp running the original GGUF with the printed flags or a GGUF converted from it -- is run through
that engine's RoPE (the real library for transformers, a version-pinned port otherwise) for a short request (L
tokens, all positions below the original length) and a long one (the target length). Each is compared with
rope-extend's own cos/sin, magnitude included: max |Δcos|, |Δsin|, or the exact reason the engine cannot serve it.
The commands checked are the ones `rope_extend.engines.serving` prints, so the hints are tested by construction.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import compat
from ..facts import decode_slots
from ..plan import PatchPlan
from ..spec import RopeSpec, load_spec
from .hint import EngineHint
from .registry import get_engine, ported_engines, serving_engines
from .run_engine import RunEngine
from .runs import (
    LOGPROB_TOL,
    MEAN_TOL,
    LogprobDelta,
    RunProgress,
    Workers,
    linked_folder,
    resolve_runs,
    serve_and_compare,
)
from .served import Delta, NotServed, Unchecked, compare, own_rope
from .transformers import probes

Result = Delta | LogprobDelta | NotServed  # cos/sin of a library or port, prompt log-probabilities of a real engine
PORT, RUN, NOT_RUN, UNCHECKED = "port", "run", "not run", "unchecked"

if TYPE_CHECKING:
    from .serving import ServingHints


@dataclass
class Row:
    """One serving route of one engine, compared for the short and the long request.

    kind: how the row checks the route: "port" (rope-extend's port of the engine's RoPE, cos/sin compared) or "run"
    (the engine itself: the installed transformers' rotary module, cos/sin compared; or a run engine (`engines.runs`)
    serving the checkpoint, prompt log-probabilities compared with transformers running rope-extend's RoPE).
    `label` says what was done: `kind`, "not run" where a request was not run, or "unchecked"."""

    engine: str  # the engine as a user names it, with its version (and, for a real engine, its device and route)
    route: str  # how the checkpoint reaches it
    short: Result
    long: Result
    warnings: list[str] = field(default_factory=list)  # the hint's warnings for this engine
    kind: str = PORT
    serves: tuple[str, str] | None = None  # the card line the row checks: (the engine's title, `hint.COMMAND` or `hint.ORIGINAL`)
    version: str | None = None  # the engine's version (a port: the source version it follows)
    device: str | None = None  # where it computed (a port: none, rope-extend's numpy copy)
    served_by_engine: bool = False  # a run engine served the checkpoint (its log-probabilities are the evidence)

    @property
    def identical(self) -> bool:
        return all(not isinstance(r, NotServed) and r.identical for r in (self.short, self.long))

    @property
    def differs(self) -> bool:
        """Measured or computed otherwise than rope-extend (not merely not run or unchecked)."""
        return not self.identical and not self.skipped and not self.unchecked

    @property
    def skipped(self) -> bool:
        return any(isinstance(r, NotServed) and r.reason.startswith("not run") for r in (self.short, self.long))

    @property
    def unchecked(self) -> bool:
        """The engine's rules do not cover this checkpoint (`served.Unchecked`): never identical, never "differs"."""
        return any(isinstance(r, Unchecked) for r in (self.short, self.long))

    @property
    def label(self) -> str:
        """What was done: "port", "run", "not run" (a request was not run: "run" never stands on such a row), or
        "unchecked" (the engine's rules do not cover the checkpoint)."""
        return UNCHECKED if self.unchecked else NOT_RUN if self.skipped else self.kind

    def evidence(self) -> dict[str, Any]:
        """The row's measurement over its served requests: the largest |Δ logprob| (max, mean) of a run engine, the
        largest |Δcos|, |Δsin| otherwise; None where no request was served."""
        served = [r for r in (self.short, self.long) if not isinstance(r, NotServed)]
        if self.served_by_engine:
            return {"measure": "prompt log-probability against transformers running rope-extend's RoPE",
                    "max_abs_dlogprob": max((r.max_abs for r in served), default=None),
                    "mean_abs_dlogprob": max((r.mean_abs for r in served), default=None)}
        return {"measure": "cos/sin against rope-extend's RoPE",
                "max_abs_dcos": max((r.max_cos for r in served), default=None),
                "max_abs_dsin": max((r.max_sin for r in served), default=None)}

    def reasons(self) -> list[str]:
        out = []
        for label, result in (("short", self.short), ("long", self.long)):
            if isinstance(result, NotServed):
                out.append(f"{label} request: {result.reason}")
            elif isinstance(result, LogprobDelta):
                if not result.identical:
                    out.append(f"{label} request ({result.n} tokens): {result.describe()}")
            elif not result.identical:
                out.append(
                    f"{label} request ({result.n} tokens): max |Δcos| {result.max_cos:.3g}, |Δsin| "
                    f"{result.max_sin:.3g} (worst at rotary frequency {result.worst_dim})"
                )
        return out

    def to_dict(self) -> dict[str, Any]:
        def one(result):
            if isinstance(result, NotServed):
                return {"served": False, "reason": result.reason}
            if isinstance(result, LogprobDelta):
                return {"served": True, "tokens": result.n, "max_abs_dlogprob": result.max_abs,
                        "mean_abs_dlogprob": result.mean_abs, "mean_dlogprob": result.mean, "nan": result.nan,
                        "first_nan": result.first_nan, "identical": result.identical}
            return {
                "served": True,
                "tokens": result.n,
                "max_abs_dcos": result.max_cos,
                "max_abs_dsin": result.max_sin,
                "identical": result.identical,
            }

        return {
            "engine": self.engine,
            "route": self.route,
            "kind": self.kind,
            "label": self.label,
            "version": self.version,
            "device": self.device,
            "identical": self.identical,
            "evidence": self.evidence(),
            "short": one(self.short),
            "long": one(self.long),
            "reasons": self.reasons(),
            "warnings": self.warnings,
        }


@dataclass
class ParityReport:
    method: str
    factor: float
    original: int
    target: int
    rows: list[Row]
    hints: list[EngineHint]
    long: int | None = None  # the long request's tokens where not the target length (`--long-tokens`)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "factor": self.factor,
            "original_max_position_embeddings": self.original,
            "target_length": self.target,
            "short_tokens": self.original,
            "long_tokens": self.long or self.target,
            "rows": [row.to_dict() for row in self.rows],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def markdown(self) -> str:
        """The model-card section: "serves identically in: ..."; "differs in: ... because ..."; the table."""
        same = [f"{r.engine} ({r.route})" for r in self.rows if r.identical]
        differs = [r for r in self.rows if r.differs]
        unchecked = list(dict.fromkeys(f"{r.engine}: {_reason(r)}" for r in self.rows if r.unchecked))
        lines = [f"Serves identically (max |Δcos|, |Δsin| within float32 tolerance) in: {', '.join(same) or 'none'}.",
                 "", ports_note(self.rows)]
        if unchecked:
            lines += ["", "Unchecked (the engine's rules here do not cover this checkpoint; not known to serve it "
                      "identically):", *(f"- {line}" for line in unchecked)]
        if differs:
            lines.append("")
            lines.append("Differs in:")
            for row in differs:
                because = "; ".join(row.warnings or row.reasons())
                lines.append(f"- {row.engine} ({row.route}), because {because}")
        lines += [
            "",
            f"| engine | route | checked | short request ({self.original} tokens) | long request "
            f"({self.long or self.target} tokens) |",
            "|---|---|---|---|---|",
        ]
        for row in self.rows:
            lines.append(f"| {row.engine} | {row.route} | {row.label} | {cell_text(row.short)} | {cell_text(row.long)} |")
        return "\n".join(lines)

    def contradictions(self) -> list[str]:
        """Where a run engine measured otherwise what the card lists as identical: a request its port row (the same
        serving line) says is served identically, and the engine's run of it is not identical (it differs, gives NaN,
        or the engine refused it). One line each; what `rope-extend engines` exits 3 on."""
        claims = {row.serves: row for row in self.rows if row.kind == PORT and row.serves}
        out = []
        for row in self.rows:
            port = claims.get(row.serves)
            if not row.served_by_engine or port is None:
                continue
            for request, said, got in (("short", port.short, row.short), ("long", port.long, row.long)):
                if isinstance(said, NotServed) or not said.identical:
                    continue  # the card does not claim it
                if isinstance(got, NotServed) and got.reason.startswith("not run"):
                    continue  # not measured
                if isinstance(got, NotServed):
                    out.append(f"{row.engine} ({row.route}), {request} request: the card says identical; {got.reason}")
                elif not got.identical:
                    out.append(f"{row.engine} ({row.route}), {request} request ({got.n} tokens): the card says "
                               f"identical; measured {got.describe()}")
        return out


def ports_note(rows: Sequence[Row] = ()) -> str:
    """What the engine rows run, said wherever a row claims "identical" (the card, `rope-extend engines`)."""
    ported = ported_engines()
    titles = [engine.title for engine in ported]
    names = titles[0] if len(titles) == 1 else ", ".join(titles[:-1]) + " and " + titles[-1]
    text = (f"The transformers rows run the installed transformers. The {names} rows run rope-extend's ports of "
            f"those engines' RoPE code ({', '.join(engine.version for engine in ported)}; rope_extend/engines/), not "
            "the engines themselves")
    if not any(row.served_by_engine and row.label == RUN for row in rows):
        return text + "."
    return text + (", except the rows marked run: those served the checkpoint in that engine with the printed "
                   "command's settings and compared the log-probability of every prompt token with transformers "
                   f"running rope-extend's RoPE (identical: no NaN, |Δ logprob| <= {LOGPROB_TOL:g} for every token "
                   f"and <= {MEAN_TOL:g} on average).")


def _reason(row: Row) -> str:
    result = row.short if isinstance(row.short, NotServed) else row.long
    return result.reason if isinstance(result, NotServed) else ""


def cell_text(result: Result) -> str:
    """One request's outcome in a few words: the deltas, or why it was not served."""
    if isinstance(result, Unchecked):
        return "unchecked: " + result.reason.replace("|", "/")
    if isinstance(result, NotServed):
        text = result.reason.replace("|", "/")
        return ("not run: " if text.startswith("not run") else "cannot: ") + text.removeprefix("not run: ")
    mark = "identical" if result.identical else "DIFFERS"
    if isinstance(result, LogprobDelta):
        nan = f", NaN from token {result.first_nan}" if result.nan else ""
        return f"{mark} (Δlogprob max {result.max_abs:.2g}, mean {result.mean_abs:.2g}{nan})"
    return f"{mark} ({max(result.max_cos, result.max_sin):.2g})"



# --- inputs ----------------------------------------------------------------------------------------------------------
@dataclass
class _Inputs:
    plan: PatchPlan
    out_config: dict  # config.json of the patched checkpoint
    original_config: dict  # config.json of the original model
    folder: Path  # a folder holding out_config as config.json (for the transformers probes)
    out_name: str
    weights: str | os.PathLike | None = None  # where the weights are (a folder or Hub id; None: a config only)
    written: bool = False  # whether `weights` is the patched checkpoint itself (its config.json is out_config)
    long_tokens: int | None = None  # the long request's tokens (None: the target length)

    @property
    def lengths(self) -> list[int]:
        return _lengths(self.plan, self.long_tokens)


def _written(plan: PatchPlan, raw: dict, folder: Path, name: str, weights: str | os.PathLike | None = None,
             written: bool = False) -> _Inputs:
    """A checkpoint rope-extend wrote (`raw`: its config.json in `folder`), its original model rebuilt from the
    plan's marker."""
    original = plan.marker["original"]
    original_config = compat.portable_checkpoint_config(raw, decode_slots(original["rope_parameters"]),
                                                        int(original["max_position_embeddings"]), None)
    return _Inputs(plan, raw, original_config, folder, name, weights=weights, written=written)


def _from_checkpoint(checkpoint: str | os.PathLike) -> _Inputs:
    from ..source import load_source, plan_source

    source = load_source(checkpoint, config_only=True)
    return _written(plan_source(source, None), source.raw, source.folder, str(checkpoint),
                    weights=checkpoint, written=True)


def _from_source(source: str | os.PathLike | dict, spec: RopeSpec, tmp: Path) -> _Inputs:
    from ..source import Source, load_source, plan_source

    if isinstance(source, dict):  # an in-memory config.json (tests, the docs table)
        from transformers import AutoConfig

        raw = dict(source)
        (tmp / "src").mkdir()
        (tmp / "src" / "config.json").write_text(json.dumps(raw))
        loaded = Source("config.json", tmp / "src", raw, AutoConfig.from_pretrained(tmp / "src"))
    else:
        loaded = load_source(source, config_only=True)
    plan = plan_source(loaded, spec)
    out = compat.portable_checkpoint_config(loaded.raw, plan.slots, plan.max_position_embeddings, plan.marker)
    (tmp / "out").mkdir()
    (tmp / "out" / "config.json").write_text(json.dumps(out))
    return _Inputs(plan, out, loaded.raw, tmp / "out", "OUT", weights=None if isinstance(source, dict) else source)


# --- the report --------------------------------------------------------------------------------------------------------
def parity(
    checkpoint: str | os.PathLike | None = None,
    *,
    source: str | os.PathLike | dict | None = None,
    spec: RopeSpec | dict | str | None = None,
    other_python: str | None = None,
    transformers_lines: bool = True,
    runs: Sequence[str] = (),
    long_tokens: int | None = None,
    **spec_overrides: Any,
) -> ParityReport:
    """Compare every engine route with rope-extend's RoPE, for a rope-extend checkpoint or SOURCE + spec.

    other_python: the Python of the other transformers line (default: $ROPE_EXTEND_OTHER_PYTHON; without it that
    row says "not run"). transformers_lines=False skips both transformers rows (the ports only). runs: `--run`
    names of run engines (`engines.runs`: "vllm" is vLLM's offline LLM, "vllm-server" its OpenAI server) to serve
    the checkpoint in as well, each adding "run" rows; their progress goes to stderr, a line per step.
    long_tokens: the long request's length instead of the target length (between the original length and it: a
    slow engine's run at a shorter length), for every row.
    """
    if (checkpoint is None) == (source is None):
        raise ValueError("give either a rope-extend checkpoint or source= with a spec, not both")
    if checkpoint is not None:
        item = checkpoint
    else:
        item = (source, load_spec(spec, **spec_overrides))
    return parity_many([item], other_python=other_python, transformers_lines=transformers_lines, runs=runs,
                       long_tokens=long_tokens)[0]


def parity_many(
    items: list, other_python: str | None = None, transformers_lines: bool = True, other_line: bool = True,
    runs: Sequence[str] = (), progress: RunProgress | None = None, long_tokens: int | None = None,
) -> list[ParityReport]:
    """`parity` for many checkpoints (paths) or (source, spec) pairs, with one process for the other transformers
    line (other_line=False leaves that row out) and one worker per run engine for every run (`runs`: `--run`
    names; `progress`: where their progress lines go, stderr by default). Each is planned once here; the reports
    execute those plans."""
    planned_runs = resolve_runs(runs)
    with tempfile.TemporaryDirectory(prefix="rope-extend-engines-") as tmp:
        inputs = []
        for i, item in enumerate(items):
            if isinstance(item, tuple):
                source, spec = item
                work = Path(tmp) / str(i)
                work.mkdir()
                inputs.append(_from_source(source, load_spec(spec), work))
            else:
                inputs.append(_from_checkpoint(item))
        for x in inputs:
            x.long_tokens = _long_tokens(x.plan, long_tokens)
        progress = (progress or _run_progress(inputs, planned_runs)) if planned_runs else None
        reports = _reports(inputs, other_python, transformers_lines, other_line)
        if planned_runs:
            with Workers(progress) as workers:
                for i, (x, report) in enumerate(zip(inputs, reports)):
                    report.rows += _run_rows(x, planned_runs, workers, Path(tmp) / f"run-{i}")
        return reports


def _reports(inputs: list[_Inputs], other_python: str | None, transformers_lines: bool, other_line: bool,
             hints: ServingHints | None = None) -> list[ParityReport]:
    jobs = [(x.folder, x.lengths) for x in inputs]
    here = probes.run_here(jobs) if transformers_lines else [None] * len(jobs)
    other = probes.run_other(jobs, other_python) if transformers_lines and other_line else [None] * len(jobs)
    return [_report(x, h, o, hints) for x, h, o in zip(inputs, here, other)]


def check_runs(runs: Sequence[str]) -> None:
    """Every name is a real engine rope-extend runs (`--run`), or ValueError naming the choices."""
    resolve_runs(runs)


def _card_routes(inputs: _Inputs, engine: RunEngine):
    """The routes the card lists for a run engine (its room's hint), and the hint's warnings."""
    from .serving import ServingHints

    hint = next(h for h in ServingHints.of(inputs.plan, inputs.out_config).hints if h.engine == engine.name)
    return engine.card_routes(hint), list(hint.warnings)


def _run_progress(inputs: list[_Inputs], runs: list[tuple[RunEngine, str]]) -> RunProgress:
    """Progress for the runs, knowing every request they will serve: the reference's and each run engine's on every
    card route, for each checkpoint with weights (its estimate is calibrated once the reference model loads)."""
    requests = [n for x in inputs if x.weights is not None
                for _ in range(1 + sum(len(_card_routes(x, engine)[0]) for engine, _ in runs))
                for n in x.lengths]
    progress = RunProgress(requests)
    names = ", ".join(f"{engine.title} ({route})" for engine, route in runs)
    progress.say(f"--run: {names}: each engine started, the transformers reference run, then each engine on each "
                 "route the card lists")
    return progress


def _run_rows(inputs: _Inputs, runs: list[tuple[RunEngine, str]], workers: Workers, tmp: Path) -> list[Row]:
    """The "run" rows: the checkpoint served in each run engine (through the route of each `--run`) on every route
    the card lists, with its printed command's settings; prompt log-probabilities against transformers running
    rope-extend's RoPE on the same tokens (`engines.reference`)."""
    from ..hub import resolve_source
    from .reference import calibrate, reference, reference_model, text_ids

    planned = [(engine, route, *_card_routes(inputs, engine)) for engine, route in runs]
    if inputs.weights is None:
        reason = NotServed("not run: a config without weights")
        return [Row(f"{engine.title}, {route} route", card.label, reason, reason, warnings, RUN,
                    (engine.title, card.line), served_by_engine=True)
                for engine, route, cards, warnings in planned for card in cards]
    weights = resolve_source(inputs.weights)
    this = weights if inputs.written else linked_folder(weights, inputs.out_config, tmp / "this")
    original = linked_folder(weights, inputs.original_config, tmp / "original")
    lengths = inputs.lengths
    ids = text_ids(weights, max(lengths))
    requests = {n: ids[: n - 1] for n in lengths}  # n - 1 prompt tokens + 1 generated: n tokens
    model = reference_model(original, inputs.plan)
    if workers.progress.cost is float:  # before anything else starts: how long the whole run will take
        cost = calibrate(model, ids, max(lengths))
        workers.progress.calibrated(cost, f"transformers ran {cost.describe()} here")
    started = {engine.name: workers(engine) for engine, *_ in planned}  # each engine starts (seconds to minutes),
    truth = reference(model, inputs.plan, requests, workers.progress)  # then the reference runs
    del model
    rows = []
    for engine, route, cards, warnings in planned:
        worker = started[engine.name]
        for card in cards:
            results = serve_and_compare(engine, worker, route, original if card.original else this, card.settings,
                                        requests=requests, reference=truth, progress=workers.progress)
            short, long = (r if isinstance(r, LogprobDelta) else NotServed(r) for r in (results[n] for n in lengths))
            rows.append(Row(worker.label(route), card.label, short, long, list(warnings), RUN,
                            (engine.title, card.line), worker.version, worker.device, served_by_engine=True))
    return rows


def _lengths(plan: PatchPlan, long_tokens: int | None = None) -> list[int]:
    return [plan.spec.original_max_position_embeddings, long_tokens or plan.spec.target_length]


def _long_tokens(plan: PatchPlan, long_tokens: int | None) -> int | None:
    """`long_tokens` checked against the plan: above the original length, at most the target length."""
    L, target = plan.spec.original_max_position_embeddings, plan.spec.target_length
    if long_tokens is None or long_tokens == target:
        return None
    if not L < long_tokens < target:
        raise ValueError(f"--long-tokens {long_tokens}: the long request must be longer than the original length "
                         f"{L} and at most the target length {target}")
    return int(long_tokens)


def _report(inputs: _Inputs, here, other, serving: ServingHints | None = None) -> ParityReport:
    """Every registered engine's routes for one checkpoint: the reference's probes, then each ported engine's port on
    each route its hint lists (an unchecked hint: every route unchecked)."""
    from .serving import ServingHints

    plan = inputs.plan
    spec = plan.spec
    lengths = inputs.lengths
    refs = {n: own_rope(plan, n) for n in lengths}
    serving = serving or ServingHints.of(plan, inputs.out_config)
    hints = {hint.engine: hint for hint in serving.named(inputs.out_name)}
    rows: list[Row] = []
    not_served = None
    if plan.method.acts_on_attention:  # the RoPE matches, the attention is the model's own
        not_served = (f"serves {plan.method.served} (its own RoPE and attention); {spec.method} acts on attention, "
                      "which only rope_extend.patch_model applies")

    def row(name, route, results, hint, serves, kind=PORT, version=None, device=None):
        if not_served:
            results = [r if isinstance(r, NotServed) else NotServed(not_served) for r in results]
        short, long = (r if isinstance(r, NotServed) else compare(r, refs[n], n) for n, r in zip(lengths, results))
        rows.append(Row(name, route, short, long, list(hint.warnings), kind, serves, version or name, device))

    reference = next(hint for hint in hints.values() if not get_engine(hint.engine).ported)
    for probed in (here, other):
        if probed is not None:
            version, served = probed
            row(f"transformers {version or '(other line)'}", "config.json", [served[n] for n in lengths], reference,
                None, RUN, version, "cpu" if version else None)

    for engine in ported_engines():
        hint = hints[engine.name]
        for route in hint.routes:
            config = inputs.original_config if route.original else inputs.out_config
            if hint.unchecked:
                results = [Unchecked(hint.unchecked) for _ in lengths]
            elif route.settings is None:
                results = [NotServed(f"no {engine.title} route serves {spec.method} this way")] * len(lengths)
            else:
                results = [engine.served(route, config, n) for n in lengths]
            row(engine.row_name, route.label, results, hint, (engine.title, route.line))
    return ParityReport(
        method=spec.method,
        factor=spec.factor,
        original=spec.original_max_position_embeddings,
        target=spec.target_length,
        rows=rows,
        hints=list(hints.values()),
        long=inputs.long_tokens,
    )


def card_section(plan: PatchPlan, folder: Path, hints: ServingHints | None = None) -> str:
    """The model card's "where it serves identically" section for the checkpoint rope-extend just wrote into
    `folder` with `plan` (`card_parity`'s first part)."""
    return card_parity(plan, folder, hints)[0]


def card_parity(plan: PatchPlan, folder: Path,
                hints: ServingHints | None = None) -> tuple[str, dict[tuple[str, str], str]]:
    """The model card's "where it serves identically" section for the checkpoint rope-extend just wrote into
    `folder` with `plan` (its config.json as written is what the engine ports read), with the writer's hints, and
    the serving routes it contradicts (`unbacked_routes`), which the card's Serving section then does not list.

    The running transformers line and the engine ports only (no second Python is started while writing; the
    writer's verification covers the running line, `rope-extend engines OUT` with ROPE_EXTEND_OTHER_PYTHON adds
    the other). A report that cannot be computed leaves a one-line explanation instead of failing the write.
    """
    from ..files import read_json

    try:
        inputs = _written(plan, read_json(folder / "config.json", "config.json"), folder, str(folder))
        report = _reports([inputs], None, transformers_lines=True, other_line=False, hints=hints)[0]
    except (ValueError, OSError, KeyError, ImportError, RuntimeError) as exc:
        return f"Not computed: {' '.join(str(exc).split())[:300]} (run `rope-extend engines` on this checkpoint).", {}
    return report.markdown() + (
        "\n\nThe other transformers line: `ROPE_EXTEND_OTHER_PYTHON=... rope-extend engines` on this checkpoint."
    ), unbacked_routes(report)


def unbacked_routes(report: ParityReport) -> dict[tuple[str, str], str]:
    """{(engine title, card line): why} for every serving route the report's port rows contradict: served and DIFFERS
    on either request, or served inside the window but not at the target length. A route not checked ("not run",
    "unchecked") or not served at all (an attention-level method: the card says what stock engines serve) is left to
    the hint's own words."""
    out = {}
    for row in report.rows:
        if row.serves is None or row.kind != PORT or not row.differs:
            continue
        served = [not isinstance(r, NotServed) for r in (row.short, row.long)]
        if not any(served):
            continue
        if all(served):
            why = f"DIFFERS from rope-extend's RoPE ({'; '.join(row.reasons())})"
        else:
            why = f"cannot serve {report.target} tokens ({'; '.join(row.reasons())})"
        out[row.serves] = f"rope-extend's check of this route (the table below): {why}"
    return out


# --- the table in docs/serving.md ---------------------------------------------------------------------------------------
# A LLaMA config with the demo model's RoPE (head_dim 64, base 1e5, L = 8192), served at 4x.
TABLE_CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 576,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "num_hidden_layers": 1,
    "intermediate_size": 64,
    "vocab_size": 64,
    "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
}
TABLE_FACTOR = 4.0


def table_variants(factor: float = TABLE_FACTOR, half: int = 32) -> list[tuple[str, dict]]:
    """(label, spec) for every registered method, plus the YaRN settings engines are known to disagree on."""
    from ..methods import all_methods

    out = [(f"`{method.name}`", method.example_spec(factor, half)) for method in all_methods()]
    out.append(("`yarn`, `truncate: false`", {"method": "yarn", "factor": factor, "truncate": False}))
    out.append(("`yarn`, `mscale` 0.707 / `mscale_all_dim` 1", {"method": "yarn", "factor": factor, "mscale": 0.707, "mscale_all_dim": 1.0}))
    return out


def _verdict(row: Row) -> str:
    if row.unchecked:
        return "unchecked"
    short, long = (isinstance(r, Delta) and r.identical for r in (row.short, row.long))
    if short and long:
        return "yes"
    if short:
        return "up to L"
    if long:
        return "at s·L only"
    return "no"


def serving_table() -> str:
    """The table "where each method serves identically" in docs/serving.md, computed by running every route of every engine
    (transformers: the installed line) on a LLaMA config with the demo model's RoPE at 4x."""
    variants = table_variants()
    reports = parity_many([(TABLE_CONFIG, spec) for _, spec in variants], other_line=False)
    header = ["method"] + [route.column for engine in serving_engines() for route in engine.routes]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (label, _), report in zip(variants, reports):
        rows = [r for r in report.rows if not r.skipped]
        lines.append("| " + " | ".join([label] + [_verdict(r) for r in rows]) + " |")
    return "\n".join(lines)


TABLE_START, TABLE_END = "<!-- ENGINES-TABLE:BEGIN -->", "<!-- ENGINES-TABLE:END -->"


def main(argv: list[str]) -> int:
    """`python -m rope_extend.engines.parity docs/serving.md` rewrites the table between the markers (a test in
    tests/test_engines.py fails while it is stale)."""
    import warnings
    from pathlib import Path

    from ..methods.docs import replace_between_markers

    path = Path(argv[0] if argv else "docs/serving.md")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = serving_table()
    path.write_text(replace_between_markers(path.read_text(), table, TABLE_START, TABLE_END))
    print(f"updated the engines table in {path}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
