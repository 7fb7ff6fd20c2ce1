"""How to serve a checkpoint in one engine: its routes (each a printed command and the settings behind it), every
way it differs from rope-extend, and whether its rules cover the checkpoint at all.

An engine room builds one `EngineHint` per plan (`ServingEngine.hint`); the card prints its routes, the parity
report runs each route's `settings` through the engine's port, and a run engine serves them for real. The commands
name the checkpoint `MODEL` until `named` puts a name there.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

# Where an engine's command names the checkpoint: `EngineHint.named` puts the name there, quoted the engine's way.
MODEL = "{model}"
COMMAND, ORIGINAL = "command", "original"  # which card line a route is: this checkpoint's, or the original model's


@dataclass(frozen=True)
class Route:
    """One way to serve the checkpoint in an engine.

    label: as the report's rows name it ("this checkpoint", "original model + --hf-overrides").
    line: which card line it is (`COMMAND`: serving this checkpoint; `ORIGINAL`: the same scaling on the original
        model) and `card`: the card's words before the command ("- vLLM", "  - same scaling on the original model").
    original: it serves the original model's config.json (with the overrides or flags in `settings`).
    command: the printed command (None: no command reproduces the method this way; the card says why).
    settings: the engine's own typed settings (`VllmServing`...), read back by its port and its run adapter.
    column: the route's column in docs/serving.md's table.
    listed: the card lists the route even without a command (False: left out when `command` is None).
    """

    label: str
    line: str
    card: str
    original: bool
    command: str | None
    settings: Any = None
    column: str = ""
    listed: bool = True

    def filled(self, command: str | None, settings: Any = None) -> Route:
        """This route with its command and settings (a room's skeleton route filled in for one checkpoint)."""
        return replace(self, command=command, settings=settings)


@dataclass(frozen=True)
class EngineHint:
    """One engine's routes for a plan, as the card prints them and the parity report checks them.

    engine: the engine's registry name ("vllm"); title: as users name it ("vLLM"); version: what its rules follow.
    warnings: every way the engine differs from rope-extend, each naming the engine and the reason.
    notes: facts a user needs that are not differences (conversion steps, environment variables).
    unchecked: why the engine's rules do not cover this checkpoint (an unknown rope_type, a config feature its port
        does not model, an architecture it routes elsewhere): every route is then reported "unchecked", never
        identical.
    quote: how a command quotes the checkpoint's name (shell quoting; `repr` for Python).
    """

    engine: str
    title: str
    version: str
    routes: tuple[Route, ...]
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    unchecked: str | None = None
    quote: Callable[[str], str] = field(default=shlex.quote, repr=False)

    def named(self, name: str) -> EngineHint:
        """This hint with its commands naming the checkpoint `name` (a path, a Hub id, the record's MODEL_ID)."""
        routes = tuple(r if r.command is None else replace(r, command=r.command.replace(MODEL, self.quote(name)))
                       for r in self.routes)
        return replace(self, routes=routes)

    def route(self, line: str) -> Route | None:
        """The route printed on card line `line` (`COMMAND` or `ORIGINAL`), None when the engine has none."""
        return next((r for r in self.routes if r.line == line), None)

    @property
    def command(self) -> str | None:
        """The command serving this checkpoint (None: none reproduces it)."""
        route = self.route(COMMAND)
        return None if route is None else route.command

    @property
    def exact(self) -> bool:
        """The command serves the checkpoint as rope-extend does: listed, covered by the rules, no warning."""
        return self.command is not None and not self.warnings and self.unchecked is None


def fmt_float(value: float) -> str:
    """A number with at least 9 significant digits (bases, magnitudes), without noise for round values."""
    return f"{float(value):.10g}"


def compact_json(value: Any) -> str:
    """JSON without spaces: an override as an engine's command line takes it."""
    return json.dumps(value, separators=(",", ":"))


def env_prefix(env: dict[str, str]) -> str:
    """`KEY=VALUE ` for each environment variable a command needs, in order."""
    return "".join(f"{key}={value} " for key, value in env.items())
