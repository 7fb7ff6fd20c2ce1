"""The parity report: does each engine serve a checkpoint with exactly rope-extend's RoPE?

For a checkpoint written by rope-extend (or SOURCE + spec, planned in memory), every route a user can take --
transformers 4.x / 5.x loading config.json, vLLM and SGLang serving it (or the original model with the printed
overrides), llama.cpp running the original GGUF with the printed flags or a GGUF converted from it -- is run through
that engine's RoPE (the real library for transformers, a version-pinned port otherwise) for a short request (L
tokens, all positions below the original length) and a long one (the target length). Each is compared with
rope-extend's own cos/sin, magnitude included: max |Δcos|, |Δsin|, or the exact reason the engine cannot serve it.
The commands checked are the ones `rope_extend.serving` prints, so the hints are tested by construction.
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
from ..methods import engine_rules
from ..plan import PatchPlan
from ..spec import RopeSpec, load_spec
from . import llama_cpp, sglang, transformers_engine, vllm
from .served import Delta, EngineHint, NotServed, Served, compare, positions
from .vllm_run import LOGPROB_TOL, MEAN_TOL, RUN_NAMES, LogprobDelta, VllmWorker

Result = Delta | LogprobDelta | NotServed  # cos/sin of a library or port, prompt log-probabilities of a real engine
PORT, RUN = "port", "run"

if TYPE_CHECKING:
    from ..serving import ServingHints


@dataclass
class Row:
    """One serving route of one engine, compared for the short and the long request.

    checked: "port" (rope-extend's port of the engine's RoPE, cos/sin compared) or "run" (the engine itself ran:
    transformers' rotary module, cos/sin compared; or a real vLLM serving the checkpoint, prompt log-probabilities
    compared with transformers running rope-extend's RoPE)."""

    engine: str  # the engine as a user names it, with its version (and, for a real engine, its device and route)
    route: str  # how the checkpoint reaches it
    short: Result
    long: Result
    warnings: list[str] = field(default_factory=list)  # the hint's warnings for this engine
    checked: str = PORT

    @property
    def identical(self) -> bool:
        return all(not isinstance(r, NotServed) and r.identical for r in (self.short, self.long))

    @property
    def skipped(self) -> bool:
        return any(isinstance(r, NotServed) and r.reason.startswith("not run") for r in (self.short, self.long))

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
            "checked": self.checked,
            "identical": self.identical,
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "factor": self.factor,
            "original_max_position_embeddings": self.original,
            "target_length": self.target,
            "short_tokens": self.original,
            "long_tokens": self.target,
            "rows": [row.to_dict() for row in self.rows],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def markdown(self) -> str:
        """The model-card section: "serves identically in: ..."; "differs in: ... because ..."; the table."""
        same = [f"{r.engine} ({r.route})" for r in self.rows if r.identical]
        differs = [r for r in self.rows if not r.identical and not r.skipped]
        lines = [f"Serves identically (max |Δcos|, |Δsin| within float32 tolerance) in: {', '.join(same) or 'none'}.",
                 "", ports_note(self.rows)]
        if differs:
            lines.append("")
            lines.append("Differs in:")
            for row in differs:
                because = "; ".join(row.warnings or row.reasons())
                lines.append(f"- {row.engine} ({row.route}), because {because}")
        lines += [
            "",
            f"| engine | route | checked | short request ({self.original} tokens) | long request ({self.target} tokens) |",
            "|---|---|---|---|---|",
        ]
        for row in self.rows:
            lines.append(f"| {row.engine} | {row.route} | {row.checked} | {cell_text(row.short)} | {cell_text(row.long)} |")
        return "\n".join(lines)


def ports_note(rows: Sequence[Row] = ()) -> str:
    """What the engine rows run, said wherever a row claims "identical" (the card, `rope-extend engines`)."""
    text = (f"The transformers rows run the installed transformers. The vLLM, SGLang and llama.cpp rows run "
            f"rope-extend's ports of those engines' RoPE code ({vllm.VERSION}, {sglang.VERSION}, "
            f"{llama_cpp.VERSION}; rope_extend/engines/), not the engines themselves")
    if not any(row.checked == RUN and not row.engine.startswith("transformers") for row in rows):
        return text + "."
    return text + (", except the rows marked run: those served the checkpoint in that engine with the printed "
                   "command's settings and compared the log-probability of every prompt token with transformers "
                   f"running rope-extend's RoPE (identical: no NaN, |Δ logprob| <= {LOGPROB_TOL:g} for every token "
                   f"and <= {MEAN_TOL:g} on average).")


def cell_text(result: Result) -> str:
    """One request's outcome in a few words: the deltas, or why it was not served."""
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


def _written(plan: PatchPlan, raw: dict, folder: Path, name: str, weights: str | os.PathLike | None = None,
             written: bool = False) -> _Inputs:
    """A checkpoint rope-extend wrote (`raw`: its config.json in `folder`), its original model rebuilt from the
    plan's marker."""
    original = plan.marker["original"]
    original_config = compat.portable_config_dict(raw, decode_slots(original["rope_parameters"]),
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
    out = compat.portable_config_dict(loaded.raw, plan.slots, plan.max_position_embeddings, plan.marker)
    (tmp / "out").mkdir()
    (tmp / "out" / "config.json").write_text(json.dumps(out))
    return _Inputs(plan, out, loaded.raw, tmp / "out", "OUT", weights=None if isinstance(source, dict) else source)


# --- the report --------------------------------------------------------------------------------------------------------
def reference(plan: PatchPlan, n: int) -> Served:
    """rope-extend's own RoPE for a request of n tokens (dynamic methods evaluated at n)."""
    inv_freq, attention = plan.compute(plan.targets[0], seq_len=n)
    cos, sin = Served(inv_freq=inv_freq, magnitude=float(attention)).cos_sin(positions(n))  # once for every row
    return Served(inv_freq=inv_freq, magnitude=float(attention), cos=cos, sin=sin)


def parity(
    checkpoint: str | os.PathLike | None = None,
    *,
    source: str | os.PathLike | dict | None = None,
    spec: RopeSpec | dict | str | None = None,
    other_python: str | None = None,
    transformers_lines: bool = True,
    runs: Sequence[str] = (),
    **spec_overrides: Any,
) -> ParityReport:
    """Compare every engine route with rope-extend's RoPE, for a rope-extend checkpoint or SOURCE + spec.

    other_python: the Python of the other transformers line (default: $ROPE_EXTEND_OTHER_PYTHON; without it that
    row says "not run"). transformers_lines=False skips both transformers rows (the ports only). runs: real
    engines to serve the checkpoint in as well ("vllm": vLLM's offline LLM, "vllm-server": its OpenAI server),
    each adding "run" rows (`rope_extend.engines.vllm_run`).
    """
    if (checkpoint is None) == (source is None):
        raise ValueError("give either a rope-extend checkpoint or source= with a spec, not both")
    if checkpoint is not None:
        item = checkpoint
    else:
        item = (source, load_spec(spec, **spec_overrides))
    return parity_many([item], other_python=other_python, transformers_lines=transformers_lines, runs=runs)[0]


def parity_many(
    items: list, other_python: str | None = None, transformers_lines: bool = True, other_line: bool = True,
    runs: Sequence[str] = (), worker=None,
) -> list[ParityReport]:
    """`parity` for many checkpoints (paths) or (source, spec) pairs, with one process for the other transformers
    line (other_line=False leaves that row out) and one vLLM worker for every run (`worker`: a running
    `vllm_run.VllmWorker` to use instead of starting one). Each is planned once here; the reports execute those
    plans."""
    check_runs(runs)
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
        reports = _reports(inputs, other_python, transformers_lines, other_line)
        if runs:
            own = worker is None
            worker = worker or VllmWorker()
            try:
                for i, (x, report) in enumerate(zip(inputs, reports)):
                    report.rows += _run_rows(x, report, runs, worker, Path(tmp) / f"run-{i}")
            finally:
                if own:
                    worker.close()
        return reports


def _reports(inputs: list[_Inputs], other_python: str | None, transformers_lines: bool, other_line: bool,
             hints: ServingHints | None = None) -> list[ParityReport]:
    jobs = [(x.folder, _lengths(x.plan)) for x in inputs]
    here = transformers_engine.run_here(jobs) if transformers_lines else [None] * len(jobs)
    other = transformers_engine.run_other(jobs, other_python) if transformers_lines and other_line else [None] * len(jobs)
    return [_report(x, h, o, hints) for x, h, o in zip(inputs, here, other)]


def check_runs(runs: Sequence[str]) -> None:
    """Every name is a real engine rope-extend runs (`--run`), or ValueError naming the choices."""
    unknown = [name for name in runs if name not in RUN_NAMES]
    if unknown:
        raise ValueError(f"--run {unknown[0]!r}: the real engines rope-extend runs are {', '.join(RUN_NAMES)}")


def _run_rows(inputs: _Inputs, report: ParityReport, runs: Sequence[str], worker, tmp: Path) -> list[Row]:
    """The "run" rows: the checkpoint served in a real vLLM (each route of `runs`) through both routes the card
    lists, with its printed command's settings; prompt log-probabilities against transformers running
    rope-extend's RoPE on the same tokens (`vllm_run`)."""
    from ..hub import resolve_source
    from . import vllm_run

    hint = next(h for h in report.hints if h.engine == "vLLM")
    v = hint.args
    routes = (("this checkpoint", v["out_overrides"]), ("original model + --hf-overrides", v["original_overrides"]))
    if inputs.weights is None:
        reason = NotServed("not run: a config without weights")
        return [Row(worker.label(RUN_NAMES[run]), route, reason, reason, list(hint.warnings), RUN)
                for run in runs for route, _ in routes]
    weights = resolve_source(inputs.weights)
    this = weights if inputs.written else vllm_run.linked_folder(weights, inputs.out_config, tmp / "this")
    original = vllm_run.linked_folder(weights, inputs.original_config, tmp / "original")
    lengths = _lengths(inputs.plan)
    ids = vllm_run.text_ids(weights, max(lengths))
    requests = {n: ids[: n - 1] for n in lengths}  # n - 1 prompt tokens + 1 generated: n tokens
    truth = vllm_run.reference(original, inputs.plan, requests)
    rows = []
    for run in runs:
        route = RUN_NAMES[run]
        for label, overrides in routes:
            results = vllm_run.serve_and_compare(
                worker, route, this if label == "this checkpoint" else original, max_model_len=v["max_model_len"],
                hf_overrides=overrides, env=v["env"], requests=requests, reference=truth)
            short, long = (r if isinstance(r, LogprobDelta) else NotServed(r) for r in (results[n] for n in lengths))
            rows.append(Row(worker.label(route), label, short, long, list(hint.warnings), RUN))
    return rows


def _lengths(plan: PatchPlan) -> list[int]:
    return [plan.spec.original_max_position_embeddings, plan.spec.target_length]


def _report(inputs: _Inputs, here, other, serving: ServingHints | None = None) -> ParityReport:
    from ..serving import ServingHints

    plan = inputs.plan
    spec = plan.spec
    lengths = _lengths(plan)
    refs = {n: reference(plan, n) for n in lengths}
    serving = serving or ServingHints.of(plan)
    hints = {hint.engine: hint for hint in serving.named(inputs.out_name)}
    rows: list[Row] = []
    not_served = engine_rules(plan.method).not_served(plan)

    def row(engine, route, results, hint_engine, checked=PORT):
        if not_served:  # the RoPE matches, the attention is the model's own
            results = [r if isinstance(r, NotServed) else NotServed(not_served) for r in results]
        short, long = (r if isinstance(r, NotServed) else compare(r, refs[n], n) for n, r in zip(lengths, results))
        rows.append(Row(engine, route, short, long, list(hints[hint_engine].warnings), checked))

    for probed in (here, other):
        if probed is not None:
            version, served = probed
            row(f"transformers {version or '(other line)'}", "config.json", [served[n] for n in lengths], "transformers",
                RUN)

    v = hints["vLLM"].args
    for route, config, overrides in (
        ("this checkpoint", inputs.out_config, v["out_overrides"]),
        ("original model + --hf-overrides", inputs.original_config, v["original_overrides"]),
    ):
        fields, rope = vllm.load_config(config, overrides)
        results = [
            NotServed(f"the command serves --max-model-len {v['max_model_len']}")
            if n > v["max_model_len"]
            else vllm.served(fields, rope, v["max_model_len"], n)
            for n in lengths
        ]
        row(vllm.VERSION, route, results, "vLLM")

    g = hints["SGLang"].args
    for route, config, overrides in (
        ("this checkpoint", inputs.out_config, g["out_overrides"]),
        ("original model + --json-model-override-args", inputs.original_config, g["original_overrides"]),
    ):
        fields, rope = sglang.load_config(config, overrides)
        row(sglang.VERSION, route, [sglang.served(fields, rope, n) for n in lengths], "SGLang")

    c = hints["llama.cpp"].args
    model_type = compat_model_type(inputs.out_config)
    for route, config, flags in (
        ("original GGUF + flags", inputs.original_config, c["flags"]),
        ("GGUF converted from this checkpoint", inputs.out_config, c["converted_flags"]),
    ):
        if model_type not in llama_cpp.LLAMA_ARCH_MODEL_TYPES:
            results = [NotServed(f"not run: llama.cpp is modelled for the LLaMA architecture, not {model_type!r}")] * 2
        elif flags is None:
            results = [NotServed(f"no llama.cpp flags reproduce {spec.method} on the original GGUF")] * 2
        else:
            meta = llama_cpp.convert(config)
            results = [llama_cpp.served(meta, flags, n) for n in lengths]
        row("llama.cpp (llama-cpp-python 0.3.36)", route, results, "llama.cpp")
    return ParityReport(
        method=spec.method,
        factor=spec.factor,
        original=spec.original_max_position_embeddings,
        target=spec.target_length,
        rows=rows,
        hints=list(hints.values()),
    )


@dataclass(frozen=True)
class VllmEvalServing:
    """How `eval --engine vllm` serves the original model with a plan's method (`plan` None: unpatched)."""

    overrides: dict | None  # --hf-overrides (the card's, for the original model)
    env: dict  # VLLM_ALLOW_LONG_MAX_MODEL_LEN when max_model_len exceeds what vLLM derives from the config
    verdicts: dict  # request length n -> None when served as rope-extend computes it at positions 0..n-1, else why


def vllm_eval_serving(plan: PatchPlan | None, original_config: dict, max_model_len: int,
                      lengths) -> VllmEvalServing:
    """For `eval --engine vllm`: the original model served with plan's method and --max-model-len max_model_len,
    checked through the vLLM port at every request length (positions 0..n-1) against rope-extend's own RoPE. The
    unpatched model is checked against its own RoPE (vLLM's cache holds max_position_embeddings positions)."""
    from ..serving import engine_hints

    overrides = None
    if plan is not None:
        overrides = next(h for h in engine_hints(plan, "OUT") if h.engine == "vLLM").args["original_overrides"]
    fields, rope = vllm.load_config(original_config, overrides)
    env = {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"} if max_model_len > vllm.derived_max_model_len(fields, rope) else {}
    verdicts = {}
    for n in sorted(set(lengths)):
        served = vllm.served(fields, rope, max_model_len, n)
        if plan is not None and plan.method.acts_on_attention:
            verdicts[n] = f"{plan.spec.method} acts on attention, which vLLM does not apply"
            continue
        if isinstance(served, NotServed):
            verdicts[n] = served.reason
            continue
        if plan is None:
            verdicts[n] = None  # the original RoPE, within vLLM's cache
            continue
        delta = compare(served, reference(plan, n), n)
        verdicts[n] = None if delta.identical else (
            f"{vllm.VERSION} builds cos/sin {max(delta.max_cos, delta.max_sin):.2g} away from rope-extend's"
            + (f": {served.note}" if served.note else ""))
    return VllmEvalServing(overrides, env, verdicts)


def compat_model_type(config: dict) -> str:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return str(text.get("model_type", ""))


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


# A port row's (engine, route) -> the serving line it checks: (the EngineHint's engine, "command" for OUT or
# "original" for the original model with overrides or flags).
CARD_ROUTES = {
    (vllm.VERSION, "this checkpoint"): ("vLLM", "command"),
    (vllm.VERSION, "original model + --hf-overrides"): ("vLLM", "original"),
    (sglang.VERSION, "this checkpoint"): ("SGLang", "command"),
    (sglang.VERSION, "original model + --json-model-override-args"): ("SGLang", "original"),
    ("llama.cpp (llama-cpp-python 0.3.36)", "original GGUF + flags"): ("llama.cpp", "original"),
    ("llama.cpp (llama-cpp-python 0.3.36)", "GGUF converted from this checkpoint"): ("llama.cpp", "command"),
}


def unbacked_routes(report: ParityReport) -> dict[tuple[str, str], str]:
    """{(engine, "command" | "original"): why} for every serving route the report's port rows contradict: served and
    DIFFERS on either request, or served inside the window but not at the target length. A route not checked
    ("not run") or not served at all (an attention-level method: the card says what stock engines serve) is left
    to the hint's own words."""
    out = {}
    for row in report.rows:
        key = CARD_ROUTES.get((row.engine, row.route))
        if key is None or row.checked != PORT or row.identical or row.skipped:
            continue
        served = [not isinstance(r, NotServed) for r in (row.short, row.long)]
        if not any(served):
            continue
        if all(served):
            why = f"DIFFERS from rope-extend's RoPE ({'; '.join(row.reasons())})"
        else:
            why = f"cannot serve {report.target} tokens ({'; '.join(row.reasons())})"
        out[key] = f"rope-extend's check of this route (the table below): {why}"
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

    out = [(f"`{method.name}`", engine_rules(method).table_spec(factor, half)) for method in all_methods()]
    out.append(("`yarn`, `truncate: false`", {"method": "yarn", "factor": factor, "truncate": False}))
    out.append(("`yarn`, `mscale` 0.707 / `mscale_all_dim` 1", {"method": "yarn", "factor": factor, "mscale": 0.707, "mscale_all_dim": 1.0}))
    return out


def _verdict(row: Row) -> str:
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
    header = ["method", "transformers", "vLLM", "vLLM, original + `--hf-overrides`", "SGLang",
              "SGLang, original + overrides", "llama.cpp, original GGUF + flags", "llama.cpp, converted GGUF"]
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
