"""GGUF in and out: read a GGUF's RoPE facts and rewrite its metadata so llama.cpp serves a rope-extend spec.

One concern per module: `binary` (the file format: the header parsed and packed, records copied byte for byte, the
data section copied in the kernel), `info` (a GGUF's RoPE facts, what `show` prints), `plan` (a spec planned on a
GGUF: the keys llama.cpp reads, checked with llama.cpp's RoPE math before anything is written) and `write` (the plan
executed: OUT written atomically).
"""
