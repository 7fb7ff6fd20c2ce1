"""Hooks for the rope-extend lm-eval tasks (data is generated locally; see rope_extend.eval.lm_tasks)."""

from rope_extend.eval.lm_tasks import load_dataset, process_perplexity, process_probe  # noqa: F401


def _loader(task):
    def load(**metadata):
        return load_dataset(task, **metadata)

    load.__name__ = f"load_{task}"
    return load


passkey = _loader("passkey")
niah_single = _loader("niah_single")
niah_multikey = _loader("niah_multikey")
niah_multivalue = _loader("niah_multivalue")
vt = _loader("vt")
perplexity = _loader("perplexity")

__all__ = ["niah_multikey", "niah_multivalue", "niah_single", "passkey", "perplexity", "vt"]
