"""How to serve a patched checkpoint at its new length in every registered engine, exactly.

Each engine room (`registry`) owns its rules and routes (`ServingEngine.hint`), checked against that engine's source
at a pinned release; this module only assembles them, in the registry's order, for the terminal, the card and the
record. `rope-extend engines` verifies every command printed here by running it through the engine ports (see
`rope_extend.engines.parity`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..plan import PatchPlan
from .hint import EngineHint
from .registry import ported_engines, serving_engines
from .written import Written


def ports_run() -> str:
    """The Serving section's first line: what "checked" means for these commands (rope_extend.engines.parity runs
    their settings through rope-extend's ports of each engine's config reading and RoPE; no engine is launched)."""
    ported = ported_engines()
    runs = [engine.run for engine in ported if engine.run is not None]
    return (
        f"These commands were not run on this checkpoint. They follow each engine's source as read at "
        f"{_and([engine.version for engine in ported])}; rope-extend checks them by running its ports of those "
        "engines' config reading and RoPE code (`rope_extend/engines/`) on the same settings and comparing the "
        f"cos/sin they build with its own (`rope-extend engines` reruns it; "
        f"{_and([f'`--run {adapter.name}`' for adapter in runs])} run the real engines). The lines marked run say "
        "what a real engine did with this method's commands on the project's own checkpoints, with the version it "
        "was checked on and the date."
    )


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


@dataclass(frozen=True)
class ServeHint:
    """The one way to serve a checkpoint a newcomer should try first: a shell command (its path quoted with shlex,
    so it pastes whole) or, when no engine reproduces the method, Python statements; `why` names the engine."""

    lines: tuple[str, ...]  # one shell command, or Python statements
    why: str
    python: bool = False

    @property
    def command(self) -> str:
        return "; ".join(self.lines)

    def __str__(self) -> str:
        """One line that pastes as it is: a shell command alone, or Python with `why` as its comment."""
        return f"{self.command}  # {self.why}" if self.python else self.command


@dataclass(frozen=True)
class ServingHints:
    """Every engine's hint for one plan, computed once (`of`) and then named for each place that prints the
    commands: OUT's path on the terminal, OUT's folder name or the Hub repo in the card, `record.MODEL_ID` in the
    record."""

    plan: PatchPlan
    hints: tuple[EngineHint, ...]  # one per registered engine, the reference first; commands name `hint.MODEL`

    @classmethod
    def of(cls, plan: PatchPlan, config: Mapping | None = None) -> ServingHints:
        """`config`: the source's or the written config.json (its model type and features: `Written.of`)."""
        written = Written.of(plan, config)
        return cls(plan, tuple(engine.hint(written) for engine in serving_engines()))

    def named(self, name: str) -> list[EngineHint]:
        """One `EngineHint` per engine for serving the checkpoint `name`."""
        return [hint.named(name) for hint in self.hints]

    @property
    def warnings(self) -> list[str]:
        return [w for hint in self.hints for w in hint.warnings]

    def serve(self, name: str) -> ServeHint:
        """The first engine (by `first_choice`) that reproduces the method exactly (its hint has no warning and its
        rules cover the checkpoint), else stock transformers, else in-process with `patch_model` (which restores a
        method stock loaders read differently, e.g. dynamic-yarn). Every engine's command is in the model card and
        `rope-extend engines`."""
        hints = {hint.engine: hint for hint in self.named(name)}
        ranked = sorted((engine.first_choice, engine.name) for engine in serving_engines()
                        if engine.first_choice is not None)
        for _, engine in ranked:
            if hints[engine].exact:
                return ServeHint((hints[engine].command,), hints[engine].title)
        load = f"model = AutoModelForCausalLM.from_pretrained({name!r})"
        method = self.plan.spec.method
        reference = next(hint for hint in hints.values() if not _ported(hint))
        titles = " and ".join(hints[engine].title for _, engine in ranked)
        if not reference.warnings:
            return ServeHint((load,), f"transformers: {titles} do not reproduce {method} exactly; see the "
                             "warnings", python=True)
        return ServeHint((load, "rope_extend.patch_model(model)"), f"in-process: restores {method}, which stock "
                         "loaders and serving engines do not reproduce exactly; see the warnings", python=True)

    def markdown(self, name: str, unbacked: Mapping[tuple[str, str], str] | None = None) -> str:
        """The Serving section: every engine's commands for the checkpoint `name`, in the registry's order, with what
        the real engines did with the method (`runs_lines`), then notes and warnings.

        unbacked: {(engine title, card line): why} -- the routes the written checkpoint's own parity check
        contradicts (`engines.parity.unbacked_routes`); each is named with that reason instead of its command, so
        the card never lists, as a way to serve the checkpoint, a route its own check marks DIFFERS or cannot serve
        at the target length."""
        unbacked = unbacked or {}
        lines: list[str] = []
        for engine, hint in zip(serving_engines(), self.named(name)):
            if not engine.ported:
                continue  # transformers: the card's Provenance and the warnings say what it loads
            if hint.unchecked:
                lines.append(f"- {hint.title}: unchecked: {hint.unchecked}")
                continue
            for route in hint.routes:
                if route.command is None and not route.listed:
                    continue
                why = unbacked.get((hint.title, route.line))
                lines.append(f"{route.card}: `{route.command}`" if why is None else f"{route.card}: none listed: {why}")
            if engine.run is not None:
                lines += runs_lines(engine, self.plan.spec.method)
        notes = [n for hint in self.hints for n in hint.notes]
        text = ports_run() + "\n\n" + "\n".join(lines)
        if notes:
            text += "\n\n" + "\n".join(f"> Note: {n}" for n in notes)
        if self.warnings:
            text += "\n\n" + "\n".join(f"> Warning: {w}" for w in self.warnings)
        return text


def _ported(hint: EngineHint) -> bool:
    from .registry import get_engine

    return get_engine(hint.engine).ported


def engine_hints(plan: PatchPlan, out: str, config: Mapping | None = None) -> list[EngineHint]:
    """One `EngineHint` per engine for serving `out`."""
    return ServingHints.of(plan, config).named(out)


def serve_hint(plan: PatchPlan, out: str, config: Mapping | None = None) -> ServeHint:
    """`ServingHints.serve` for one plan and one name."""
    return ServingHints.of(plan, config).serve(out)


def serve_command(plan: PatchPlan, out: str, config: Mapping | None = None) -> str:
    """`serve_hint` as one line that pastes whole (a shell command, or Python with its comment)."""
    return str(serve_hint(plan, out, config))


def serving_hints(plan: PatchPlan, out: str, unbacked: Mapping[tuple[str, str], str] | None = None,
                  config: Mapping | None = None) -> tuple[str, list[str]]:
    """(markdown with commands, warnings) for serving `out` at the plan's target length (`ServingHints.markdown`;
    `unbacked`: the routes the written checkpoint's own parity check contradicts)."""
    hints = ServingHints.of(plan, config)
    return hints.markdown(out, unbacked), hints.warnings


def runs_lines(engine, method: str) -> list[str]:
    """What the real engine (a `ServingEngine` with a run adapter) did with `method`'s commands, as the project ran
    them (`rope_extend/engines/<name>/runs.json`, from eval/reports/<name>-engines-*/): one line per record, with
    the engine, its version, the device and the date (the version the line was checked on: the commands above
    follow the port's), citing the rope-extend release that ships the record (a path of the project's repository
    means nothing on a Hub page)."""
    from .. import __version__
    from .runs import recorded_runs

    adapter = engine.run
    words = {"yes": "identical at both lengths", "up to L": "identical up to the original window only",
             "at s·L only": "identical at the target length only", "no": "not identical"}
    return [
        f"  - run (not on this checkpoint): {run['engine']} on {run['device'] or 'cpu'} served `{method}` x{run['factor']:g}"
        f" on {RUN_MODELS.get(run['model'], run['model'])} through both {adapter.title} routes"
        f" ({' and '.join(run['ways'])}), {run['tokens'][0]} and {run['tokens'][1]} tokens, on {run['date']}:"
        f" {words.get(run['verdict'], run['verdict'])} (recorded in rope-extend {__version__}; the run took"
        f" {run['seconds']} s on a 2-core CPU at load {run['load']})"
        for run in recorded_runs(adapter, method)
    ]


RUN_MODELS = {"smollm2": "SmolLM2-135M", "short-window": "SmolLM2-135M's first 2 layers (window 256)"}
