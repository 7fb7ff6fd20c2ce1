"""Look inside a model's RoPE, in three rooms: the per-dimension "disks" and what a method does to each
(`table`: `inspect_rope`), a recommendation for a target length (`recommend`), and several methods drawn side by side
(`plot`: `plot_methods`). All take a transformers config; nothing loads model weights.
"""

from .plot import method_curves, plot_methods
from .recommend import Recommendation, costs_or_accepted, recommend, short_context_cost, with_measurements
from .table import REGIME_RTOL, DiskRow, RopeInspection, classify, inspect_rope, load_config

__all__ = [
    "REGIME_RTOL",
    "DiskRow",
    "Recommendation",
    "RopeInspection",
    "classify",
    "costs_or_accepted",
    "inspect_rope",
    "load_config",
    "method_curves",
    "plot_methods",
    "recommend",
    "short_context_cost",
    "with_measurements",
]
