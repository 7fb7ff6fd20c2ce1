"""The llama.cpp room: its port (`port`: what convert_hf_to_gguf.py writes and the RoPE llama.cpp computes from a
GGUF's metadata and its flags, float32 as ggml does; the one port the GGUF writer and the parity report share) and
its rules and card routes (`engine`)."""

from ..registry import register
from .engine import LLAMA_CPP

register(LLAMA_CPP)
