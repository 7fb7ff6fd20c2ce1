"""Long-context evaluation: perplexity by length, passkey, RULER-style needles, lm-eval glue.

Heavy modules are imported lazily; ``from rope_extend.eval import run_eval`` works.
"""

from __future__ import annotations

__all__ = [
    "Suite",
    "load_suite",
    "make_needle",
    "make_passkey",
    "perplexity_at_length",
    "read_results",
    "rebuild_report",
    "run_eval",
    "run_lm_eval",
    "summary_markdown",
    "token_losses",
    "wilson_interval",
    "write_task_data",
]

_WHERE = {
    "run_eval": "runner",
    "summary_markdown": "runner",
    "read_results": "runner",
    "rebuild_report": "runner",
    "wilson_interval": "stats",
    "load_suite": "suite",
    "Suite": "suite",
    "token_losses": "perplexity",
    "perplexity_at_length": "perplexity",
    "make_passkey": "probes",
    "make_needle": "probes",
    "run_lm_eval": "lm_tasks",
    "write_task_data": "lm_tasks",
}


def __getattr__(name):
    if name in _WHERE:
        import importlib

        mod = importlib.import_module(f"{__name__}.{_WHERE[name]}")
        return getattr(mod, name)
    raise AttributeError(name)
