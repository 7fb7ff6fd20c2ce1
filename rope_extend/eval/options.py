"""`EvalOptions`: how `run_eval` runs, declared once: the Python API's keywords and, for the fields whose metadata
holds a `help`, `rope-extend eval`'s flags (`cli.options.options_flags`, as for `patch`'s `WriteOptions`); and
`EngineArgs`, the run engine's arguments eval passes through.

Imports nothing heavy: the CLI reads it to declare `eval`'s flags before any command runs."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from ..flags import PLOTS, RESUME, LoadOptions


@dataclass(frozen=True)
class EngineArgs:
    """The arguments `eval --engine NAME` passes through to a run engine's `load`, declared once: each field is
    `eval`'s flag and the Python API's keyword. A run adapter's `options` (`engines.runs.RunEngine`) names the
    fields it takes; `engines.runs.check_engine_args` refuses the others, naming the engines that take them."""

    tensor_parallel_size: int | None = field(default=None, metadata={
        "help": "--engine vllm or sglang: the engine's tensor parallelism (GPUs)."})
    pipeline_parallel_size: int | None = field(default=None, metadata={
        "help": "--engine vllm: vLLM's pipeline parallelism (GPUs or nodes)."})

    def given(self) -> dict[str, int]:
        """The arguments set, by name: what the adapter's `load` receives."""
        return {f.name: value for f in fields(self) if (value := getattr(self, f.name))}


@dataclass(frozen=True)
class EvalOptions(LoadOptions):
    """How `run_eval` runs: the `eval` command's flags and the Python API's keywords (`run_eval(model, specs, suite,
    out, EvalOptions(...))`).

    dtype / device / device_map / memory_check: how the weights load (`flags.LoadOptions`; float32 by default; the
        memory check is transformers' estimate, not made for a run engine, which sizes its own KV cache at start).
    text: perplexity text files (or built-in names) replacing the suite's texts.
    include_baseline: also evaluate the unpatched model (the "before" column).
    resume: skip cases already in ``results.jsonl`` (False starts a fresh file).
    plots: draw the PNG plots the report links.
    interleave: evaluate round by round across variants (see `eval.jobs.plan_jobs`).
    engine: ``transformers`` (the reference: each variant patched in this process) or a run engine registered in
        `engines.runs` (each variant served by the real engine as the card serves the original model with the
        method; see `eval.backends`: variants it does not serve identically are refused before anything loads, and
        the unpatched model's cases beyond its window are left out); `engine_args`: its arguments passed through.
    progress: a bar on a terminal, one line per job otherwise.
    share: one forward for all perplexity lengths of a text on length-independent variants (the same numbers up to
        rounding: in bfloat16 dual-chunk's tokens in its first chunk round otherwise inside a longer forward).
    loader: ``() -> (model, tokenizer)`` replacing `variants.load_model` (tests, custom loading).
    on_record: called with every new record after it has been written.
    worker: a running worker of the run engine to use (the caller closes it).
    """

    text: list[str] | None = field(default=None, metadata={
        "help": "Perplexity text: a file, pydoc_topics or debian_licenses (repeatable; replaces the suite's)."})
    include_baseline: bool = field(default=True, metadata={"flag": "--no-baseline", "help": "Skip the unpatched model."})
    resume: bool = RESUME.field(True)
    plots: bool = PLOTS.field(True)
    interleave: bool = field(default=False, metadata={
        "help": "Sample round by round across variants, so a stopped run compares like with like."})
    engine: str = field(default="transformers", metadata={
        "help": "transformers (the reference, in this process) or a run engine serving each variant: vllm, sglang or mlx "
        "(the real engine; builds its virtualenv once). Variants the engine does not serve identically are refused "
        "before loading."})
    engine_args: EngineArgs = field(default_factory=EngineArgs)
    progress: bool = True
    share: bool = True
    loader: Callable[[], tuple[Any, Any]] | None = None
    on_record: Callable[[dict], None] | None = None
    worker: Any = None

    def __post_init__(self) -> None:
        text = self.text
        if isinstance(text, str | os.PathLike):
            text = [text]
        object.__setattr__(self, "text", [str(t) for t in text] if text else None)
