"""The audit: does each serving engine serve a model's OWN RoPE as transformers computes it?

`rope-extend engines MODEL` on a model rope-extend did not write (a Hub id or a folder; only config.json is read).
The reference is the running transformers' own rotary embedding built from that config.json (`hf_probe`: the
model's rotary class, its forward at the request's positions, per layer type where the model has several: Gemma 3's
sliding layers use the local RoPE, its full layers the scaled one). Each engine route -- the checkpoint as it is,
and, where an engine needs them, the overrides that make it serve what transformers computes -- goes through the
same version-pinned ports and the same comparison as the parity report of a patched checkpoint
(`engines.parity.Row`, `served.compare`): max |Δcos|, |Δsin| for a short request (the pretraining length L) and a
long one (the length the model reaches, its window), with the layers, the worst position and rotary frequency, and
the first position beyond float32 tolerance as evidence. vLLM and SGLang read the config through transformers 5 (the
ports say so), so their rows start from the config as transformers loads it (class defaults filled in, e.g. Gemma
3's rope_theta); llama.cpp's from the config.json convert_hf_to_gguf.py reads.

`--run ENGINE` checks the ports' verdicts in the real engines (`engines.audit_run`): a small random-weight model of
the config is served through every audit route of each run engine's room with the route's settings, its prompt
log-probabilities compared with transformers running the same config.json on the same model, at the lengths the run
measured; the ports are computed at those lengths too, and a run that measures otherwise than its port is a
contradiction (`AuditReport.contradictions`: `rope-extend engines` exits 3).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .audit_run import RUN_TOKENS, RunInfo, measure, run_lengths
from .parity import PORT, RUN, Row, ports_note
from .registry import AuditedModel, get_engine, ported_engines
from .runs import LOGPROB_TOL, MEAN_TOL, LogprobDelta, RunProgress, resolve_runs
from .served import Delta, NotServed, Served, Unchecked, compare
from .transformers import probes

REFERENCE = "transformers' own rotary embedding of this config.json"


@dataclass(frozen=True)
class Group:
    """Layers that share one RoPE (one per layer type; a model without layer types is one group)."""

    layer_type: str | None
    layers: tuple[int, ...]

    @property
    def label(self) -> str:
        kind = "" if self.layer_type is None else f"{self.layer_type.removesuffix('_attention')} "
        if len(self.layers) and self.layers == tuple(range(self.layers[0], self.layers[-1] + 1)) and kind == "":
            return f"all {len(self.layers)}"
        return f"{kind}{_ranges(self.layers)}"


def _ranges(layers: tuple[int, ...]) -> str:
    """0, 1, 2, 4 -> "0-2, 4"."""
    out, start = [], None
    for i, layer in enumerate(layers):
        start = layer if start is None else start
        if i + 1 == len(layers) or layers[i + 1] != layer + 1:
            out.append(str(start) if start == layer else f"{start}-{layer}")
            start = None
    return ", ".join(out)


@dataclass
class AuditRow(Row):
    """A parity row (`parity.Row`: engine, route, short, long, kind) for one layer group, with the exact command
    or flags of its route. A run row (`served_by_engine`: the small model served in the real engine, every layer)
    holds log-probability deltas, and in `port` what the engine's port gives the same route at the same lengths."""

    layers: str = ""
    command: str = ""
    port: tuple[Any, Any] | None = None  # a run row: the port's (short, long) at the measured lengths

    def reasons(self) -> list[str]:
        """Why this route is not identical, with the evidence: the deltas, where they peak (position, rotary
        frequency) and the first position beyond float32 tolerance; a run row's log-probability deltas."""
        out = []
        for label, result in (("short", self.short), ("long", self.long)):
            if isinstance(result, NotServed):
                out.append(f"{label} request: {result.reason}")
            elif isinstance(result, LogprobDelta):
                if not result.identical:
                    out.append(f"{label} request ({result.n} tokens): {result.describe()}")
            elif not result.identical:
                out.append(f"{label} request ({result.n} tokens): max |Δcos| {result.max_cos:.3g}, |Δsin| "
                           f"{result.max_sin:.3g}, largest at position {result.worst_position}, rotary frequency "
                           f"{result.worst_dim}; beyond float32 tolerance from position {result.first_position}")
        return out

    def evidence(self) -> dict[str, Any]:
        """The row's measurement over its served requests: the largest |Δcos|, |Δsin| against transformers' own
        RoPE of the config, or a run row's largest |Δ logprob| (max, mean) against transformers running the config
        on the small model (None where no request was served)."""
        served = [r for r in (self.short, self.long) if not isinstance(r, NotServed)]
        if self.served_by_engine:
            return {"measure": f"prompt log-probability against {RUN_REFERENCE}",
                    "max_abs_dlogprob": max((r.max_abs for r in served), default=None),
                    "mean_abs_dlogprob": max((r.mean_abs for r in served), default=None)}
        return {"measure": f"cos/sin against {REFERENCE}",
                "max_abs_dcos": max((r.max_cos for r in served), default=None),
                "max_abs_dsin": max((r.max_sin for r in served), default=None)}

    def agrees(self) -> list[tuple[str, Any, Any, bool]]:
        """A run row: (request, the port's result, the measured one, whether they agree) for every request measured
        whose port result is checked: they agree when both are identical or neither is."""
        out = []
        for request, said, got in zip(("short", "long"), self.port or (), (self.short, self.long)):
            if _unmodelled(said) or isinstance(got, NotServed) and got.reason.startswith("not run"):
                continue  # the port says nothing here (the run's measurement stands alone), or nothing was measured
            port_same = isinstance(said, Delta) and said.identical
            run_same = isinstance(got, LogprobDelta) and got.identical
            out.append((request, said, got, port_same == run_same))
        return out

    def to_dict(self) -> dict[str, Any]:
        out = {**super().to_dict(), "evidence": self.evidence(), "layers": self.layers, "command": self.command,
               "served_by_engine": self.served_by_engine, "short": _evidence(self.short), "long": _evidence(self.long)}
        if self.port is not None:
            out["port_at_measured_lengths"] = {"short": _evidence(self.port[0]), "long": _evidence(self.port[1])}
            out["agrees_with_port"] = all(agree for *_, agree in self.agrees())
        return out


def _evidence(result) -> dict[str, Any]:
    if isinstance(result, NotServed):  # an Unchecked one (no rule covers it) says so
        return {"served": False, "reason": result.reason} | ({"unchecked": True} if isinstance(result, Unchecked) else {})
    if isinstance(result, LogprobDelta):
        return {"served": True, "tokens": result.n, "max_abs_dlogprob": result.max_abs,
                "mean_abs_dlogprob": result.mean_abs, "mean_dlogprob": result.mean, "nan": result.nan,
                "first_nan": result.first_nan, "identical": result.identical}
    out = {"served": True, "tokens": result.n, "max_abs_dcos": result.max_cos, "max_abs_dsin": result.max_sin,
           "identical": result.identical}
    if isinstance(result, Delta):
        out.update({"worst_position": result.worst_position, "worst_rotary_frequency": result.worst_dim,
                    "first_position_beyond_tolerance": result.first_position})
    return out


@dataclass(frozen=True)
class Verdict:
    """One engine's answer: the route (and its exact command) that serves what transformers computes, or why none
    does."""

    engine: str
    identical: bool | None  # None: not checked (an engine not modelled for this architecture, a line not run)
    route: str | None
    command: str | None
    why: str
    up_to: int | None = None  # not identical: the short request is, on `route` with `command`


@dataclass
class AuditReport:
    model: str
    model_type: str
    scheme: str  # the model's own RoPE in a few words
    reference: str  # "transformers 5.25.0"
    short: int
    long: int
    groups: list[Group]
    rows: list[AuditRow]
    measured_against: str = REFERENCE  # what every cell is compared with
    notes: list[str] = field(default_factory=list)  # facts a reader needs beside the verdicts
    run: RunInfo | None = None  # `--run`: what was served and at which lengths (the run rows: `served_by_engine`)

    @property
    def port_rows(self) -> list[AuditRow]:
        """The rows of the ports and the transformers lines (cos/sin), at the audited lengths."""
        return [row for row in self.rows if not row.served_by_engine]

    @property
    def run_rows(self) -> list[AuditRow]:
        """The rows a real engine measured (`--run`), at the run's lengths."""
        return [row for row in self.rows if row.served_by_engine]

    def verdicts(self) -> list[Verdict]:
        """Each engine's verdict from its port (and the transformers lines), at the audited lengths."""
        out = []
        rows_all = self.port_rows
        for engine in dict.fromkeys(row.engine for row in rows_all):
            rows = [row for row in rows_all if row.engine == engine]
            routes = list(dict.fromkeys(row.route for row in rows))
            by_route = {route: [row for row in rows if row.route == route] for route in routes}
            good = [route for route in routes if all(row.identical for row in by_route[route])]
            if good:
                first = by_route[good[0]][0]
                out.append(Verdict(engine, True, good[0], first.command, "serves it as transformers computes it"))
                continue
            unsure = [row for row in rows if not row.identical]
            if all(row.skipped or _not_checked(row) for row in unsure):  # nothing differs: some layers not modelled
                out.append(Verdict(engine, None, None, None, _first_reason(unsure[0])))
                continue
            why = "; ".join(f"{row.route} ({row.layers} layers): {'; '.join(row.reasons())}" for row in rows
                            if not row.identical)
            short = [route for route in routes if all(isinstance(row.short, Delta) and row.short.identical
                                                      for row in by_route[route])]
            if short:
                first = by_route[short[0]][0]
                out.append(Verdict(engine, False, short[0], first.command, why, up_to=self.short))
            else:
                out.append(Verdict(engine, False, None, None, why))
        return out

    def measured(self) -> list[Verdict]:
        """Each run engine's verdict from what it measured (`--run`), at the run's lengths: identical on a route
        (both requests), identical up to the short request, or DIFFERS, or not checked (nothing was measured)."""
        out = []
        for engine in dict.fromkeys(row.engine for row in self.run_rows):
            rows = [row for row in self.run_rows if row.engine == engine]
            good = [row for row in rows if row.identical]
            if good:
                out.append(Verdict(engine, True, good[0].route, good[0].command, "measured identical"))
                continue
            if all(row.skipped for row in rows):
                out.append(Verdict(engine, None, None, None, _first_reason(rows[0])))
                continue
            why = "; ".join(f"{row.route}: {'; '.join(row.reasons())}" for row in rows if not row.identical)
            short = [row for row in rows if isinstance(row.short, LogprobDelta) and row.short.identical]
            if short:
                out.append(Verdict(engine, False, short[0].route, short[0].command, why,
                                   up_to=self.run.lengths[0] if self.run else None))
            else:
                out.append(Verdict(engine, False, None, None, why))
        return out

    def contradictions(self) -> list[str]:
        """Where a real engine measured otherwise than its port at the same lengths (the port says identical and the
        run differs, is refused or gives NaN; or the port says it differs and the run is identical). One line each;
        what `rope-extend engines MODEL --run` exits 3 on."""
        out = []
        for row in self.run_rows:
            for request, said, got, agree in row.agrees():
                if agree:
                    continue
                n = f" ({got.n} tokens)" if isinstance(got, LogprobDelta) else ""
                measured = got.describe() if isinstance(got, LogprobDelta) else got.reason
                out.append(f"{row.engine} ({row.route}), {request} request{n}: the port says {_said(said)}; "
                           f"measured {'identical: ' if isinstance(got, LogprobDelta) and got.identical else ''}"
                           f"{measured}")
        return out

    @property
    def identical(self) -> bool:
        """Every engine checked serves the model's own RoPE as transformers computes it on some route."""
        return all(v.identical is not False for v in self.verdicts())

    def to_dict(self) -> dict[str, Any]:
        out = {
            "audit": True,
            "model": self.model,
            "model_type": self.model_type,
            "scheme": self.scheme,
            "reference": f"{self.reference}: {self.measured_against}",
            "short_tokens": self.short,
            "long_tokens": self.long,
            "layer_groups": [{"layer_type": g.layer_type, "layers": list(g.layers)} for g in self.groups],
            "rows": [row.to_dict() for row in self.rows],
            "verdicts": [v.__dict__ for v in self.verdicts()],
            "identical": self.identical,
            "notes": self.notes,
        }
        if self.run is not None:
            out["run"] = self.run.to_dict()
            out["measured_verdicts"] = [v.__dict__ for v in self.measured()]
            out["contradictions"] = self.contradictions()
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def lines(self, width: int) -> list[str]:
        """The report as the terminal shows it: what was checked, the table, each engine's verdict with the exact
        command, and the evidence of every difference; with `--run`, what the real engines measured beside it."""
        from ..terminal import table_lines, wrap

        out = wrap(f"{self.model} ({self.model_type}): {self.scheme}. Each cell: max |Δcos|, |Δsin| against "
                   f"{self.measured_against.replace('transformers', self.reference, 1)}, for a short request ({self.short} "
                   f"tokens) and a long one ({self.long} tokens).", width)
        header = ["engine", "route", "layers", f"max |Δcos/sin| ({self.short})", f"max |Δcos/sin| ({self.long})", "result"]
        rows = [[row.engine, row.route, row.layers, _cell(row.short), _cell(row.long), _result(row)]
                for row in self.port_rows]
        out += [""] + table_lines(header, rows, width) + [""]
        for verdict in self.verdicts():
            if verdict.identical:
                out += wrap(f"{verdict.engine}: identical with: {verdict.command}", width, hang="    ")
            elif verdict.identical is None:
                out += wrap(f"{verdict.engine}: not checked: {verdict.why}", width, hang="    ")
            elif verdict.up_to:
                out += wrap(f"{verdict.engine}: identical only up to {verdict.up_to} tokens, with: {verdict.command}. "
                            f"Otherwise DIFFERS: {verdict.why}", width, hang="    ")
            else:
                out += wrap(f"{verdict.engine}: DIFFERS on every route: {verdict.why}", width, hang="    ")
        for note in self.notes:
            out += wrap(f"Note: {note}", width, hang="    ")
        out += [""] + wrap(f"Identical: within float32 tolerance (magnitude within 1e-5, every frequency within "
                           f"2^-18 relative). {ports_note(self.port_rows)}", width)
        if self.run is not None:
            out += [""] + self._run_lines(width)
        return out

    def _run_lines(self, width: int) -> list[str]:
        from ..terminal import table_lines, wrap

        run = self.run
        short, long = run.lengths
        out = wrap(f"Measured (--run): {run.describe()}. Each cell: max / mean |Δ logprob| of the prompt tokens; "
                   "port: what the engine's port gives the same route at the same lengths (cos/sin against "
                   "transformers' rotary embedding).", width)
        header = ["engine (run)", "route", f"short ({short})", f"long ({long})", "port", "result"]
        rows = [[row.engine, row.route, _run_cell(row.short), _run_cell(row.long),
                 ", ".join(_port_word(r) for r in row.port or ()), _run_result(row)] for row in self.run_rows]
        out += [""] + table_lines(header, rows, width) + [""]
        contradicted = {row.engine for row in self.run_rows if not all(agree for *_, agree in row.agrees())}
        for verdict in self.measured():
            agrees = (" CONTRADICTS the port (the lines below)" if verdict.engine in contradicted
                      else " As the port says.")
            if verdict.identical:
                text = f"measured identical at {short} and {long} tokens with: {verdict.command}."
            elif verdict.identical is None:
                text, agrees = f"not measured: {verdict.why}.", ""
            elif verdict.up_to:
                text = (f"measured identical only at the short request ({verdict.up_to} tokens), with: "
                        f"{verdict.command}. Otherwise DIFFERS: {verdict.why}.")
            else:
                text = f"measured: DIFFERS on every route: {verdict.why}."
            out += wrap(f"{verdict.engine}: {text}{agrees}", width, hang="    ")
        for line in self.contradictions():
            out += wrap(f"CONTRADICTS the port: {line}", width, hang="    ")
        out += [""] + wrap(f"Measured identical: no NaN, |Δ logprob| <= {LOGPROB_TOL:g} for every token and <= "
                           f"{MEAN_TOL:g} on average.", width)
        return out


RUN_REFERENCE = "transformers running this config.json on the small model"


def _said(result) -> str:
    if isinstance(result, NotServed):
        return f"not served ({result.reason})"
    if result.identical:
        return "identical"
    return f"DIFFERS (max |Δcos|, |Δsin| {max(result.max_cos, result.max_sin):.2g})"


def _port_word(result) -> str:
    if isinstance(result, Unchecked):
        return "unchecked"
    if isinstance(result, NotServed):
        return "not modelled" if _unmodelled(result) else "not served"
    return "identical" if result.identical else "differs"


def _run_cell(result) -> str:
    if isinstance(result, NotServed):
        return "not run" if result.reason.startswith("not run") else "refused"
    nan = f", {result.nan} NaN" if result.nan else ""
    return f"{result.max_abs:.2g} / {result.mean_abs:.2g}{nan}"


def _run_result(row: AuditRow) -> str:
    if row.skipped:
        return "not run"
    differs = any(isinstance(r, LogprobDelta) and not r.identical for r in (row.short, row.long))
    word = "identical" if row.identical else "differs" if differs else "not served"
    return word if all(agree for *_, agree in row.agrees()) else f"{word}: CONTRADICTS the port"


def _unmodelled(result) -> bool:
    """A port result that says nothing about the engine: unchecked, or a request the port does not model."""
    return isinstance(result, Unchecked) or isinstance(result, NotServed) and result.reason.startswith("not ")


def _not_checked(row: Row) -> bool:
    return all(isinstance(r, Unchecked) or isinstance(r, NotServed) and r.reason.startswith("not ")
               for r in (row.short, row.long))


def _first_reason(row: Row) -> str:
    result = row.short if isinstance(row.short, NotServed) else row.long
    return result.reason if isinstance(result, NotServed) else ""


def _cell(result) -> str:
    if isinstance(result, Unchecked):
        return "unchecked"
    if isinstance(result, NotServed):
        return next((w for w in ("not run", "not modelled") if result.reason.startswith(w)), "not served")
    return f"{max(result.max_cos, result.max_sin):.2g}"


def _result(row: Row) -> str:
    if row.identical:
        return "identical"
    if row.skipped or _not_checked(row):
        return "not checked"
    return "differs" if any(isinstance(r, Delta) and not r.identical for r in (row.short, row.long)) else "not served"


# --- the audit --------------------------------------------------------------------------------------------------------
def audit(model: str | os.PathLike, *, other_python: str | None = None, runs: Sequence[str] = (),
          run_tokens: int = RUN_TOKENS, progress: RunProgress | None = None) -> AuditReport:
    """Audit the model's own RoPE (a Hub id resolved from the cache or the Hub, or a folder; config.json only): per
    engine, route and layer group, the port's cos/sin against transformers' own rotary embedding of the config.
    `runs` (`--run` names): also serve a small random-weight model of the config in those real engines, through
    every audit route of their rooms, with requests of at most `run_tokens` tokens (`audit_run`)."""
    from .. import compat
    from ..errors import CheckpointError
    from ..facts import read_rope
    from ..plan import recorded_spec
    from ..source import load_source

    planned = resolve_runs(runs)  # a bad name fails before anything is read or loaded
    source = load_source(model, config_only=True)
    if recorded_spec(source.config) is not None:
        raise CheckpointError(f"{str(model)!r} was written by rope-extend: `rope-extend engines {model}` checks it "
                              "against its own plan (the audit is for models rope-extend did not write)")
    text = compat.text_config(source.config)
    facts = read_rope(text)
    long = facts.window
    if long is None:
        raise ValueError(f"{str(model)!r}: its config has no max_position_embeddings, so the length its RoPE reaches "
                         "is not known; the audit checks a model whose config gives it")
    short = min(facts.original_length() or long, long)
    measured = run_lengths(short, long, run_tokens) if planned else None
    lengths = sorted({short, long, *(measured or ())})
    groups = _groups(text)
    jobs = [(source.folder, lengths, g.layer_type) for g in groups]
    here = probes.run_here(jobs)
    version = here[0][0]
    refs = []
    for _, served in here:
        refused = next((r for r in served.values() if isinstance(r, NotServed)), None)
        if refused is not None:
            raise ValueError(f"{model!r}: {refused.reason}; the audit compares engines with transformers' own RoPE")
        refs.append(served)
    name = str(model)
    rows: list[AuditRow] = []

    def compared(group, results, at):
        return [r if isinstance(r, NotServed) else _compare(r, refs[groups.index(group)][n], n)
                for n, r in zip(at, results)]

    def add(engine, route, command, group, results, kind=PORT):
        short_r, long_r = compared(group, results, (short, long))
        rows.append(AuditRow(engine, route, short_r, long_r, [], kind, layers=group.label, command=command))

    other = probes.run_other([(f, sorted({short, long}), t) for f, _, t in jobs], other_python)
    for group, (other_version, served) in zip(groups, other):
        add(f"transformers {other_version or '(other line)'}", "config.json", "AutoModelForCausalLM.from_pretrained"
            f"({name!r})", group, [served[short], served[long]], RUN)
    audited = AuditedModel(
        name=name, model_type=facts.model_type,
        loaded=_loaded(text, compat.text_part(source.raw)),  # what vLLM and SGLang read (class defaults included)
        raw=compat.text_part(source.raw),  # what convert_hf_to_gguf.py and mlx-lm read
        groups=tuple(groups), short=short, long=long, architectures=tuple(source.raw.get("architectures") or ()),
        features=_features(source.raw, facts))
    for engine in ported_engines():
        for route in engine.audit_routes(audited):
            for group in groups:
                add(engine.row_name, route.label, route.command, group, list(route.results[group]))
    report = AuditReport(name, facts.model_type, _scheme(facts, groups, short, long), f"transformers {version}",
                         short, long, groups, rows)
    if planned:
        # every run engine's room's routes, their results at the measured lengths (the port beside the run)
        at_run = replace(audited, requests=measured)
        routes = {adapter.name: get_engine(adapter.name).audit_routes(at_run) for adapter, _ in planned}
        with tempfile.TemporaryDirectory(prefix="rope-extend-audit-run-") as tmp:
            report.run, served = measure(source.raw, text, audited, planned, routes, run_tokens, Path(tmp), progress)
        for one in served:
            route = next(r for r in routes[one.engine] if r.label == one.route)
            port = [compared(group, list(route.results[group]), measured) for group in groups]
            rows.append(AuditRow(one.label, one.route, one.results[measured[0]], one.results[measured[1]], [], RUN,
                                 version=one.version, device=one.device, served_by_engine=True,
                                 layers=f"all {report.run.model.layers} (small model)", command=one.command,
                                 port=(_worst([p[0] for p in port]), _worst([p[1] for p in port]))))
    return report


def _loaded(text, raw: dict) -> dict:
    """The text config as transformers loads config.json (class defaults filled in: what vLLM and SGLang read), with
    what config.json sets that the loaded config keeps elsewhere put back: transformers 5.25 moves Gemma 4's
    `global_head_dim` into `per_layer_config` (its full layers' head_dim), where `to_dict` gives None, and the
    ports read the full layers' head size from it, as the parity report's ports do from a written config.json."""
    out = text.to_dict()
    for key in MOVED_BY_TRANSFORMERS:
        if out.get(key) is None and raw.get(key) is not None:
            out[key] = raw[key]
    return out


# config.json fields the loaded config (transformers 5.25) keeps elsewhere, which the engines and their ports read
MOVED_BY_TRANSFORMERS = ("global_head_dim",)


def _worst(results: list) -> Any:
    """One request's port result over the layer groups: unchecked or not served where a group is, else the first
    group that differs, else the first."""
    for kind in (Unchecked, NotServed):
        found = next((r for r in results if isinstance(r, kind)), None)
        if found is not None:
            return found
    return next((r for r in results if not r.identical), results[0])


def _features(raw: dict, facts) -> frozenset[str]:
    """The config features of an audited model (`written.FEATURES`) an engine's port must model."""
    found = set()
    if isinstance(raw.get("text_config"), dict):
        found.add("text_config")
    if len(facts.slots) > 1:
        found.add("layer_types")
    if any(slot.get("rope_type") == "proportional" for slot in facts.slots.values()):
        found.add("proportional")
    if any(slot.get("mscale") is not None and slot.get("mscale_all_dim") is not None for slot in facts.slots.values()):
        found.add("mscale")
    return frozenset(found)


def _compare(engine: Served, reference: Served, n: int) -> Delta | NotServed:
    """`served.compare`, or why not: a port that rotates another number of dimensions than transformers (DeepSeek's
    MLA rotates qk_rope_head_dim, which the ports do not read) is not modelled, not "different"."""
    columns = reference.cos.shape[-1] if reference.cos is not None else reference.inv_freq.numel()
    if engine.inv_freq is not None and engine.inv_freq.numel() != columns:
        return NotServed(f"not modelled: the port rotates {2 * engine.inv_freq.numel()} dimensions, transformers "
                         f"{2 * columns} (a rotary dimension the port does not read)")
    return compare(engine, reference, n)


def _groups(text) -> list[Group]:
    n = int(getattr(text, "num_hidden_layers", 0) or 0)
    types = list(getattr(text, "layer_types", None) or [])
    if len(set(types)) <= 1:
        return [Group(None, tuple(range(n)))]
    order = list(dict.fromkeys(types))
    order.sort(key=lambda t: t != "full_attention")  # full attention first: it carries the model's length
    return [Group(t, tuple(i for i, x in enumerate(types) if x == t)) for t in order]


def _scheme(facts, groups: list[Group], short: int, long: int) -> str:
    def one(params: dict) -> str:
        kind = params.get("rope_type", "default")
        factor = f" x{float(params['factor']):g}" if params.get("factor") and kind != "default" else ""
        return f"{kind}{factor} (θ {float(params.get('rope_theta') or 0):g})"

    slots = facts.slots
    if len(slots) > 1:
        text = ", ".join(f"{key.removesuffix('_attention')} layers {one(p)}" for key, p in slots.items())
    else:
        text = one(next(iter(slots.values())))
    return f"{text}, original length {short}, window {long} tokens, {sum(len(g.layers) for g in groups)} layers"


def is_own_scheme(model: str | os.PathLike) -> bool:
    """True for a model rope-extend did not write (`rope-extend engines MODEL` audits it); False for a checkpoint
    whose config carries rope-extend's marker (checked against its plan: `parity`)."""
    from ..plan import recorded_spec
    from ..source import load_source

    return recorded_spec(load_source(model, config_only=True).config) is None


# --- a GGUF's own RoPE -------------------------------------------------------------------------------------------------
GGUF_REFERENCE = "llama.cpp's RoPE of this GGUF's metadata (rope-extend's port)"


def audit_gguf(path: str | os.PathLike, *, other_python: str | None = None) -> AuditReport:
    """Audit a GGUF's own RoPE (`rope-extend engines model.gguf`): what llama.cpp, the engine whose native format it
    is (`ServingEngine.native_format`), computes from its metadata is the reference; every other engine loads the
    GGUF's config through transformers' GGUF reader (`from_pretrained(..., gguf_file=...)`, which vLLM and SGLang use
    for a .gguf model too): what a conversion back carries, row by row, is compared with it."""
    import json
    import tempfile
    from pathlib import Path

    from ..gguf.info import VERIFIED_ARCHITECTURES, read_gguf_info
    from .registry import serving_engines

    info = read_gguf_info(path)
    if info.architecture not in VERIFIED_ARCHITECTURES or not info.context_length or not info.rope_dim:
        raise ValueError(f"{str(path)!r}: GGUF architecture {info.architecture!r} is not audited (rope-extend ports "
                         f"llama.cpp's RoPE for {', '.join(VERIFIED_ARCHITECTURES)}); convert it to Hugging Face and "
                         "audit that, or patch the original")
    native = next(engine for engine in serving_engines() if engine.native_format == "gguf")
    long = int(info.context_length)
    short = min(int(info.original_context_length or long), long)
    meta = {"context_length": long, "rope.dimension_count": info.rope_dim, "rope.freq_base": info.freq_base,
            **{f"rope.scaling.{key}": value for key, value in info.scaling.items()}}
    if info.rope_freqs is not None:
        meta["rope_freqs"] = info.rope_freqs
    refs = {n: native.gguf_served(meta, long, n) for n in (short, long)}
    config = _gguf_config(Path(path))
    group = Group(None, tuple(range(int(config.get("num_hidden_layers") or 0))))
    name = str(path)
    rows: list[AuditRow] = []

    def add(engine, route, command, results, kind=PORT):
        short_r, long_r = (r if isinstance(r, NotServed) else _compare(r, refs[n], n)
                           for n, r in zip((short, long), results))
        rows.append(AuditRow(engine, route, short_r, long_r, [], kind, layers=group.label, command=command))

    with tempfile.TemporaryDirectory(prefix="rope-extend-gguf-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        jobs = [(Path(tmp), sorted({short, long}))]
        lines = [(probes.run_here(jobs)[0], None), (probes.run_other(jobs, other_python)[0], "(other line)")]
    for (version, served), unnamed in lines:
        add(f"transformers {version or unnamed}", "the GGUF loaded back (gguf_file=)",
            f"AutoModelForCausalLM.from_pretrained(DIR, gguf_file={Path(path).name!r})", [served[short], served[long]],
            RUN)
    audited = AuditedModel(name=name, model_type=str(config.get("model_type", "")), loaded=config, raw=config,
                           groups=(group,), short=short, long=long, architectures=tuple(config.get("architectures") or ()))
    for engine in ported_engines():
        if not engine.gguf_through_transformers:
            continue  # it does not serve a .gguf (or, llama.cpp, it is the reference)
        for route in engine.audit_routes(audited):
            add(engine.row_name, f"{route.label} (its GGUF config)", route.command, list(route.results[group]))
    scheme = (f"{info.scaling_type if info.is_scaled else 'default'}"
              + (f" x{float(info.scaling['factor']):g}" if info.scaling.get("factor") else "")
              + (f", rope_freqs ({len(info.rope_freqs)} factors)" if info.rope_freqs else "")
              + f" (θ {info.freq_base:g}), original length {short}, window {long} tokens")
    import transformers
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    carried = {key: config[key] for key in ("rope_theta", "rope_parameters", "rope_scaling", "max_position_embeddings")
               if config.get(key) is not None}
    read = sorted(key for key in GGUF_CONFIG_MAPPING.get(info.architecture, {}) if key.startswith("rope."))
    note = (f"what the GGUF loaded back carries (transformers {transformers.__version__}'s GGUF reader, "
            f"integrations/ggml.py GGUF_CONFIG_MAPPING, which vLLM and SGLang use for a .gguf model): "
            f"{json.dumps(carried, sort_keys=True)}; of the RoPE keys it reads {', '.join(read) or 'none'}"
            + ("" if any(k.startswith("rope.scaling") for k in read) else ", no rope.scaling.* key")
            + ", and no rope_freqs tensor")
    if info.is_scaled:
        note += ("; so this GGUF's scaling is not served there: serve it in llama.cpp, or serve the patched Hugging "
                 "Face checkpoint in those engines")
    return AuditReport(name, f"GGUF {info.architecture}", scheme, native.row_name, short, long, [group], rows,
                       measured_against=GGUF_REFERENCE, notes=[note])


def _gguf_config(path) -> dict:
    """The config transformers' GGUF reader makes of the file's metadata (`from_pretrained(..., gguf_file=...)`),
    as a config.json dict."""
    import warnings

    from transformers import AutoConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    return config.to_dict()
