"""What a training run says while it runs, and how it stops on a signal.

- Before the first step: tokens per step and in all (`plan_line`); after the first micro-batch, its measured time
  and an estimate of the step and the whole run from it (`estimate_line`), so a run that would take hours says so
  in its first minute.
- Inside a step of many micro-batches: a line every `INTERVAL_SECONDS` (`micro-batch m/M`); after every logged
  step: loss, learning rate, tokens/s, ETA.
- The first SIGTERM/SIGINT: a line saying the run stops after the current step with a checkpoint, and that a second
  signal stops at once keeping the last checkpoint; the second raises `TrainingInterrupted(now=True)`, which names
  that checkpoint (the CLI prints what is on disk and how to resume).
"""

from __future__ import annotations

import contextlib
import math
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

INTERVAL_SECONDS = 30.0  # in-step progress at most this often


class TrainingInterrupted(KeyboardInterrupt):
    """SIGTERM / Ctrl-C during training. `now=False`: the run stopped after a step and saved `checkpoint`;
    `now=True`: a second signal stopped it mid-step and `checkpoint` is the newest one on disk (or None)."""

    def __init__(self, signum: int, state_dir: Path, step: int, checkpoint: Path | None = None, now: bool = False):
        super().__init__(f"interrupted at step {step}")
        self.signum, self.state_dir, self.step, self.checkpoint, self.now = signum, state_dir, step, checkpoint, now

    def message(self) -> str:
        """One line: which signal, where it stopped, what is left on disk, how to go on."""
        name = signal.Signals(self.signum).name
        how = "stopped now (second signal)" if self.now else "stopped after the step"
        if self.checkpoint is not None:
            kept = (f"kept: {self.checkpoint} (step {self.checkpoint.name.split('-')[-1]}) in {self.state_dir}; "
                    "rerun the same command to resume from it (--restart discards it)")
        else:
            kept = (f"no checkpoint was saved yet ({self.state_dir} holds only the run's fingerprint); rerunning the "
                    "same command starts over")
        return f"interrupted ({name}) at step {self.step}: {how}; {kept}"


def duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    if seconds >= 86400:
        return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def plan_line(steps: int, resumed: int, tokens_per_step: int, accumulation: int, micro_tokens: int) -> str:
    left = steps - resumed
    if left <= 0:  # a rerun after training finished (a failed write or verification): only the write is left
        return f"all {steps} step(s) already trained (resumed at step {resumed}): no step to run; writing OUT"
    return (f"{tokens_per_step:,} tokens per step ({accumulation} micro-batch(es) of {micro_tokens:,} tokens per "
            f"process), {left} step(s) to run = {left * tokens_per_step:,} tokens; timing the first micro-batch")


def estimate_line(seconds: float, micro_tokens: int, accumulation: int, steps_left: int) -> str:
    step = seconds * accumulation
    return (f"first micro-batch: {seconds:.1f} s for {micro_tokens:,} tokens ({micro_tokens / seconds:,.0f} tokens/s "
            f"per process, warm-up included); estimate ~{duration(step)} per step, ~{duration(step * steps_left)} "
            f"for {steps_left} step(s)")


def complete_checkpoints(state: Path) -> list[Path]:
    """checkpoint-N folders a SIGKILL did not cut short (Trainer writes trainer_state.json last), oldest first."""
    found = []
    for folder in state.glob("checkpoint-*"):
        with contextlib.suppress(ValueError):
            step = int(folder.name.split("-", 1)[1])
            if (folder / "trainer_state.json").is_file():
                found.append((step, folder))
    return [f for _, f in sorted(found)]


def newest_checkpoint(state: Path) -> Path | None:
    found = complete_checkpoints(state) if state.is_dir() else []
    return found[-1] if found else None


def callback(steps: int, resumed: int, tokens_per_step: int, accumulation: int, micro_tokens: int,
             state_dir: Path, keep: int, say: Callable[[str], None] | None):
    """The Trainer callback of one run: progress lines (main process, `say`), stop-after-step on a signal,
    pruning of old checkpoints."""
    from transformers import TrainerCallback

    quiet = say is None
    say = say or (lambda line: None)

    class Progress(TrainerCallback):
        def __init__(self):
            self.signum: int | None = None
            self.step = resumed  # the step in progress (global_step + 1 once it begins)
            self.started = self.step_started = self.last_line = time.perf_counter()
            self.micro = 0
            self.estimated = False

        # --- signals ---------------------------------------------------------------------------------------------
        def signalled(self, signum: int) -> None:
            if self.signum is not None:  # a second signal: stop now, keeping the newest checkpoint
                raise TrainingInterrupted(signum, state_dir, self.step, newest_checkpoint(state_dir), now=True)
            self.signum = signum
            name = signal.Signals(signum).name
            if not quiet:
                say(f"{name} received: stopping after the current step ({self.step}/{steps}) with a checkpoint in "
                    f"{state_dir}; send it again (or Ctrl-C) to stop now, keeping the last checkpoint")

        # --- progress --------------------------------------------------------------------------------------------
        def on_step_begin(self, args, state, control, **kwargs):
            self.step, self.micro = state.global_step + 1, 0
            self.step_started = time.perf_counter()

        def _micro_done(self, state) -> None:
            self.micro += 1
            now = time.perf_counter()
            if not self.estimated and state.is_world_process_zero:
                self.estimated = True
                self.last_line = now
                say(estimate_line(now - self.step_started, micro_tokens, accumulation, steps - resumed))
            elif self.micro < accumulation and now - self.last_line >= INTERVAL_SECONDS and state.is_world_process_zero:
                self.last_line = now
                done = self.micro * micro_tokens
                say(f"step {self.step}/{steps}: micro-batch {self.micro}/{accumulation} "
                    f"({done / (now - self.step_started):,.0f} tokens/s per process)")

        def on_substep_end(self, args, state, control, **kwargs):
            self._micro_done(state)

        def on_step_end(self, args, state, control, **kwargs):
            self._micro_done(state)
            if self.signum is not None:
                control.should_save = True
                control.should_training_stop = True
            return control

        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:  # keep the newest checkpoints (by step, never by mtime)
                for folder in complete_checkpoints(Path(args.output_dir))[:-keep]:
                    shutil.rmtree(folder, ignore_errors=True)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or quiet or not logs or "loss" not in logs:
                return
            done = state.global_step - resumed
            elapsed = time.perf_counter() - self.started
            rate = done * tokens_per_step / elapsed if elapsed > 0 and done > 0 else 0.0
            eta = (steps - state.global_step) * elapsed / done if done > 0 else float("nan")
            self.last_line = time.perf_counter()
            say(f"step {state.global_step}/{steps} loss {logs['loss']:.4f} lr {logs.get('learning_rate', 0):.2e} "
                f"{rate:,.0f} tokens/s ETA {duration(eta)}")

    return Progress()


@contextlib.contextmanager
def stop_on_signals(progress):
    """SIGTERM/SIGINT go to `progress.signalled` (stop after the step; a second one stops now); the previous
    handlers (the CLI's) come back after."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum, frame):
        progress.signalled(signum)

    for s in previous:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def progress_printer(stream=None) -> Callable[[str], None]:
    """One line per log step (stderr, flushed); on a terminal the line is rewritten in place."""
    import sys

    stream = stream or sys.stderr
    tty = stream.isatty()

    def show(line: str) -> None:
        if tty:
            stream.write("\r\033[K" + f"rope-extend: {line}")
            if not line.startswith("step "):
                stream.write("\n")
        else:
            stream.write(f"rope-extend: {line}\n")
        stream.flush()

    return show
