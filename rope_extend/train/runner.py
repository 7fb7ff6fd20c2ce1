"""`train_model`: one `rope-extend train` run (what the CLI and `accelerate launch` / `torchrun` call), stage by stage.

1. `prepare` (prepare.py): validate everything (numbers, method, paths, texts, held-out overlap, window), read
   SOURCE's config once, make and verify the run's one plan, choose how the windows spread over the processes (one
   `parallelism.Parallelism`, whose methods the later stages call), tokenize; refusals come here, before any model
   loads.
2. `evaluation.before` when --eval-suite asked (SOURCE unpatched and training-free).
3. `trainer` (trainer.py): the model loaded and patched with that plan, LoRA when asked, transformers' `Trainer`.
   Memory linear in the window: the loss in chunks (`loss.py`), attention through a memory-efficient SDPA kernel
   (`sdpa.py`, checked before loading), gradient checkpointing when the window needs it. What it prints and how
   signals stop it: `progress.py`. Under `accelerate launch` with FSDP or DeepSpeed ZeRO-3 (also on CPU processes):
   `sharding.py`; the trained weights are gathered from every process and the main one writes OUT from a whole copy.
4. `finish` (finish.py): OUT written with the same plan through the checkpoint writer `patch` uses, verified,
   evaluated after (`evaluation.after`).

Resumable: Trainer checkpoints go to `OUT.train-state/` beside OUT every `save_steps`; SIGTERM or Ctrl-C saves one at
the end of the current step and stops (a second signal stops at once, keeping the newest checkpoint). Rerunning the
same command resumes from the newest complete checkpoint (its weights, optimizer, scheduler and RNG state; the data
is drawn by sample index, so it continues exactly), and ends at the same weights as an uninterrupted run. The state
folder is removed after OUT is written.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..zero3 import without_zero3_init
from . import data, evaluation, finish, sharding, trainer
from .prepare import prepare, world
from .progress import TrainingInterrupted, complete_checkpoints
from .recipe import TrainSpec


@dataclass
class TrainResult:
    out: Path | None  # None on processes other than the main one
    steps: int
    tokens: int
    seconds: float
    first_loss: float | None
    last_loss: float | None
    resumed_from: int  # the step the run resumed from (0: a fresh run)
    verified: bool
    summary: dict


def train_model(spec: TrainSpec, on_progress: Callable[[str], None] | None = None) -> TrainResult:
    """Run one training (see the module docstring). Returns a `TrainResult`; raises `TrainingInterrupted` after
    saving a checkpoint when SIGTERM/SIGINT arrives."""
    started = time.perf_counter()
    prep = prepare(spec)
    processes, rank = world()
    main = rank == 0
    say = on_progress if (on_progress is not None and main) else (lambda line: None)
    say(f"data: {len(prep.corpus.streams)} streams, {prep.corpus.tokens:,} tokens; window {prep.window}"
        f"{' (PoSE, positions to ' + str(prep.target) + ')' if prep.pose else ''}; {prep.batch_line()}")
    eval_before = evaluation.before(prep) if (spec.evaluation.suite and main) else None
    resume_from = trainer.open_state(prep, main)
    state_dir = spec.state_dir()
    checkpointing, checkpointing_line = trainer.gradient_checkpointing(prep)
    note = prep.parallelism.compile_note(sharding.asked())
    if note:
        say(note)
    args = trainer.training_arguments(prep, state_dir, checkpointing)
    choice, chunk = trainer.memory_plan(prep)
    say(f"attention: {choice.describe()}; {checkpointing_line}; loss in chunks of {chunk:,} positions")
    model, base = trainer.model_to_train(prep)
    steps, seed = spec.optimisation.steps, spec.optimisation.seed
    dataset = data.WindowDataset(prep.corpus, prep.window, prep.target, steps * prep.global_windows, seed)
    resumed = trainer.resumed_step(resume_from)
    if resume_from is not None:
        say(f"resuming from {resume_from.name} (step {resumed}/{steps})")
    from .progress import newest_checkpoint, plan_line, stop_on_signals

    say(plan_line(steps, resumed, prep.tokens_per_step, prep.accumulation, prep.micro_tokens))
    control = trainer.callbacks(prep, say if on_progress else None, resumed)
    from transformers import PrinterCallback

    from . import sdpa

    with sharding.fsdp_on_cpu():
        run = trainer.trainer_class()(model=model, args=args, train_dataset=dataset, data_collator=data.collate,
                                      callbacks=[control])
    run.remove_callback(PrinterCallback)
    processes_line = prep.parallelism.processes_line(sharding.describe(run), processes)
    if processes > 1 or sharding.asked():
        say(f"processes: {processes_line}")
    note = sharding.note(run)
    if note:
        say(note)
    run.tokens_per_step = prep.tokens_per_step
    run.loss_chunk_tokens = chunk
    run.forward_autocast = trainer.forward_autocast(prep)
    run.clock_offset = trainer.previous_seconds(resume_from)
    run.clock_start = time.perf_counter()
    scoped = contextlib.ExitStack()  # entered here, before the kernel's swap (`sdpa.installed`)
    scoped.enter_context(prep.parallelism.training_scope(prep.accumulation))
    with stop_on_signals(control), sdpa.installed(choice), scoped, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run.train(resume_from_checkpoint=str(resume_from) if resume_from is not None else None)
    if control.signum is not None:
        raise TrainingInterrupted(control.signum, state_dir, run.state.global_step, newest_checkpoint(state_dir))
    history = [dict(row) for row in run.state.log_history if "loss" in row]
    losses = [row["loss"] for row in history]
    train_seconds = history[-1]["train_seconds"] if history else time.perf_counter() - started
    tokens = run.state.global_step * prep.tokens_per_step
    summary = finish.summary(prep, run.state.global_step, tokens, train_seconds, losses)
    summary["precision"] = trainer.precision(prep)
    summary["processes"] = processes_line
    if eval_before is not None:
        summary["eval"] = evaluation.summary(prep, eval_before, None)
    if sharding.is_sharded(run):  # every process gathers; the main one writes from a whole copy
        with finish.keeping_trained_weights(prep, run.state.global_step,
                                            (complete_checkpoints(state_dir) or [None])[-1]):
            model = sharding.unsharded_model(run, lambda: trainer.whole_copy(prep))
        base = model if not spec.adapters.enabled else None
    first, last = (losses[0], losses[-1]) if losses else (None, None)
    if not main:
        return TrainResult(None, run.state.global_step, tokens, train_seconds, first, last, resumed, False, summary)
    with without_zero3_init():  # the writer's stock reload is this process's alone
        result = finish.write_trained(prep, run, model, base, summary, eval_before, resumed, say)
    return TrainResult(result.out, run.state.global_step, tokens, train_seconds, first, last, resumed,
                       result.verified, summary)
