"""`rope-extend tune`: find the RoPE scaling with the lowest loss beyond the window on calibration text.

    from rope_extend.tune import tune
    result = tune(model, 16384, token_ids, budget=12)   # result.spec() -> the winning spec dict

Modules: `space` (candidates), `objective` (loss beyond L), `search` (successive halving), `log` (resumable
jsonl), `heldout` (comparison with bootstrap intervals), `report`, `runner` (`tune_model`, what the CLI runs).
"""

from .heldout import HeldoutVariant, compare, license_text
from .objective import CalibrationObjective, eval_cost
from .search import TuneResult, plan_schedule, rung_lengths, tune
from .space import Candidate, Geometry, closed_form_grid, per_dim_moves

__all__ = [
    "CalibrationObjective",
    "Candidate",
    "Geometry",
    "HeldoutVariant",
    "TuneResult",
    "closed_form_grid",
    "compare",
    "eval_cost",
    "license_text",
    "per_dim_moves",
    "plan_schedule",
    "rung_lengths",
    "tune",
]
