"""The position maps of the attention-level methods and the rotations that move rotated queries and keys.

A map says, for each (query, key) pair, which mapped relative distance it sees (see `kernels` for the formulas).
RoPE rotations compose, so a query or key already rotated at position p moves to p + delta by one more rotation
of delta·θ (`rotation`, `rotate`). Both attention paths (`kernels`' fused and general paths, `passes`) read the
maps from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SelfExtendMap:
    group_size: int
    neighbor_window: int

    def key_shift(self, k_pos: torch.Tensor) -> torch.Tensor:
        """The one key shift the moved maps share (elementwise in the position, so it can be cached by position)."""
        return k_pos // self.group_size - k_pos

    def query_shifts(self, q_pos: torch.Tensor) -> list[torch.Tensor | None]:
        """Per map, the query shift; None = the original map (queries and keys as the model rotated them)."""
        g, w = self.group_size, self.neighbor_window
        return [None, q_pos // g + (w - w // g) - q_pos]

    def far_threshold(self, q_min: int) -> int:
        """Keys at positions below this use the last map for every query at positions >= q_min."""
        return q_min - self.neighbor_window + 1

    def select(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Which map each (query, key) pair uses: q_pos [B, q, 1], k_pos [B, 1, k] -> [B, q, k] int."""
        return (q_pos - k_pos >= self.neighbor_window).to(torch.int8)

    def is_identity(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> bool:
        """Every pair uses the original distance (all distances < W)."""
        return int(q_pos.max()) - int(k_pos.min()) < self.neighbor_window

    def is_identity_span(self, first: int, last: int) -> bool:
        """`is_identity` for the contiguous positions first .. last (Python ints: nothing read from a tensor)."""
        return last - first < self.neighbor_window

    def split_points(self, start: int, stop: int) -> list[int]:
        return []  # any block of query positions works

    moves_keys = True  # the fused path needs the keys moved by the key shift (it differs from key to key)

    def logits_times(self, n_keys: int) -> float:
        """Every logit of a call with n_keys keys is multiplied by this (1: none)."""
        return 1.0

    def segments(self, a: int, b: int) -> list[tuple[int, int, int, bool, int | None]]:
        """The fused path's key segments for the queries at positions [a, b): (map, first key position, key stop,
        every query of the block uses that map there (else a mask picks the pairs), the one key shift of the
        segment or None). Ranges may reach below the first key or be empty: the caller clips and drops them."""
        w = self.neighbor_window
        return [(1, 0, a - w + 1, True, None), (1, a - w + 1, b - w, False, None), (0, a - w + 1, b, False, None)]


@dataclass(frozen=True)
class DualChunkMap:
    chunk_size: int
    local_window: int
    length_scale: float = 0.0  # c: q and k cos/sin times c·ln(n/L) + 1 once the n keys exceed L (0: never)
    original: int = 0  # L, the length that scale is measured against

    @property
    def chunk_len(self) -> int:
        return self.chunk_size - self.local_window

    def key_shift(self, k_pos: torch.Tensor) -> torch.Tensor:
        return k_pos % self.chunk_len - k_pos

    def query_shifts(self, q_pos: torch.Tensor) -> list[torch.Tensor | None]:
        s, c = self.chunk_len, self.chunk_size
        return [None, torch.clamp(q_pos % s + s, max=c) - q_pos, c - q_pos]

    def far_threshold(self, q_min: int) -> int:
        return (q_min // self.chunk_len - 1) * self.chunk_len  # chunks two or more before the first query's

    def select(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        s = self.chunk_len
        gap = q_pos // s - k_pos // s  # 0: same chunk, 1: previous, >= 2: older (negative: future, masked)
        return torch.clamp(gap, min=0, max=2).to(torch.int8)

    def is_identity(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> bool:
        """Everything lies in the first chunk."""
        return max(int(q_pos.max()), int(k_pos.max())) < self.chunk_len

    def is_identity_span(self, first: int, last: int) -> bool:
        return last < self.chunk_len

    def split_points(self, start: int, stop: int) -> list[int]:
        """The chunk starts inside (start, stop): a block of queries must lie in one chunk."""
        s = self.chunk_len
        return list(range((start // s + 1) * s, stop, s))

    moves_keys = False  # the key shift is one per chunk: the fused path rotates the queries by its inverse instead

    def logits_times(self, n_keys: int) -> float:
        """The authors' length scale (ChunkLlama's `get_mscale`, since a4835cf): cos and sin of every query and key
        times c·ln(n/L) + 1 when the sequence of n keys is longer than L, so every logit times its square. n is the
        number of keys of the call (the authors' `kv_seq_len`), so a decoding step takes the length so far."""
        if not self.length_scale or n_keys <= self.original:
            return 1.0
        return (self.length_scale * math.log(n_keys / self.original) + 1.0) ** 2

    def segments(self, a: int, b: int) -> list[tuple[int, int, int, bool, int | None]]:
        """As SelfExtendMap.segments, for queries [a, b) inside one chunk: each older chunk (inter-chunk), the
        previous chunk (successive), the own chunk before the block and the causal square (intra). A key in chunk
        c moves by -c·s, so each earlier chunk is its own segment with that one shift."""
        s = self.chunk_len
        first = (a // s) * s  # the queries' chunk
        older = [(2, c * s, (c + 1) * s, True, -c * s) for c in range(first // s - 1)]
        previous = [(1, first - s, first, True, s - first)] if first else []
        return [*older, *previous, (0, first, a, True, None), (0, a, b, False, None)]


@dataclass(frozen=True)
class StringMap:
    """STRING: distances d >= S (`shifted_offset`) become d - S + W (`local_value`); the keys stay where the model
    rotated them and the shifted map moves every query by the one constant W - S."""

    shifted_offset: int
    local_value: int
    logit_scale: float = 1.0  # every logit times this (the squared attention_factor on cos and sin)

    key_shift = None  # the keys are never moved: every path scores the shifted map against the original keys

    def query_shifts(self, q_pos: torch.Tensor) -> list[torch.Tensor | None]:
        return [None, torch.full_like(q_pos, self.local_value - self.shifted_offset)]

    def far_threshold(self, q_min: int) -> int:
        return q_min - self.shifted_offset + 1

    def select(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        return (q_pos - k_pos >= self.shifted_offset).to(torch.int8)

    def is_identity(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> bool:
        """Every distance below S and no logit scale: the original attention."""
        return self.logit_scale == 1.0 and int(q_pos.max()) - int(k_pos.min()) < self.shifted_offset

    def is_identity_span(self, first: int, last: int) -> bool:
        """`is_identity` for the contiguous positions first .. last (Python ints: nothing read from a tensor)."""
        return self.logit_scale == 1.0 and last - first < self.shifted_offset

    def split_points(self, start: int, stop: int) -> list[int]:
        return []

    def logits_times(self, n_keys: int) -> float:
        return self.logit_scale

    moves_keys = False

    def segments(self, a: int, b: int) -> list[tuple[int, int, int, bool, int | None]]:
        """As SelfExtendMap.segments with S for W; the shifted map's keys are the original ones. A block shorter
        than S also splits the neighbour keys: the ones every query of the block sees at d < S ([b - S, a]) go
        without a mask (the kernel's unmasked call is the faster one), only the band and the causal square keep
        one."""
        s = self.shifted_offset
        shifted = [(1, 0, a - s + 1, True, None), (1, a - s + 1, b - s, False, None)]
        if b - a > s:
            return [*shifted, (0, a - s + 1, b, False, None)]
        return [*shifted, (0, a - s + 1, b - s, False, None), (0, b - s, a + 1, True, None), (0, a + 1, b, False, None)]


def rotation(shift: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [B, 1, n, rotary_dim] (float32) of a rotation by `shift` [B, n] positions (angles in float64)."""
    angles = shift.to(torch.float64)[..., None] * inv_freq.to(device=shift.device, dtype=torch.float64)
    angles = torch.cat((angles, angles), dim=-1)[:, None]
    return angles.cos().float(), angles.sin().float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, n, D] rotated in its first rotary_dim dims (transformers' rotate_half layout), in x's dtype: float32
    math, x·cos then rotate_half(x)·sin added in place half by half (two temporaries, not six)."""
    rdim = cos.shape[-1]
    half = rdim // 2
    xr = x[..., :rdim].float()
    out = xr * cos
    out[..., :half].addcmul_(xr[..., half:], sin[..., :half], value=-1.0)
    out[..., half:].addcmul_(xr[..., :half], sin[..., half:])
    if rdim < x.shape[-1]:
        return torch.cat((out.to(x.dtype), x[..., rdim:]), dim=-1)
    return out.to(x.dtype)


def log_n_factor(q_pos: torch.Tensor, original: int) -> torch.Tensor:
    """max(1, ln(p + 1) / ln(L)) per query [B, q] (float32)."""
    return torch.clamp(torch.log1p(q_pos.to(torch.float64)) / math.log(original), min=1.0).float()
