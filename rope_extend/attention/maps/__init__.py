"""The attention-level methods' position maps, one module each, behind one contract (`base.PositionMap`)."""

from .base import PositionMap, Segment
from .dual_chunk import DualChunkMap
from .self_extend import SelfExtendMap
from .string import StringMap

__all__ = ["DualChunkMap", "PositionMap", "Segment", "SelfExtendMap", "StringMap"]
