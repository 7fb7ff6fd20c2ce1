"""Where a patched checkpoint serves identically: ports of each serving engine's RoPE, pinned to a version, and the
real engines rope-extend runs.

One module per engine (`transformers_engine` runs the real library; `vllm`, `sglang`, `llama_cpp` port the engines'
RoPE code, with the files and versions read cited in each docstring), each with its per-method serving rule.
`parity` compares what every engine serves with rope-extend's own RoPE. `runs` is the registry of the run engines
(real engines in their own environments, behind one `RunEngine` protocol); each adapter module registers itself
when imported here.
"""

from . import (
    sglang_run,  # noqa: F401  registers the run engine `sglang`
    vllm_run,  # noqa: F401  registers the run engine `vllm`
)
from .served import Delta, EngineHint, NotServed, Served

__all__ = ["Delta", "EngineHint", "NotServed", "Served"]
