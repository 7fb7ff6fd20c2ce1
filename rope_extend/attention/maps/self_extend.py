"""SelfExtend's position map (Jin et al. 2024, "LLM Maybe LongLM"), group size G, neighbour window W:

    distance(i, j) = p_i - p_j                                   if p_i - p_j < W   (neighbour: the original)
                   = (p_i // G + W - W // G) - p_j // G            otherwise          (grouped)

Passes: neighbour (original q, original k, 0 <= p_i - p_j < W) and grouped (q at p_i // G + W - W // G, k at
p_j // G, p_i - p_j >= W).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..passes import FAR, Pass
from .base import Segment


@dataclass(frozen=True)
class SelfExtendMap:
    group_size: int
    neighbor_window: int

    keys_move = True
    fused_moves_keys = True  # the key shift differs from key to key: the fused path reads the moved keys

    def key_shift(self, k_pos: torch.Tensor) -> torch.Tensor:
        return k_pos // self.group_size - k_pos

    def query_shifts(self, q_pos: torch.Tensor) -> list[torch.Tensor | None]:
        g, w = self.group_size, self.neighbor_window
        return [None, q_pos // g + (w - w // g) - q_pos]

    def select(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        return (q_pos - k_pos >= self.neighbor_window).to(torch.int8)

    def far_threshold(self, q_min: int) -> int:
        return q_min - self.neighbor_window + 1

    def is_identity(self, first: int, last: int) -> bool:
        """Every distance below W."""
        return last - first < self.neighbor_window

    def logits_times(self, n_keys: int) -> float:
        return 1.0

    def split_points(self, start: int, stop: int) -> list[int]:
        return []  # any block of query positions works

    def segments(self, a: int, b: int) -> list[Segment]:
        w = self.neighbor_window
        return [Segment(1, 0, a - w + 1, True, None), Segment(1, a - w + 1, b - w, False, None),
                Segment(0, a - w + 1, b, False, None)]

    def passes(self, q0: int, k0: int, device) -> list[Pass]:
        w = self.neighbor_window
        return [
            Pass("neighbour", None, False, (q0, k0, 1, 0, w), lambda p: (p - w + 1, p + 1), device),
            Pass("grouped", lambda q_pos: self.query_shifts(q_pos)[1], True, (q0, k0, 1, w, FAR),
                 lambda p: (k0, p - w + 1), device),
        ]
