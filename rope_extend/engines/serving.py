"""How to serve a patched checkpoint at its new length in transformers, vLLM, SGLang and llama.cpp, exactly.

Each engine module in `rope_extend.engines` owns its per-method rule (`serving_rule`), checked against that
engine's source at a pinned version; this module only assembles them. `rope-extend engines` verifies every command
printed here by running it through the engine ports (see `rope_extend.engines.parity`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..plan import PatchPlan
from . import llama_cpp, sglang, transformers_engine, vllm
from .served import EngineHint

RULES = (transformers_engine.serving_rule, vllm.serving_rule, sglang.serving_rule, llama_cpp.serving_rule)
# The Serving section's first line: what "checked" means for these commands (rope_extend.engines.parity runs their
# settings through rope-extend's ports of each engine's config reading and RoPE; no engine is launched).
PORTS_RUN = (
    f"These commands were not run on this checkpoint. They follow each engine's source as read at {vllm.VERSION}, "
    f"{sglang.VERSION} and {llama_cpp.VERSION}; rope-extend checks them by running its ports of those engines' "
    "config reading and RoPE code (`rope_extend/engines/`) on the same settings and comparing the cos/sin they "
    "build with its own (`rope-extend engines` reruns it; `--run vllm` and `--run sglang` run the real engines). The "
    "lines marked run say what a real engine did with this method's commands on the project's own checkpoints, with "
    "the version it was checked on and the date."
)


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
    hints: tuple[EngineHint, ...]  # transformers, vLLM, SGLang, llama.cpp; their commands name `served.MODEL`

    @classmethod
    def of(cls, plan: PatchPlan) -> ServingHints:
        return cls(plan, tuple(rule(plan) for rule in RULES))

    def named(self, name: str) -> list[EngineHint]:
        """One `EngineHint` per engine for serving the checkpoint `name`."""
        return [hint.named(name) for hint in self.hints]

    @property
    def warnings(self) -> list[str]:
        return [w for hint in self.hints for w in hint.warnings]

    def serve(self, name: str) -> ServeHint:
        """The first of vLLM and SGLang that reproduces the method exactly (its hint has no warning), else stock
        transformers, else in-process with `patch_model` (which restores a method stock loaders read differently,
        e.g. dynamic-yarn). Every engine's command is in the model card and `rope-extend engines`."""
        hints = {hint.engine: hint for hint in self.named(name)}
        for engine in ("vLLM", "SGLang"):
            if hints[engine].command and not hints[engine].warnings:
                return ServeHint((hints[engine].command,), engine)
        load = f"model = AutoModelForCausalLM.from_pretrained({name!r})"
        method = self.plan.spec.method
        if not hints["transformers"].warnings:
            return ServeHint((load,), f"transformers: vLLM and SGLang do not reproduce {method} exactly; see the "
                             "warnings", python=True)
        return ServeHint((load, "rope_extend.patch_model(model)"), f"in-process: restores {method}, which stock "
                         "loaders and serving engines do not reproduce exactly; see the warnings", python=True)

    def markdown(self, name: str, unbacked: Mapping[tuple[str, str], str] | None = None) -> str:
        """The Serving section: every engine's commands for the checkpoint `name`, what the real vLLM and SGLang did
        with the method (`runs_lines`), then notes and warnings.

        unbacked: {(engine, "command" | "original"): why} -- the routes the written checkpoint's own parity check
        contradicts (`engines.parity.unbacked_routes`); each is named with that reason instead of its command, so
        the card never lists, as a way to serve the checkpoint, a route its own check marks DIFFERS or cannot serve
        at the target length."""
        unbacked = unbacked or {}
        hints = {hint.engine: hint for hint in self.named(name)}
        v, g, c = hints["vLLM"], hints["SGLang"], hints["llama.cpp"]

        def line(label: str, engine: str, which: str, command: str) -> str:
            why = unbacked.get((engine, which))
            return f"{label}: `{command}`" if why is None else f"{label}: none listed: {why}"

        lines = [
            line("- vLLM", "vLLM", "command", v.command),
            line("  - same scaling on the original model", "vLLM", "original", v.original),
            *runs_lines("vllm", self.plan.spec.method),
            line("- SGLang", "SGLang", "command", g.command),
            line("  - same scaling on the original model", "SGLang", "original", g.original),
            *runs_lines("sglang", self.plan.spec.method),
        ]
        if c.original is not None:
            lines.append(line("- llama.cpp, original GGUF", "llama.cpp", "original", c.original))
        if c.command is not None:
            lines.append(line("- llama.cpp, GGUF converted from this checkpoint (convert_hf_to_gguf.py)", "llama.cpp",
                              "command", c.command))
        notes = [n for hint in self.hints for n in hint.notes]
        text = PORTS_RUN + "\n\n" + "\n".join(lines)
        if notes:
            text += "\n\n" + "\n".join(f"> Note: {n}" for n in notes)
        if self.warnings:
            text += "\n\n" + "\n".join(f"> Warning: {w}" for w in self.warnings)
        return text


def engine_hints(plan: PatchPlan, out: str) -> list[EngineHint]:
    """One `EngineHint` per engine (transformers, vLLM, SGLang, llama.cpp) for serving `out`."""
    return ServingHints.of(plan).named(out)


def serve_hint(plan: PatchPlan, out: str) -> ServeHint:
    """`ServingHints.serve` for one plan and one name."""
    return ServingHints.of(plan).serve(out)


def serve_command(plan: PatchPlan, out: str) -> str:
    """`serve_hint` as one line that pastes whole (a shell command, or Python with its comment)."""
    return str(serve_hint(plan, out))


def serving_hints(plan: PatchPlan, out: str,
                  unbacked: Mapping[tuple[str, str], str] | None = None) -> tuple[str, list[str]]:
    """(markdown with commands, warnings) for serving `out` at the plan's target length (`ServingHints.markdown`;
    `unbacked`: the routes the written checkpoint's own parity check contradicts)."""
    hints = ServingHints.of(plan)
    return hints.markdown(out, unbacked), hints.warnings


def runs_lines(engine: str, method: str) -> list[str]:
    """What the real run engine `engine` did with `method`'s commands, as the project ran them
    (`rope_extend/engines/<engine>_runs.json`, from eval/reports/<engine>-engines-*/): one line per record, with the
    engine, its version, the device and the date (the version the line was checked on: the commands above follow
    the port's)."""
    from .runs import lookup, recorded_runs

    adapter = lookup(engine)
    words = {"yes": "identical at both lengths", "up to L": "identical up to the original window only",
             "at s·L only": "identical at the target length only", "no": "not identical"}
    return [
        f"  - run (not on this checkpoint): {run['engine']} on {run['device'] or 'cpu'} served `{method}` x{run['factor']:g}"
        f" on {RUN_MODELS.get(run['model'], run['model'])} through both {adapter.title} routes"
        f" ({' and '.join(run['ways'])}), {run['tokens'][0]} and {run['tokens'][1]} tokens, on {run['date']}:"
        f" {words.get(run['verdict'], run['verdict'])} (rope-extend's {run['record']})"
        for run in recorded_runs(adapter, method)
    ]


RUN_MODELS = {"smollm2": "SmolLM2-135M", "short-window": "SmolLM2-135M's first 2 layers (window 256)"}
