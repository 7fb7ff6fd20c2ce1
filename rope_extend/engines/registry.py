"""The serving engines, one registered room each.

A room is a package `rope_extend/engines/<name>/` holding everything rope-extend knows about one engine: its port
(the engine's config reading and RoPE, pinned to a release, with the files it follows), its rules (what it does with
what a checkpoint writes, keyed by what the engine itself reads: its rope_type dispatch, the config keys it honours,
the override syntax it parses), its card lines and, where it runs here, its run adapter and environment. Its
`ServingEngine` is registered once (`register`, at the end of the room's `__init__.py`); the parity report, the
audit, the serving hints, the card, the docs' tables and `engines --run` loop over `serving_engines()`.

Fail closed: an engine whose rules do not cover a checkpoint -- a rope_type without a rule, a config feature its
port does not model (`written.FEATURES`), an architecture it routes elsewhere -- gives a hint marked `unchecked` with
the reason, and every one of its routes is reported unchecked, never identical.

Adding an engine: a folder with a `ServingEngine` subclass (`name`, `title`, `version`, `rope_types`, `features`,
`serve`, `served`, `audit_routes`, optionally `run`) and one registration line (docs/development.md, "Adding a
serving engine"). A test registers a throwaway engine from outside the package (`registered`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

from .hint import COMMAND, ORIGINAL, EngineHint, Route
from .served import NotServed, Served, Unchecked
from .written import FEATURES, Written

if TYPE_CHECKING:
    from .run_engine import RunEngine


@dataclass
class Rule:
    """What an engine does with one written checkpoint, by the rope_type it reads: every way it differs from
    rope-extend (`warnings`), facts a user needs (`notes`), and the longest request its command serves (`max_len`;
    None: the target length)."""

    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    max_len: int | None = None


@dataclass(frozen=True)
class AuditedModel:
    """A model rope-extend did not write, as the audit gives it to every engine room.

    name: as the user named it (a Hub id or a folder), quoted into the commands; loaded: the text config as
    transformers 5 loads it (class defaults filled in: what vLLM and SGLang read); raw: config.json's text part as
    written (what convert_hf_to_gguf.py and mlx-lm read); groups: the layer groups sharing one RoPE (`layer_type`
    None: every layer); short / long: the request lengths (the pretraining length, the window), which the routes'
    commands serve; requests: the lengths a room computes its results at, when they are not (short, long): the
    lengths a run measured (`engines.audit_run`), so that the port stands beside the run at the same lengths."""

    name: str
    model_type: str
    loaded: Mapping[str, Any]
    raw: Mapping[str, Any]
    groups: tuple[Any, ...]
    short: int
    long: int
    architectures: tuple[str, ...] = ()
    features: frozenset[str] = frozenset()
    requests: tuple[int, int] | None = None

    @property
    def lengths(self) -> tuple[int, int]:
        """The (short, long) request lengths a room's `audit_routes` gives results for."""
        return self.requests or (self.short, self.long)


@dataclass(frozen=True)
class AuditRoute:
    """One route of an engine for an audited model: its label, the exact command, per layer group the short and the
    long request (`AuditedModel.lengths`) as the engine serves them (`Served`) or why not (`NotServed`), and the
    engine's own typed settings behind the command (`VllmServing`...: what its run adapter serves; None: a route a
    run cannot serve)."""

    label: str
    command: str
    results: Mapping[Any, tuple[Served | NotServed, Served | NotServed]]
    settings: Any = None


class ServingEngine:
    """One serving engine's room. Subclass it in `rope_extend/engines/<name>/` and `register` an instance.

    name: the registry key ("vllm"); title: as users and the card name it ("vLLM"); version: the release its port
    and rules follow ("vLLM 0.34.0"); row_name: how a report's rows name it (default: the version).
    rope_types: the rope_types its rules cover; features: the config features (`written.FEATURES`) its port models.
    first_choice: its place among the engines `serve_hint` proposes when they serve a checkpoint exactly (None:
    never proposed first).
    ported: its rows come from its port (`served`); False for the reference, transformers, run as a library.
    native_format: a model file format the engine reads natively ("gguf": llama.cpp); its port gives that format's
    own RoPE (`gguf_served`), what the audit of such a file compares every other engine with.
    gguf_through_transformers: the engine serves a .gguf model by reading its config with transformers' GGUF reader
    (vLLM, SGLang): the audit of a GGUF gives it a row.
    """

    name: ClassVar[str]
    title: ClassVar[str]
    version: ClassVar[str]
    rope_types: ClassVar[tuple[str, ...]] = ()
    features: ClassVar[frozenset[str]] = frozenset()
    first_choice: ClassVar[int | None] = None
    ported: ClassVar[bool] = True
    native_format: ClassVar[str | None] = None  # the model file format the engine reads natively ("gguf")
    gguf_through_transformers: ClassVar[bool] = False  # it serves a .gguf model with transformers' GGUF reader
    # The routes the card lists, in order, as skeletons (commands and settings filled in by `serve`).
    routes: ClassVar[tuple[Route, ...]] = ()

    @property
    def row_name(self) -> str:
        return self.version

    # -- the rules ----------------------------------------------------------------------------------------------
    def hint(self, written: Written) -> EngineHint:
        """How to serve the written checkpoint: `serve`'s hint, or an unchecked one when the rules do not cover it."""
        reason = self.unchecked(written)
        if reason is not None:
            return EngineHint(self.name, self.title, self.version, self.routes, unchecked=reason)
        return self.serve(written)

    def unchecked(self, written: Written) -> str | None:
        """Why this engine's rules do not cover the checkpoint (None: they do): a rope_type without a rule, or a config
        feature its port does not model. A room adds its own cases (an architecture it routes elsewhere)."""
        if written.rope_type not in self.rope_types:
            return (f"{self.version}'s rules here cover rope_type {', '.join(self.rope_types)}, not "
                    f"{written.rope_type!r}")
        missing = sorted(written.features - self.features)
        if missing:
            return f"rope-extend's port of {self.version} does not model {FEATURES[missing[0]]}"
        return None

    def serve(self, written: Written) -> EngineHint:
        """The routes with their commands and settings, the warnings and notes, for a checkpoint the rules cover."""
        raise NotImplementedError

    def attention_rule(self, written: Written) -> Rule:
        """A method that acts on attention: the engine serves the model's own RoPE and attention, up to L."""
        at = written.attention
        return Rule(max_len=written.original_length, warnings=[
            f"{self.version} serves {at.served} from this checkpoint ({at.own}), so the command serves "
            f"{written.original_length} tokens: {at.elsewhere}"
        ])

    def with_method_rules(self, rule: Rule, written: Written) -> Rule:
        """`rule` (what the engine does with the rope type it reads) with what it does with the method besides: one
        acting on attention (`attention_rule`), a slot stock loaders read as another method (`read_as_rule`)."""
        for extra in (self.attention_rule(written) if written.attention else None,
                      self.read_as_rule(written) if written.read_as else None):
            if extra is not None:
                rule.warnings += extra.warnings
                rule.max_len = extra.max_len or rule.max_len
        return rule

    def read_as_rule(self, written: Written) -> Rule:
        """A slot stock loaders read as another method (dynamic-yarn written as static yarn)."""
        return Rule(warnings=[
            f"{self.version} serves {written.method} as static {written.read_as} x{written.factor:g} at every "
            f"length: prompts shorter than {written.target_length} tokens differ from rope-extend's {written.method} "
            "(below the original length it keeps the original RoPE); only rope_extend.patch_model reproduces it"
        ])

    # -- the port -----------------------------------------------------------------------------------------------
    def served(self, route: Route, config: Mapping[str, Any], n: int) -> Served | NotServed:
        """What the engine applies to a request of n tokens served through `route` (its settings) from `config`
        (this checkpoint's config.json, or the original model's for a route with `original`)."""
        raise NotImplementedError

    def audit_routes(self, model: AuditedModel) -> list[AuditRoute]:
        """The routes of an audited model (its config as it is, and the overrides that make the engine serve what
        transformers computes, where it needs them)."""
        return []

    def audit_unchecked(self, model: AuditedModel, rope: Mapping[str, Any]) -> str | None:
        """`unchecked` for a model's own RoPE (`rope`: its full-attention slot as the engine reads it)."""
        kind = str(rope.get("rope_type", rope.get("type", "default")))
        if kind not in self.rope_types:
            return f"{self.version}'s rules here cover rope_type {', '.join(self.rope_types)}, not {kind!r}"
        missing = sorted(model.features - self.features)
        if missing:
            return f"rope-extend's port of {self.version} does not model {FEATURES[missing[0]]}"
        return None

    # -- the real engine ----------------------------------------------------------------------------------------
    @property
    def run(self) -> RunEngine | None:
        """Its run adapter (`engines.runs.RunEngine`) where rope-extend runs the real engine, else None."""
        return None

    def __repr__(self) -> str:
        return f"<ServingEngine {self.name}>"


def unchecked_results(reason: str, lengths: Sequence[int]) -> list[Unchecked]:
    return [Unchecked(reason) for _ in lengths]


_REGISTRY: dict[str, ServingEngine] = {}


def register(engine: ServingEngine) -> ServingEngine:
    """Add a serving engine (once per name) and return it. Its run adapter is not touched here (it loads with the
    engine's environment code only when a run needs it); `runs.run_engines` checks that their `--run` names differ."""
    if not isinstance(engine, ServingEngine):
        raise TypeError(f"{engine!r} is not a ServingEngine (rope_extend.engines.registry)")
    if engine.name in _REGISTRY:
        raise ValueError(f"serving engine {engine.name!r} is registered already")
    for route in engine.routes:
        if route.line not in (COMMAND, ORIGINAL):
            raise ValueError(f"{engine.name!r}: route {route.label!r} has card line {route.line!r}, not "
                             f"{COMMAND!r} or {ORIGINAL!r}")
    _REGISTRY[engine.name] = engine
    return engine


def serving_engines() -> list[ServingEngine]:
    """Every registered engine, in registration order (the reference, transformers, first)."""
    return list(_REGISTRY.values())


def get_engine(name: str) -> ServingEngine:
    if name not in _REGISTRY:
        raise ValueError(f"serving engine {name!r}: expected one of {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def ported_engines() -> list[ServingEngine]:
    """The engines whose rows come from their ports (all but the reference)."""
    return [engine for engine in _REGISTRY.values() if engine.ported]


@contextmanager
def registered(engine: ServingEngine) -> Iterator[ServingEngine]:
    """`engine` registered for the duration of a `with` block (a throwaway engine in a test)."""
    register(engine)
    try:
        yield engine
    finally:
        _REGISTRY.pop(engine.name, None)


def with_route(hint: EngineHint, label: str, **changes: Any) -> EngineHint:
    """`hint` with the route `label` changed (`command`, `settings`...)."""
    return replace(hint, routes=tuple(replace(r, **changes) if r.label == label else r for r in hint.routes))
