"""Where a patched checkpoint serves identically: ports of each serving engine's RoPE, pinned to a version.

One module per engine (`transformers_engine` runs the real library; `vllm`, `sglang`, `llama_cpp` port the engines'
RoPE code, with the files and versions read cited in each docstring), each with its per-method serving rule.
`parity` compares what every engine serves with rope-extend's own RoPE.
"""

from .served import Delta, EngineHint, NotServed, Served

__all__ = ["Delta", "EngineHint", "NotServed", "Served"]
