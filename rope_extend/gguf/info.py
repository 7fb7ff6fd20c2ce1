"""A GGUF's RoPE facts (header only, tensor data never read but the small rope_freqs tensor), the transformers
config carrying them (`inspect model.gguf`), and what `rope-extend show model.gguf` prints."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CheckpointError
from .binary import Header, read_header

ROPE_FREQS = "rope_freqs.weight"
LLAMACPP_SOURCE = "llama.cpp as vendored in llama-cpp-python 0.3.36"

# Architectures whose RoPE keys and rope_freqs tensor were checked in the vendored llama.cpp source (module
# docstring) and measured with the real llama-perplexity (tests/test_gguf_llamacpp.py).
VERIFIED_ARCHITECTURES = ("llama",)


@dataclass(frozen=True)
class GGUFInfo:
    """RoPE-relevant facts of a GGUF file (what ``rope-extend show`` prints for a .gguf)."""

    path: Path
    architecture: str
    name: str | None
    context_length: int | None
    freq_base: float
    rope_dim: int
    head_count: int | None
    embedding_length: int | None
    scaling: dict[str, Any]  # every <arch>.rope.scaling.* key, without the prefix
    rope_freqs: list[float] | None  # the rope_freqs.weight tensor, if present
    tensor_count: int
    file_type: int | None
    file_size: int

    @property
    def scaling_type(self) -> str:
        return str(self.scaling.get("type", "none" if not self.scaling else "linear"))

    @property
    def is_scaled(self) -> bool:
        factor = float(self.scaling.get("factor", 0.0) or 0.0)
        return self.rope_freqs is not None or self.scaling_type not in ("none", "linear") or factor not in (0.0, 1.0)

    @property
    def original_context_length(self) -> int | None:
        return int(self.scaling.get("original_context_length", self.context_length or 0)) or None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "architecture": self.architecture,
            "name": self.name,
            "context_length": self.context_length,
            "freq_base": self.freq_base,
            "rope_dim": self.rope_dim,
            "head_count": self.head_count,
            "embedding_length": self.embedding_length,
            "scaling": dict(self.scaling),
            "rope_freqs": None if self.rope_freqs is None else f"[{len(self.rope_freqs)} factors]",
            "tensor_count": self.tensor_count,
            "file_type": self.file_type,
            "file_size": self.file_size,
        }


def read_gguf_info(path: str | os.PathLike) -> GGUFInfo:
    """The RoPE facts of a GGUF file (header only; tensor data is not read)."""
    path = Path(path)
    return info_of(read_header(path), path)


def read_metadata(path: str | os.PathLike, key: str) -> Any:
    """One metadata value of a GGUF file (e.g. `general.license`), or None when the file has no such key."""
    return read_header(Path(path)).get(key)


def info_of(header: Header, path: Path) -> GGUFInfo:
    arch = header.get("general.architecture")
    if not arch:
        raise CheckpointError(f"{str(path)!r} has no general.architecture key; it is not a model GGUF")
    head_count = header.get(f"{arch}.attention.head_count")
    if isinstance(head_count, list):  # per-layer arrays: RoPE only needs one value
        head_count = head_count[0]
    embedding = header.get(f"{arch}.embedding_length")
    key_length = header.get(f"{arch}.attention.key_length")
    head_dim = key_length or (embedding // head_count if embedding and head_count else None)
    rope_dim = header.get(f"{arch}.rope.dimension_count", head_dim)
    prefix = f"{arch}.rope.scaling."
    scaling = {k[len(prefix):]: kv.value for k, kv in header.kvs.items() if k.startswith(prefix)}
    rope_freqs = None
    for t in header.tensors:
        if t.name == ROPE_FREQS and t.ggml_type == 0:  # F32
            with open(path, "rb") as fh:
                fh.seek(header.data_start + t.offset)
                rope_freqs = np.frombuffer(fh.read(t.nbytes), dtype="<f4").astype(float).tolist()
        elif t.name == ROPE_FREQS:
            rope_freqs = []  # present but not F32: still "scaled"
    return GGUFInfo(
        path=path,
        architecture=str(arch),
        name=header.get("general.name"),
        context_length=header.get(f"{arch}.context_length"),
        freq_base=float(header.get(f"{arch}.rope.freq_base", 10000.0)),
        rope_dim=int(rope_dim) if rope_dim else 0,
        head_count=head_count,
        embedding_length=embedding,
        scaling=scaling,
        rope_freqs=rope_freqs,
        tensor_count=len(header.tensors),
        file_type=header.get("general.file_type"),
        file_size=header.file_size,
    )


def hf_config_of(info: GGUFInfo):
    """A transformers config carrying the GGUF's RoPE (for ``rope-extend inspect model.gguf``)."""
    from transformers import LlamaConfig

    if not info.head_count or not info.embedding_length:
        raise CheckpointError(f"{str(info.path)!r} lacks {info.architecture}.attention.head_count/embedding_length")
    scaling = None
    if info.scaling_type == "yarn":
        scaling = {
            "rope_type": "yarn",
            "factor": float(info.scaling.get("factor", 1.0)),
            "original_max_position_embeddings": int(info.original_context_length or 0),
        }
    elif info.scaling_type == "linear" and float(info.scaling.get("factor", 0) or 0) > 1:
        scaling = {"rope_type": "linear", "factor": float(info.scaling["factor"])}
    config = LlamaConfig(
        hidden_size=info.embedding_length,
        num_attention_heads=info.head_count,
        head_dim=info.rope_dim,
        max_position_embeddings=info.context_length or 2048,
        rope_theta=info.freq_base,
        rope_scaling=scaling,
        num_hidden_layers=1,
        intermediate_size=4,
        vocab_size=8,
    )
    return config


def info_lines(info: GGUFInfo) -> list[str]:
    """`rope-extend show model.gguf`."""
    scaling = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in info.scaling.items())
    lines = [
        f"GGUF {info.path} ({info.architecture}, {info.name or 'unnamed'}, {info.tensor_count} tensors, "
        f"{info.file_size / 1e6:.1f} MB)",
        f"context_length: {info.context_length}",
        f"rope.freq_base: {info.freq_base:.9g}",
        f"rope.dimension_count: {info.rope_dim}",
        f"rope.scaling: {scaling or 'none'}",
        f"rope_freqs tensor: {f'{len(info.rope_freqs)} factors' if info.rope_freqs is not None else 'none'}",
    ]
    if info.architecture not in VERIFIED_ARCHITECTURES:
        lines.append(f"note: rope-extend cannot patch {info.architecture!r} GGUFs (verified: {', '.join(VERIFIED_ARCHITECTURES)})")
    elif info.is_scaled:
        lines.append("existing scheme: scaled (patch the original, unscaled GGUF instead)")
    else:
        lines.append("existing scheme: none (plain RoPE)")
    return lines
