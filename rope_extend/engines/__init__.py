"""The serving engines, one room each (`rope_extend/engines/<name>/`: its port pinned to a release, its rules, its
card routes and, where it runs here, its run adapter and environment), registered in `registry`; what they share:
`written` (what a plan writes, as engines see it), `hint` (routes and commands), `served` (cos/sin and their
comparison), `hf_config` and `ported` (config reading and formulas several engines share), `runs` (the real engines'
interface), and the reports that loop over the registry: `parity`, `audit`, `serving`.

One registration line per room, here (the reference, transformers, first; then the order the card lists them in).
"""

from . import transformers, vllm, sglang, mlx, llama_cpp  # noqa: F401, I001  (register, in this order)
from .hint import EngineHint, Route
from .registry import ServingEngine, register, serving_engines
from .served import Delta, NotServed, Served, Unchecked

__all__ = ["Delta", "EngineHint", "NotServed", "Route", "Served", "ServingEngine", "Unchecked", "register",
           "serving_engines"]
