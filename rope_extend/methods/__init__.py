"""Scaling methods, one per file, all registered in `registry`."""

from . import (  # noqa: F401  (register)
    dual_chunk,
    dynamic,
    dynamic_yarn,
    linear,
    llama3,
    longrope,
    ntk,
    ntk_by_parts,
    self_extend,
    string,
    yarn,
)
from .registry import (
    ALIASES,
    ENGINES,
    EngineRule,
    Param,
    RopeContext,
    RopeMethod,
    all_methods,
    all_params,
    canonical_name,
    compute,
    default_inv_freq,
    get_method,
    method_names,
    register,
)

__all__ = [
    "ALIASES",
    "ENGINES",
    "EngineRule",
    "Param",
    "RopeContext",
    "RopeMethod",
    "all_methods",
    "all_params",
    "canonical_name",
    "compute",
    "default_inv_freq",
    "get_method",
    "method_names",
    "register",
]
