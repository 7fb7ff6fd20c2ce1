"""The method registry: one `RopeMethod` object per scaling method, registered once by name, with its adapters.

A method object owns its math and what it writes, so nothing outside `methods/` branches on a method name:

- `params`: the parameters it reads, with types, defaults, checks and docs: their one declaration (`rope_extend.spec`
  builds each method's spec class from them); what a method reads of a spec is `MethodSpec`, declared here, so
  methods/ imports nothing from the spec's layer;
- `compute(ctx) -> (inv_freq, attention_factor)`: the math, one contract like transformers' `ROPE_INIT_FUNCTIONS`;
- `config_slot(...)`: how it is written into a config's `rope_parameters` slot, and `stock_method`: what stock
  loaders build from that slot (dynamic-yarn is read as static YaRN); `max_position_embeddings(spec)`: the length
  written to the config; `loader_notes(spec)` / `marker_note(spec)`: what stock loaders make of it;
- `formula`, `use_when`, `paper`: the docs behind `rope-extend methods` and the method table in docs/methods.md.

What a serving engine does with what a method writes is the engine's own knowledge, in its room
(`rope_extend.engines.<name>`), keyed by the config it reads: no method names an engine. What other parts of the
project need to know about a method lives in small adapters registered beside it (in the
method's own file, like transformers' `ROPE_INIT_FUNCTIONS` and `ROPE_VALIDATION_FUNCTIONS` are separate tables
keyed by rope type), each a class bound to its method with defaults here:

- `GgufRules` (`gguf_rules(method)`): the llama.cpp GGUF metadata that makes llama.cpp serve it, or the refusal;
- `Advice` (`advice(method)`): what `inspect --recommend` and `tune` say and try (preference, alternatives, tune
  candidates).

`RopeContext` carries everything `compute` may read: rotary dimension, base, original (pretraining) length, factor,
method parameters, and, for dynamic methods, the current sequence length. Absent parameters take the method's
defaults. Adding a method = one file with a `RopeMethod` subclass (and the adapters it needs) registered here, plus
rows in the test tables.

No heavy import at module top, here or in any `methods/*.py`: `import torch` (numpy, transformers) goes inside the
function that computes, so `rope-extend --help`, `methods` and `validate` read the registry without loading torch
(tests/test_cli_startup.py fails otherwise). Type hints may name torch under `if TYPE_CHECKING:`.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ..errors import SpecError

if TYPE_CHECKING:  # torch and numpy are imported inside the functions that compute (see the module docstring)
    import numpy as np
    import torch

    from ..facts import RopeFacts


class MethodSpec(Protocol):
    """What a method reads of a resolved spec (`rope_extend.spec.RopeSpec` is one): the core fields, the parameters
    set explicitly, a copy with derived parameters written out (`fill_params`), and each of its own parameters as an
    attribute (`spec.beta_fast`, None where not set)."""

    method: str
    factor: float | None
    target_length: int | None
    original_max_position_embeddings: int | None
    replace_existing: bool

    def method_params(self) -> dict[str, Any]: ...

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> MethodSpec: ...

    def __getattr__(self, name: str) -> Any: ...


@dataclass(frozen=True)
class RopeContext:
    """Inputs of a scaling method.

    rotary_dim: head_dim * partial_rotary_factor (even).
    base: rope_theta.
    original_max_position_embeddings: the pretraining length L.
    factor: the scale s (>= 1).
    params: method parameters (beta_fast, mscale, low_freq_factor, ...); absent keys take the method defaults.
    seq_len: current sequence length, only read by dynamic methods (None = at construction).
    device: where to build the tensors.
    """

    rotary_dim: int
    base: float
    original_max_position_embeddings: int
    factor: float = 1.0
    params: Mapping[str, Any] = field(default_factory=dict)
    seq_len: int | None = None
    device: torch.device | str | None = None

    def param(self, name: str, default: Any = None) -> Any:
        value = self.params.get(name)
        return default if value is None else value


@dataclass(frozen=True)
class Param:
    """A method parameter: its type, default (None = derived or required), a one-line doc and a range check."""

    kind: type  # float, int, bool or list (of floats)
    default: Any
    doc: str
    positive: bool = False  # numbers must be > 0; lists must hold finite numbers > 0
    derived: str | None = None  # how `fill_params` derives a None default, shown as the default ("L/8")

    def check(self, value: Any) -> None:
        """Raise ValueError (naming the value and the rule) if `value` breaks the rule."""
        if self.kind is list:
            if not value:
                raise ValueError("must be a non-empty list with one factor per rotary frequency (rotary_dim / 2)")
            bad = [v for v in value if not math.isfinite(v) or (self.positive and v <= 0)]
            if bad:
                raise ValueError(f"every factor must be a finite number > 0, got {bad[0]}")
        elif self.positive and value is not None and value <= 0:
            raise ValueError(f"must be > 0, got {value}")


def gguf_refusal(what: str, why: str, instead: str) -> SpecError:
    return SpecError(f"llama.cpp cannot express {what} in a GGUF: {why}; {instead}", field="method", value=what)


def fmt(value: float) -> str:
    """A number with at least 9 significant digits (bases, magnitudes), without noise for round values."""
    return f"{float(value):.10g}"


def default_inv_freq(dim: int, base: float, device=None) -> torch.Tensor:
    """theta_i = base^(-2i/d), computed with the same float32 op order as transformers."""
    import torch

    exponent = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
    return 1.0 / (base**exponent)


# Keys of a RoPE slot that describe a scaling scheme (replaced by the new method's), as opposed to the model's own.
SCHEME_KEYS = frozenset({
    "rope_type", "type", "rope_theta", "factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
    "beta_slow", "mscale", "mscale_all_dim", "low_freq_factor", "high_freq_factor", "short_factor", "long_factor",
    "truncate", "short_mscale", "long_mscale",
})


class RopeMethod:
    """A scaling method. Subclass it in one file under `methods/` and `register()` an instance."""

    name: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()  # other spellings users and tools use
    params: ClassVar[Mapping[str, Param]] = {}
    dynamic: ClassVar[bool] = False  # recomputed from the current length at run time
    switches_at_original: ClassVar[bool] = False  # dynamic with two states only: up to L, and beyond L (longrope)
    # Acts on attention (self-extend, dual-chunk, STRING): the RoPE stays the model's own and `install_attention`
    # remaps the positions attention sees; stock loaders serve the model without the method.
    acts_on_attention: ClassVar[bool] = False
    # Keeps the model's own RoPE scheme and window as shipped (the attention-level methods): config.json's RoPE and
    # max_position_embeddings are unchanged, the original length L is the window the model claims (Llama 3.1:
    # 131072), and `PatchPlan.compute` is the model's own frequencies and attention factor, on which
    # `install_attention` builds.
    keeps_scheme: ClassVar[bool] = False
    # Useful inside the window the model claims, without a longer target (STRING): a spec needs no factor. Every
    # other method must reach beyond the length it counts from (`plan._check_reach` refuses factor 1).
    works_inside_window: ClassVar[bool] = False
    static_counterpart: ClassVar[str | None] = None  # the static method a dynamic one becomes where it cannot run
    needs_factor: ClassVar[bool] = True  # a spec names a factor or a target length (all but `works_inside_window`)
    # The transformers `rope_type` written to the config slot; stock loaders build this method from it.
    hf_rope_type: ClassVar[str] = "default"
    # Slot keys (besides rope_type/rope_theta) this method writes; explicit attention factor where it has one.
    slot_keys: ClassVar[tuple[str, ...]] = ()
    writes_attention_factor: ClassVar[bool] = False
    formula: ClassVar[str]  # inverse frequencies
    attention: ClassVar[str] = "1"  # the attention factor (multiplies cos and sin)
    use_when: ClassVar[str]
    paper: ClassVar[str]

    # -- math -------------------------------------------------------------------------------------------------
    def compute(self, ctx: RopeContext) -> tuple[torch.Tensor, float]:
        """(inv_freq float32 [rotary_dim // 2], attention factor) with the method's defaults filled in."""
        defaults = {key: p.default for key, p in self.params.items() if p.default is not None}
        if any(ctx.params.get(key) is None for key in defaults):
            ctx = replace(ctx, params={**defaults, **{k: v for k, v in ctx.params.items() if v is not None}})
        inv_freq, attention_factor = self._compute(ctx)
        return inv_freq, float(attention_factor)

    def _compute(self, ctx: RopeContext) -> tuple[torch.Tensor, float]:
        raise NotImplementedError

    # -- spec -------------------------------------------------------------------------------------------------
    def validate(self, spec: MethodSpec) -> None:
        """Cross-parameter rules; raise ValueError naming the values and the fix."""

    def depends_on_length(self, spec: dict) -> bool:
        """Whether the output at a position depends on the sequence's length (`spec` as a dict, defaults not filled
        in): dynamic methods, and attention-level ones with a length-dependent scale. The evaluation then gives
        each perplexity length its own forward."""
        return self.dynamic

    def fill_params(self, spec: MethodSpec) -> MethodSpec:
        """The resolved spec with derived parameters written out (attention methods pick G/W from the target
        length); raise SpecError for impossible combinations. Default: unchanged."""
        return spec

    def install_attention(self, model, plan) -> list[Any]:
        """Attention-level methods: install on `model` and return removable handles (`.remove()` restores)."""
        return []

    def defaults(self) -> dict[str, Any]:
        return {key: p.default for key, p in self.params.items()}

    # -- config -----------------------------------------------------------------------------------------------
    @property
    def stock_method(self) -> RopeMethod:
        """The method stock loaders (transformers, vLLM...) build from this method's config slot at load time."""
        return self

    def config_slot(self, spec: MethodSpec, base_slot: dict, rotary_dim: int, base_theta: float) -> dict:
        """The transformers-5-style RoPE parameters of one slot after applying a resolved spec.

        `base_slot` is the pristine slot (its `partial_rotary_factor` and model-provided lists are kept).
        """
        slot: dict[str, Any] = {"rope_type": self.hf_rope_type, "rope_theta": base_theta}
        # Keys the model's own code reads besides the scaling (partial_rotary_factor, Ministral 3's
        # llama_4_scaling_beta, mrope sections...) are kept; the old scheme's keys are not.
        slot.update({key: value for key, value in base_slot.items() if key not in SCHEME_KEYS})
        if self.hf_rope_type == "default":
            return slot
        slot["factor"] = spec.factor
        values = {**self.defaults(), **spec.method_params()}
        for key in self.slot_keys:
            if key == "original_max_position_embeddings":
                slot[key] = spec.original_max_position_embeddings
            elif values.get(key) is not None:
                slot[key] = values[key]
        return slot

    def context_params(self, spec: MethodSpec, slot: dict) -> dict[str, Any]:
        """The parameters `compute` reads for one config slot (explicit spec values; lists may come from the slot)."""
        return spec.method_params()

    def original_length(self, facts: RopeFacts, slot: str | None) -> int | None:
        """The original length L a spec that names none counts its factor from on a model (`facts`): the model's
        pretraining length (a shipped scheme's original length)."""
        return facts.original_length(slot)

    def max_position_embeddings(self, spec: MethodSpec) -> int:
        """`max_position_embeddings` written to the config: the target length (dynamic methods: the threshold L)."""
        return int(spec.target_length)

    def loader_notes(self, spec: MethodSpec) -> list[str]:
        """Warnings for users of stock loaders, printed when patching."""
        return []

    def marker_note(self, spec: MethodSpec) -> str | None:
        """What stock loaders build from the written config, when it is not this method (kept in the marker)."""
        return None

    # -- docs -------------------------------------------------------------------------------------------------
    def describe(self, spec: MethodSpec) -> str:
        """A resolved spec's parameters in words (reports)."""
        values = {key: getattr(spec, key) for key in self.params if getattr(spec, key, None) is not None}
        return ", ".join(f"{key} {value}" for key, value in values.items()) or "no parameters"

    def example_spec(self, factor: float, half: int) -> dict[str, Any]:
        """A spec of this method for the engine table of docs/serving.md (a model with `half` rotary frequencies,
        served at `factor`; a method that works inside the window has no factor)."""
        if self.works_inside_window:
            return {"method": self.name}
        return {"method": self.name, "factor": factor}

    def summary(self, plan) -> str:
        """The one line `rope-extend patch` prints about what was planned."""
        spec = plan.spec
        return (f"{spec.method} x{spec.factor:g}: {spec.original_max_position_embeddings} -> {spec.target_length} "
                f"tokens, attention factor {plan.attention_factor:.4f}, max_position_embeddings "
                f"{plan.old_max_position_embeddings} -> {plan.max_position_embeddings}")

    def param_doc(self) -> str:
        shown = {k: p.default if p.default is not None else p.derived for k, p in self.params.items()}
        return ", ".join(k if v is None else f"{k}={v}" for k, v in shown.items()) or "none"

    def __repr__(self) -> str:
        return f"<RopeMethod {self.name}>"


# --- adapters: what the rest of the project needs to know about a method, beside it --------------------------------
class Adapter:
    """A small object bound to one method (`self.method`), registered with it (`register(..., gguf=..., advice=...)`)."""

    def __init__(self, method: RopeMethod):
        self.method = method

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self.method.name}>"


class GgufRules(Adapter):
    """The llama.cpp GGUF metadata that makes llama.cpp serve a method as rope-extend computes it (checked against
    llama.cpp as vendored in llama-cpp-python 0.3.36), or the refusal."""

    def rope(self, spec: MethodSpec, base: float, rope_dim: int, inv_freq: np.ndarray, attention_factor: float):
        """(keys relative to `<arch>.`, rope_freqs factors or None, warnings); raises SpecError for what llama.cpp
        cannot express.

        Default: a static method as per-dimension `rope_freqs` (llama.cpp divides each frequency by its factor) plus
        the attention factor key (without YaRN, llama.cpp serves the key as the magnitude)."""
        method = self.method
        if method.dynamic and not method.switches_at_original:
            raise gguf_refusal(
                method.name,
                "it recomputes the frequencies as the sequence grows, and llama.cpp applies one static RoPE",
                f"use the static counterpart (--method {method.static_counterpart or 'ntk'}), or serve the patched "
                "Hugging Face checkpoint with rope_extend.patch_model",
            )
        import numpy as np

        theta = base ** (-2.0 * np.arange(rope_dim // 2) / rope_dim)
        factors = (theta / inv_freq.astype(np.float64)).astype(np.float32)
        keys: dict[str, Any] = {}
        if not math.isclose(attention_factor, 1.0, rel_tol=1e-7):
            keys["rope.scaling.attn_factor"] = attention_factor
        return keys, factors, []


class Advice(Adapter):
    """What `rope-extend inspect --recommend` (`rope_extend.inspect`) and `rope-extend tune` say about a method and
    try with it.

    preference: the static methods `--recommend` compares by their short-context cost, in this order of preference
        where the model's config accepts them (None: not compared);
    kept_when_shipped: a model that ships this scheme keeps it when extended further (it was tuned with it);
    closed_form: where it stands among the closed forms compared at their defaults (`inspect --plot` draws the static
        ones, `tune`'s held-out comparison evaluates them all), 0 first (None: not one of them);
    tune_rank: where `tune` screens its candidates when no `--methods` are given, most promising first (None: not
        searched by default).
    """

    preference: ClassVar[int | None] = None
    kept_when_shipped: ClassVar[bool] = False
    closed_form: ClassVar[int | None] = None
    tune_rank: ClassVar[int | None] = None

    def alternative(self, factor: float, recommended: str) -> str | None:
        """Why to choose this method instead of `recommended` at `factor` (an alternative `recommend` lists), or
        None."""
        return None

    def inside_window(self) -> str | None:
        """Why to choose this method when the model already serves the target length (no scaling needed), or
        None."""
        return None

    def tune_candidates(self, factor: float) -> list[tuple[str, dict[str, Any]]]:
        """Closed-form candidates `rope-extend tune` screens around the nominal factor s = N/L, most promising first
        (empty: not searched as a closed form, e.g. dynamic methods)."""
        if self.method.dynamic:
            return []
        return [(f"{self.method.name} x{factor:g}", {"method": self.method.name, "factor": factor})]


_REGISTRY: dict[str, RopeMethod] = {}
ALIASES: dict[str, str] = {}
GGUF_RULES: dict[str, GgufRules] = {}
ADVICE: dict[str, Advice] = {}


def register(method: RopeMethod, *, gguf: type[GgufRules] = GgufRules, advice: type[Advice] = Advice) -> RopeMethod:
    """Register `method` under its name and aliases, with its adapters (the defaults where it needs none)."""
    if method.name in _REGISTRY:
        raise ValueError(f"RoPE method {method.name!r} is already registered; pick another name")
    for alias in method.aliases:
        if alias in ALIASES or alias in _REGISTRY:
            raise ValueError(f"alias {alias!r} of {method.name!r} is already taken by {ALIASES.get(alias, alias)!r}")
    shared = all_params()
    for key, param in method.params.items():
        if key in shared and shared[key].kind is not param.kind:
            raise ValueError(f"parameter {key!r} of {method.name!r} has a different type in another method")
    _REGISTRY[method.name] = method
    ALIASES.update(dict.fromkeys(method.aliases, method.name))
    GGUF_RULES[method.name], ADVICE[method.name] = gguf(method), advice(method)
    return method


def method_names() -> list[str]:
    return sorted(_REGISTRY)


def all_methods() -> list[RopeMethod]:
    return [_REGISTRY[name] for name in method_names()]


def closed_forms(*, static: bool = False) -> list[str]:
    """The closed forms compared at their defaults (`Advice.closed_form`), in their order; `static`: without the
    dynamic ones."""
    ranked = [(ADVICE[name].closed_form, name) for name in method_names() if ADVICE[name].closed_form is not None]
    return [name for _, name in sorted(ranked) if not (static and _REGISTRY[name].dynamic)]


def tune_methods() -> list[str]:
    """The methods `tune` searches as closed forms by default (`Advice.tune_rank`), most promising first."""
    return [name for _, name in sorted((ADVICE[n].tune_rank, n) for n in method_names() if ADVICE[n].tune_rank is not None)]


def all_params() -> dict[str, Param]:
    """Every method parameter by name (the spec's method keys), in registration order."""
    out: dict[str, Param] = {}
    for method in _REGISTRY.values():
        for key, param in method.params.items():
            out.setdefault(key, param)
    return out


def canonical_name(name: str) -> str:
    """Normalise a user-given method name; raise SpecError with a suggestion if unknown."""
    if not isinstance(name, str):
        raise SpecError(
            f"method must be a string such as 'yarn', got {name!r}; choose one of {', '.join(method_names())}",
            field="method",
            value=name,
        )
    key = name.strip().lower().replace("_", "-")
    key = ALIASES.get(key, ALIASES.get(name.strip().lower(), key))
    if key in _REGISTRY:
        return key
    close = difflib.get_close_matches(key, list(_REGISTRY) + list(ALIASES), n=1, cutoff=0.5)
    hint = f"did you mean {ALIASES.get(close[0], close[0])!r}? " if close else ""
    raise SpecError(
        f"unknown RoPE method {name!r}: {hint}choose one of {', '.join(method_names())}",
        field="method",
        value=name,
    )


def get_method(name: str) -> RopeMethod:
    return _REGISTRY[canonical_name(name)]


def compute(name: str, ctx: RopeContext) -> tuple[torch.Tensor, float]:
    return get_method(name).compute(ctx)


def gguf_rules(method: RopeMethod | str) -> GgufRules:
    """The GGUF rules registered with `method` (an object or a name)."""
    return GGUF_RULES[_name(method)]


def advice(method: RopeMethod | str) -> Advice:
    """What `inspect --recommend` and `tune` say about `method` (an object or a name)."""
    return ADVICE[_name(method)]


def _name(method: RopeMethod | str) -> str:
    return method.name if isinstance(method, RopeMethod) else canonical_name(method)


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction 0.1 * m * ln(s) + 1 (1 for s <= 1)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0
