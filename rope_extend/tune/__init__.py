"""`rope-extend tune`: find the RoPE scaling with the lowest loss beyond the window on calibration text.

    from rope_extend.tune import tune
    result = tune(model, 16384, token_ids, budget=12)   # result.spec() -> the winning spec dict

Modules: `space` (candidates), `objective` (loss beyond L), `search` (successive halving), `log` (resumable
jsonl), `heldout` (comparison with bootstrap intervals), `report`, `runner` (`tune_model`, what the CLI runs),
`options` (`TuneOptions`: its flags and keywords, declared once).

The modules load on first use (`from rope_extend.tune import tune` works), so the CLI reads `options` without torch.
"""

from __future__ import annotations

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

_WHERE = {
    "CalibrationObjective": "objective",
    "Candidate": "space",
    "Geometry": "space",
    "HeldoutVariant": "heldout",
    "TuneResult": "search",
    "closed_form_grid": "space",
    "compare": "heldout",
    "eval_cost": "objective",
    "license_text": "heldout",
    "per_dim_moves": "space",
    "plan_schedule": "search",
    "rung_lengths": "search",
    "tune": "search",
}


def __getattr__(name):
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(name)
