"""Hooks for the rope-extend lm-eval tasks (data is generated locally; see rope_extend.eval.lm_tasks): one loader
per task of `lm_tasks.all_tasks()` (the registered probes and perplexity), named as the task, and `ProbeTask`, the
task class of every probe (`class: !function utils.ProbeTask`): each prompt's answer budget is its probe's."""

from lm_eval.api.task import ConfigurableTask

from rope_extend.eval.lm_tasks import all_tasks, load_dataset, process_perplexity, process_probe  # noqa: F401


class ProbeTask(ConfigurableTask):
    """A probe as an lm-eval `generate_until` task whose answer budget is the probe's, per prompt: lm-eval's
    `max_gen_toks` of each request is its doc's ``max_new_tokens`` (`Probe.max_new_tokens`: 12 per needle for
    niah_multivalue, 8 per variable for vt), so a prompt with 8 needles gets the tokens 8 answers take. The task
    files set no `max_gen_toks` of their own: the probe's declaration is the one place it is written."""

    def __init__(self, data_dir=None, cache_dir=None, download_mode=None, config: dict | None = None):
        # lm-eval hands a `class:` task its whole config, the `class` key included, which TaskConfig does not take
        super().__init__(data_dir, cache_dir, download_mode, {k: v for k, v in (config or {}).items() if k != "class"})

    def construct_requests(self, doc, ctx, **kwargs):
        requests = super().construct_requests(doc, ctx, **kwargs)
        for request in requests if isinstance(requests, list) else [requests]:
            request.arguments[1]["max_gen_toks"] = int(doc["max_new_tokens"])
        return requests


def _loader(task):
    def load(**metadata):
        return load_dataset(task, **metadata)

    load.__name__ = f"load_{task}"
    return load


def __getattr__(name):  # `custom_dataset: !function utils.<task>`
    if name in all_tasks():
        return _loader(name)
    raise AttributeError(name)


__all__ = sorted([*all_tasks(), "ProbeTask"])
