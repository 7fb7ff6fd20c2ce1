"""Hooks for the rope-extend lm-eval tasks (data is generated locally; see rope_extend.eval.lm_tasks): one loader
per task of `lm_tasks.all_tasks()` (the registered probes and perplexity), named as the task."""

from rope_extend.eval.lm_tasks import all_tasks, load_dataset, process_perplexity, process_probe  # noqa: F401


def _loader(task):
    def load(**metadata):
        return load_dataset(task, **metadata)

    load.__name__ = f"load_{task}"
    return load


def __getattr__(name):  # `custom_dataset: !function utils.<task>`
    if name in all_tasks():
        return _loader(name)
    raise AttributeError(name)


__all__ = sorted(all_tasks())
