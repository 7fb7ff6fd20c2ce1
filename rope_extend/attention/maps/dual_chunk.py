"""Dual chunk attention's position map (An et al. 2024, ChunkLlama), chunk_size c, local_window w, chunk length
s = c - w: keys sit at p_j mod s; a query at offset t = p_i mod s of chunk p_i // s sees a key of its own chunk at
the original distance, of the previous chunk from min(t + s, c), of older chunks from c. Largest distance: c.
Optionally the authors' length scale (`length_scale`: cos and sin of every query and key times
c_s·ln(n/L) + 1 once a call's n keys exceed L, so every logit times its square).

Passes: keys moved once to p_j mod s (the fused path rotates queries per chunk instead); intra (same chunk, causal:
queries and keys as rotated, since both would move by minus the chunk's start), successive (q at min(p_i mod s + s,
c), previous chunk), inter (q at c, chunks two or more back).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..passes import FAR, Pass
from .base import Segment


@dataclass(frozen=True)
class DualChunkMap:
    chunk_size: int
    local_window: int
    length_scale: float = 0.0  # c_s: q and k cos/sin times c_s·ln(n/L) + 1 once the n keys exceed L (0: never)
    original: int = 0  # L, the length that scale is measured against

    keys_move = True
    fused_moves_keys = False  # the key shift is one per chunk: the fused path rotates the queries by its inverse

    @property
    def chunk_len(self) -> int:
        return self.chunk_size - self.local_window

    def key_shift(self, k_pos: torch.Tensor) -> torch.Tensor:
        return k_pos % self.chunk_len - k_pos

    def query_shifts(self, q_pos: torch.Tensor) -> list[torch.Tensor | None]:
        s, c = self.chunk_len, self.chunk_size
        return [None, torch.clamp(q_pos % s + s, max=c) - q_pos, c - q_pos]

    def select(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        s = self.chunk_len
        gap = q_pos // s - k_pos // s  # 0: same chunk, 1: previous, >= 2: older (negative: future, masked)
        return torch.clamp(gap, min=0, max=2).to(torch.int8)

    def far_threshold(self, q_min: int) -> int:
        return (q_min // self.chunk_len - 1) * self.chunk_len  # chunks two or more before the first query's

    def is_identity(self, first: int, last: int) -> bool:
        """Everything lies in the first chunk (and so below L: no length scale either)."""
        return last < self.chunk_len

    def logits_times(self, n_keys: int) -> float:
        """The authors' length scale (ChunkLlama's `get_mscale`, since a4835cf): cos and sin of every query and key
        times c_s·ln(n/L) + 1 when the sequence of n keys is longer than L, so every logit times its square. n is
        the number of keys of the call (the authors' `kv_seq_len`), so a decoding step takes the length so far."""
        if not self.length_scale or n_keys <= self.original:
            return 1.0
        return (self.length_scale * math.log(n_keys / self.original) + 1.0) ** 2

    def split_points(self, start: int, stop: int) -> list[int]:
        """The chunk starts inside (start, stop): a block of queries must lie in one chunk."""
        s = self.chunk_len
        return list(range((start // s + 1) * s, stop, s))

    def segments(self, a: int, b: int) -> list[Segment]:
        """For queries [a, b) inside one chunk: each older chunk (inter-chunk), the previous chunk (successive), the
        own chunk before the block and the causal square (intra). A key in chunk c moves by -c·s, so each earlier
        chunk is its own segment with that one shift."""
        s = self.chunk_len
        first = (a // s) * s  # the queries' chunk
        older = [Segment(2, c * s, (c + 1) * s, True, -c * s) for c in range(first // s - 1)]
        previous = [Segment(1, first - s, first, True, s - first)] if first else []
        return [*older, *previous, Segment(0, first, a, True, None), Segment(0, a, b, False, None)]

    def passes(self, q0: int, k0: int, device) -> list[Pass]:
        s, c = self.chunk_len, self.chunk_size
        return [
            # same chunk: queries and keys would both move by minus the chunk's start, which leaves q·k as it is
            Pass("intra", None, False, (q0, k0, s, 0, 1), lambda p: (p // s * s, p + 1), device),
            Pass("successive", lambda q_pos: torch.clamp(q_pos % s + s, max=c) - q_pos, True, (q0, k0, s, 1, 2),
                 lambda p: (p // s * s - s, p // s * s), device),  # query_shifts' [1] and [2], one each
            Pass("inter", lambda q_pos: c - q_pos, True, (q0, k0, s, 2, FAR), lambda p: (k0, p // s * s - s),
                 device),
        ]
