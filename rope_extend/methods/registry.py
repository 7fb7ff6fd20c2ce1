"""The method registry: one `RopeMethod` per scaling method, registered once by name.

Every method is a pure function with one contract (like transformers' `ROPE_INIT_FUNCTIONS`)::

    compute(ctx: RopeContext) -> (inv_freq: torch.Tensor[float32, rotary_dim // 2], attention_factor: float)

`RopeContext` carries everything a method may read: the rotary dimension, the base, the original (pretraining)
length, the factor, the method parameters, and, for dynamic methods, the current sequence length.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import SpecError


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


def default_inv_freq(dim: int, base: float, device=None) -> torch.Tensor:
    """theta_i = base^(-2i/d), computed with the same float32 op order as transformers."""
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
    return 1.0 / (base**exponent)


ComputeFn = Callable[[RopeContext], "tuple[torch.Tensor, float]"]


@dataclass(frozen=True)
class RopeMethod:
    """A registered scaling method.

    name: the spec's `method` value.
    compute: the pure function described in the module docstring.
    params: the parameters it reads, with their defaults (None = derived).
    dynamic: recomputed as the sequence grows (needs the current length at run time).
    hf_rope_type: the transformers `rope_type` that reproduces it from config.json, if any.
    loaders: which stock loaders reproduce it: {"transformers-4": "yes", "vllm": "static only", ...}.
    formula / use_when / paper: documentation (README table and `rope-extend methods`).
    """

    name: str
    compute: ComputeFn
    params: Mapping[str, Any]
    dynamic: bool
    hf_rope_type: str | None
    loaders: Mapping[str, str]
    formula: str
    use_when: str
    paper: str
    needs_factor: bool = True


_REGISTRY: dict[str, RopeMethod] = {}

# Spellings users and other tools use for the same method.
ALIASES = {
    "pi": "linear",
    "position-interpolation": "linear",
    "ntk-aware": "ntk",
    "static-ntk": "ntk",
    "dynamic-ntk": "dynamic",
    "ntk_by_parts": "ntk-by-parts",
    "by-parts": "ntk-by-parts",
    "dynamic_yarn": "dynamic-yarn",
    "dynamicyarn": "dynamic-yarn",
    "su": "longrope",
}


def register(method: RopeMethod) -> RopeMethod:
    if method.name in _REGISTRY:
        raise ValueError(f"RoPE method {method.name!r} is already registered; pick another name")
    _REGISTRY[method.name] = method
    return method


def method_names() -> list[str]:
    return sorted(_REGISTRY)


def all_methods() -> list[RopeMethod]:
    return [_REGISTRY[name] for name in method_names()]


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
    inv_freq, attention_factor = get_method(name).compute(ctx)
    return inv_freq, float(attention_factor)


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction 0.1 * m * ln(s) + 1 (1 for s <= 1)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0
