"""The contract every attention-level method's position map keeps (`PositionMap`), which the paths of `kernels`
and `passes` read and `runtime` installs; a method adds one map module beside this one (docs/development.md,
"Adding an attention-level method").

A map gives each (query, key) pair one of a few *sub-maps* (index 0, 1, ...). Sub-map m moves the model's rotated
queries by `query_shifts(q_pos)[m]` positions (None: as the model rotated them) and, where `keys_move`, scores them
against the keys moved by `key_shift` (RoPE rotations compose, so a rotation by the shift's angle moves a rotated
query or key to the mapped position). Positions are the model's position ids, not indices.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from ..passes import Pass


class Segment(NamedTuple):
    """A range of keys that a block of queries scores through one sub-map on the fused CPU path."""

    map: int  # the sub-map
    first: int  # the key positions [first, stop) (may reach below the first key or be empty: the caller clips)
    stop: int
    full: bool  # every query of the block uses that sub-map on every key of the range (else a mask picks pairs)
    key_shift: int | None  # one shift for every key of the range (the query takes its inverse), or None


@runtime_checkable
class PositionMap(Protocol):
    """What a position map provides; maps are frozen dataclasses (hashable: the paths key their memos by them)."""

    keys_move: bool  # some sub-map reads the keys moved by `key_shift` (False: every key stays where the model put it)
    fused_moves_keys: bool  # the fused path reads them too (else it rotates queries per segment by `Segment.key_shift`)

    def key_shift(self, k_pos: torch.Tensor) -> torch.Tensor:
        """The shift that moves the keys of the sub-maps that read moved keys, elementwise in the position (so it is
        cached by position); read only where `keys_move`."""
        ...

    def query_shifts(self, q_pos: torch.Tensor) -> list[torch.Tensor | None]:
        """Per sub-map, the shift of each query [B, q] (None: the queries as the model rotated them)."""
        ...

    def select(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """The sub-map of each pair: q_pos [B, q, 1], k_pos [B, 1, k] -> [B, q, k] int."""
        ...

    def far_threshold(self, q_min: int) -> int:
        """Keys at positions below this use the last sub-map for every query at positions >= q_min."""
        ...

    def is_identity(self, first: int, last: int) -> bool:
        """Whether keys at positions first .. last (and queries among them) see the original attention exactly, so
        the dispatcher calls transformers' own function (Python ints: nothing read from a tensor)."""
        ...

    def logits_times(self, n_keys: int) -> float:
        """Every logit of a call with n_keys keys is multiplied by this (1: none)."""
        ...

    def split_points(self, start: int, stop: int) -> list[int]:
        """Query positions in (start, stop) where a block of queries must end on the fused path."""
        ...

    def segments(self, a: int, b: int) -> list[Segment]:
        """The fused path's key ranges for the queries at positions [a, b)."""
        ...

    def passes(self, q0: int, k0: int, device) -> list[Pass]:
        """The passes path: one whole-sequence pass per sub-map region, for queries whose index 0 sits at position
        q0 and keys whose index 0 sits at k0."""
        ...
