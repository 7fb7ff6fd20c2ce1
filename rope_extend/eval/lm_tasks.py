"""lm-evaluation-harness glue: locally generated task data and an in-memory runner.

The task configs live in ``eval/tasks/`` (``rope_passkey``, ``rope_niah_single``,
``rope_niah_multikey``, ``rope_niah_multivalue``, ``rope_vt`` -- tagged ``rope_needle`` --
and ``rope_perplexity``).  Their data is synthesised locally, never downloaded:

* with a tokenizer known (``--model_args pretrained=...`` or ``--metadata '{"tokenizer": ...}'``)
  the prompts are generated on the fly at *exact* token lengths for that tokenizer;
* otherwise the task reads ``<data_dir>/<task>.jsonl`` written beforehand by
  :func:`write_task_data` (``rope-extend eval-tasks --tokenizer PATH``).

Metadata keys (``--metadata`` JSON): ``max_seq_lengths`` (list of ints, default ``[4096]``),
``depths``, ``samples``, ``seed``, ``num_needles``, ``data_dir``, ``tokenizer``.

lm-eval re-tokenises the prompt text, so the length it sees can differ from the nominal
one by a few tokens at segment boundaries; :func:`rope_extend.eval.runner.run_eval` feeds
token ids directly and is exact.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .probes import get_probe, probe_names

TASKS_DIR = Path(__file__).parent / "tasks"  # -> eval/tasks (symlink in the repo, copied into wheels)
DEFAULT_DATA_DIR = TASKS_DIR / "data"
DEFAULT_LENGTHS = [4096]
DEFAULT_DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]


def all_tasks() -> tuple[str, ...]:
    """The tasks: every registered probe (`eval.probes.PROBES`), then perplexity."""
    return probe_names() + ("perplexity",)


def max_answer_tokens(num_needles: int = 4) -> int:
    """The largest answer budget of any probe (`Probe.max_new_tokens`) at *num_needles* needles."""
    return max(get_probe(name).max_new_tokens(num_needles) for name in probe_names())


def _tokenizer(tok):
    if tok is None or not isinstance(tok, (str, os.PathLike)):
        return tok
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tok))


def build_docs(
    tokenizer,
    task: str,
    lengths=None,
    depths=None,
    samples: int = 1,
    seed: int = 0,
    num_needles: int = 4,
    text: str | None = None,
) -> list[dict]:
    """Docs (dicts) for one lm-eval task at the given token lengths."""
    tokenizer = _tokenizer(tokenizer)
    lengths = [int(x) for x in (lengths or DEFAULT_LENGTHS)]
    docs = []
    if task == "perplexity":
        from .perplexity import special_prefix, tokenize_text
        from .texts import load_text, text_label

        ids = tokenize_text(tokenizer, load_text(text)).tolist()[len(special_prefix(tokenizer)):]
        for L in lengths:
            for i in range(int(samples)):
                start = i * L
                if start + L > len(ids):
                    raise ValueError(f"text has {len(ids)} tokens; cannot cut sample {i} of {L} tokens")
                page = tokenizer.decode(ids[start : start + L])
                docs.append({"page": page, "length": L, "index": i, "n_tokens": L, "text": text_label(text)})
        return docs
    from .probes import make_probe

    if task not in probe_names():
        raise ValueError(f"unknown task {task!r}; expected one of {all_tasks()}")
    probe = get_probe(task)
    if probe.spread:
        depths = [None]
    else:
        depths = list(depths) if depths is not None else DEFAULT_DEPTHS
    for L in lengths:
        for d in depths:
            for i in range(int(samples)):
                kw = {"num_needles": int(num_needles)} if probe.needles else {}
                s = make_probe(tokenizer, task, L, 0.5 if d is None else float(d), index=i, seed=seed, **kw)
                docs.append({
                    "input": tokenizer.decode(s.input_ids, skip_special_tokens=True),
                    "target": ", ".join(s.answers),
                    "answers": s.answers,
                    "task": task,
                    "length": L,
                    "depth": -1.0 if s.depth is None else float(s.depth),
                    "index": i,
                    "max_new_tokens": s.max_new_tokens,
                })
    return docs


def write_task_data(
    tokenizer,
    out_dir: str | os.PathLike | None = None,
    tasks=None,
    lengths=None,
    depths=None,
    samples: int = 1,
    seed: int = 0,
    num_needles: int = 4,
) -> dict[str, Path]:
    """Write ``<out_dir>/<task>.jsonl`` for each task (default: `all_tasks()`); returns ``{task: path}``."""
    out = Path(out_dir) if out_dir is not None else DEFAULT_DATA_DIR
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(tokenizer)
    paths = {}
    for t in tasks or all_tasks():
        docs = build_docs(tokenizer, t, lengths, depths, samples, seed, num_needles)
        p = out / f"{t}.jsonl"
        tmp = p.with_suffix(".jsonl.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(d) + "\n" for d in docs)
        os.replace(tmp, p)
        paths[t] = p
    return paths


def load_dataset(task: str, **metadata):
    """``custom_dataset`` entry point used by the YAML configs in ``eval/tasks``."""
    import datasets

    tok = next((metadata.get(k) for k in ("tokenizer", "pretrained") if isinstance(metadata.get(k), str)), None)
    data_dir = metadata.get("data_dir")
    lengths = metadata.get("max_seq_lengths")
    if isinstance(lengths, (int, str)):
        lengths = [int(lengths)]
    if tok and not data_dir:
        docs = build_docs(
            tok, task, lengths, metadata.get("depths"), int(metadata.get("samples", 1)),
            int(metadata.get("seed", 0)), int(metadata.get("num_needles", 4)), metadata.get("text"),
        )
    else:
        path = Path(data_dir or DEFAULT_DATA_DIR) / f"{task}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found: pass a tokenizer (--model_args pretrained=... or --metadata "
                f"'{{\"tokenizer\": ...}}') or run `rope-extend eval-tasks --tokenizer PATH`"
            )
        docs = [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        if lengths:
            docs = [d for d in docs if d["length"] in {int(x) for x in lengths}]
    return {"test": datasets.Dataset.from_list(docs)}


def process_probe(doc: dict, results: list) -> dict:
    from .probes import ProbeSample, score

    sample = ProbeSample(doc["task"], doc["length"], None, doc["index"], [], list(doc["answers"]))
    return {"score": score(sample, results[0])}


def process_perplexity(doc: dict, results: list) -> dict:
    import re

    (ll,) = results
    page = doc["page"]
    n_bytes = len(page.encode("utf-8"))
    return {
        "token_perplexity": (ll, int(doc["n_tokens"])),
        "word_perplexity": (ll, len(re.split(r"\s+", page))),
        "byte_perplexity": (ll, n_bytes),
        "bits_per_byte": (ll, n_bytes),
    }


def run_lm_eval(
    model,
    tokenizer,
    tasks: list[str] | str,
    *,
    lengths: list[int] | None = None,
    metadata: dict | None = None,
    limit: float | None = None,
    batch_size: int = 1,
    max_length: int | None = None,
    include_path: str | os.PathLike | None = None,
    log_samples: bool = False,
    **kwargs,
) -> dict:
    """Run lm-eval tasks on an already loaded (and possibly patched) in-memory model.

    ``max_length`` defaults to the larger of the model's (patched) ``max_position_embeddings`` and
    the longest prompt + the largest answer budget of a probe at the metadata's ``num_needles`` (lm-eval
    left-truncates prompts longer than ``max_length`` minus the generation budget, which would silently cut the
    haystack).  Returns lm-eval's results dict (``results[task]["score,none"]`` etc.).
    """
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    tokenizer = _tokenizer(tokenizer)
    if max_length is None:
        # room for the longest prompt plus the answer: lm-eval would otherwise left-truncate prompts
        answer = max_answer_tokens(int((metadata or {}).get("num_needles", 4)))
        max_length = max(int(model.config.max_position_embeddings), max(lengths or DEFAULT_LENGTHS) + answer)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length)
    md = {"max_seq_lengths": list(lengths or DEFAULT_LENGTHS)}
    name = getattr(tokenizer, "name_or_path", None)
    if name and Path(str(name)).exists():
        md["tokenizer"] = str(name)
    md.update(metadata or {})
    if "tokenizer" not in md and "data_dir" not in md:
        raise ValueError("cannot locate the tokenizer on disk: pass metadata={'tokenizer': PATH} or a data_dir")
    tm = TaskManager(include_path=str(include_path or TASKS_DIR), metadata=md)
    if isinstance(tasks, str):
        tasks = [tasks]
    return simple_evaluate(
        model=lm, tasks=list(tasks), task_manager=tm, limit=limit, log_samples=log_samples, **kwargs
    )



def run_lm_eval_vllm(
    checkpoint: str | os.PathLike,
    tasks: list[str] | str,
    *,
    lengths: list[int],
    max_model_len: int,
    metadata: dict | None = None,
    limit: float | None = None,
    include_path: str | os.PathLike | None = None,
    log_samples: bool = False,
    engine_args: dict | None = None,
    **kwargs,
) -> dict:
    """Run lm-eval tasks with lm-eval's own vLLM backend on a checkpoint folder (its config.json carries the
    scaling), in this process: it must be vLLM's Python with lm-eval (`python -m rope_extend.engines.vllm.env
    --with lm-eval --print-python`), and the caller runs under ``if __name__ == "__main__":``.

    One process on the CPU: vLLM's engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, set here before vLLM
    is imported), float32, eager, its KV cache sized for one request of ``max_model_len`` tokens (prompt + answer).
    ``engine_args`` go to `vllm.LLM` as they are (``tensor_parallel_size``...).
    """
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from lm_eval import simple_evaluate
    from lm_eval.models.vllm_causallms import VLLM
    from lm_eval.tasks import TaskManager

    from ..engines.vllm.run import kv_cache_bytes

    config = json.loads((Path(checkpoint) / "config.json").read_text())
    args = {"dtype": "float32", "enforce_eager": True, "seed": 0, "max_model_len": int(max_model_len),
            "kv_cache_memory_bytes": kv_cache_bytes(config, max_model_len),
            "distributed_executor_backend": "uni", **(engine_args or {})}
    lm = VLLM(pretrained=str(checkpoint), batch_size=1, **args)
    md = {"max_seq_lengths": list(lengths), "tokenizer": str(checkpoint), **(metadata or {})}
    tm = TaskManager(include_path=str(include_path or TASKS_DIR), metadata=md)
    return simple_evaluate(model=lm, tasks=[tasks] if isinstance(tasks, str) else list(tasks), task_manager=tm,
                           limit=limit, log_samples=log_samples, **kwargs)
