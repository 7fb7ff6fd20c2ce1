"""STRING's position map (An et al. 2025), shifted_offset S, local_value W: distances d >= S become d - S + W.
The keys stay where the model rotated them; the shifted sub-map moves every query by the one constant W - S.

Passes: neighbour (original q, original k, 0 <= p_i - p_j < S) and shifted (q at p_i - S + W, original k,
p_i - p_j >= S).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..passes import FAR, Pass
from .base import Segment


@dataclass(frozen=True)
class StringMap:
    shifted_offset: int
    local_value: int
    logit_scale: float = 1.0  # every logit times this (the squared attention_factor on cos and sin)

    keys_move = False  # every path scores the shifted sub-map against the original keys
    fused_moves_keys = False

    def key_shift(self, k_pos: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(k_pos)  # never read (keys_move is False)

    def query_shifts(self, q_pos: torch.Tensor) -> list[torch.Tensor | None]:
        return [None, torch.full_like(q_pos, self.local_value - self.shifted_offset)]

    def select(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        return (q_pos - k_pos >= self.shifted_offset).to(torch.int8)

    def far_threshold(self, q_min: int) -> int:
        return q_min - self.shifted_offset + 1

    def is_identity(self, first: int, last: int) -> bool:
        """Every distance below S and no logit scale: the original attention."""
        return self.logit_scale == 1.0 and last - first < self.shifted_offset

    def logits_times(self, n_keys: int) -> float:
        return self.logit_scale

    def split_points(self, start: int, stop: int) -> list[int]:
        return []

    def segments(self, a: int, b: int) -> list[Segment]:
        """As SelfExtendMap's with S for W; the shifted sub-map's keys are the original ones. A block shorter than S
        also splits the neighbour keys: the ones every query of the block sees at d < S ([b - S, a]) go without a
        mask (the kernel's unmasked call is the faster one), only the band and the causal square keep one."""
        s = self.shifted_offset
        shifted = [Segment(1, 0, a - s + 1, True, None), Segment(1, a - s + 1, b - s, False, None)]
        if b - a > s:
            return [*shifted, Segment(0, a - s + 1, b, False, None)]
        return [*shifted, Segment(0, a - s + 1, b - s, False, None), Segment(0, b - s, a + 1, True, None),
                Segment(0, a + 1, b, False, None)]

    def passes(self, q0: int, k0: int, device) -> list[Pass]:
        s, w = self.shifted_offset, self.local_value
        return [
            Pass("neighbour", None, False, (q0, k0, 1, 0, s), lambda p: (p - s + 1, p + 1), device),
            Pass("shifted", lambda q_pos: torch.full_like(q_pos, w - s), False, (q0, k0, 1, s, FAR),
                 lambda p: (k0, p - s + 1), device),
        ]
