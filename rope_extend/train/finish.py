"""The last stage of a training run: OUT written from the trained model, throwing nothing trained away.

`write_trained` merges LoRA, writes OUT with the run's plan through the checkpoint writer `patch --mode full` uses
(`checkpoint.write_checkpoint`: portable config, stock reload verified against the trained model, the card
with its training section from `training_card`), then evaluates OUT when --eval-suite asked (`evaluation`).
Trainer saved the last step's checkpoint in `OUT.train-state/` before this runs; it is removed only once OUT is
written, so whatever fails here (verification, a full disk, a signal) keeps the trained weights and says how to
finish (`keeping_trained_weights`); rerunning the same command resumes at the last step, trains nothing and comes
back here. `summary` is what training.json and the card say about the run.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from ..checkpoint import write_checkpoint
from ..write_options import WriteOptions
from . import evaluation, lora, training_card
from .prepare import Prepared
from .progress import TrainingInterrupted, complete_checkpoints


def unverified_dir(out: Path) -> Path:
    """Where a trained checkpoint that fails verification is kept: beside OUT, never OUT itself (OUT exists only
    verified, or written with --no-verify)."""
    return out.parent / f"{out.name}.unverified"


class WriteInterrupted(TrainingInterrupted):
    """SIGTERM / Ctrl-C while OUT was being written, after training had finished: OUT was not created; the last
    checkpoint (the trained weights) is kept and rerunning the same command writes OUT from it."""

    def __init__(self, signum: int, state_dir: Path, step: int, checkpoint: Path | None, out: Path):
        super().__init__(signum, state_dir, step)
        self.checkpoint, self.out = checkpoint, out

    def message(self) -> str:
        import signal

        return (f"interrupted ({signal.Signals(self.signum).name}) while writing {self.out}, after training finished "
                f"at step {self.step}: nothing was left at {self.out}; the trained weights are kept in "
                f"{self.checkpoint or self.state_dir}; {_finish_hint(self.out)}")


def _finish_hint(out: Path, verb: str = "write", extra: str = "") -> str:
    return (f"rerun the same command (the same -o: the state is {out.name}.train-state beside it) to {verb} "
            f"{out.name} from them without training again ({extra}--restart discards them)")


@contextlib.contextmanager
def keeping_trained_weights(prep: Prepared, step: int, checkpoint: Path | None):
    """Turn whatever fails after the optimizer ran into one message that says what failed, where the trained
    weights are and how to finish; a signal during the write names itself. The state folder is never removed here."""
    import signal
    import threading

    from ..errors import TrainedNotWrittenError, UnverifiedCheckpointError

    seen: list[int] = []
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

        def note(signum, frame):  # record which signal, then let the handler in place (the CLI's) act
            seen.append(signum)
            handler = previous[signum]
            if callable(handler):
                handler(signum, frame)
            raise KeyboardInterrupt

        for s in previous:
            signal.signal(s, note)
    kept_weights = str(checkpoint or prep.spec.state_dir())
    try:
        yield
    except UnverifiedCheckpointError as exc:
        raise TrainedNotWrittenError(
            f"the trained checkpoint did not verify: {exc.reason}. Nothing was thrown away: the trained model is in "
            f"{exc.kept} (loadable with transformers; its README.md says it is unverified and why), and "
            f"{kept_weights} holds the trained weights with the optimizer state; to verify again, "
            f"{_finish_hint(prep.out, 'write and verify', '--no-verify writes it unchecked; ')}",
            checkpoint=kept_weights, kept=exc.kept) from None
    except KeyboardInterrupt:
        raise WriteInterrupted(seen[-1] if seen else signal.SIGINT, prep.spec.state_dir(), step, checkpoint,
                               prep.out) from None
    except Exception as exc:
        raise TrainedNotWrittenError(
            f"training finished at step {step}, but {prep.out} was not written: {' '.join(str(exc).split())}. "
            f"The trained weights are kept in {kept_weights}; {_finish_hint(prep.out)}",
            checkpoint=kept_weights) from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def write_trained(prep: Prepared, trainer, model, base, summary: dict, eval_before, resumed: int, say):
    """Write OUT from the trained model (merging LoRA), verify it, evaluate it (--eval-suite). Before this runs,
    Trainer saved the last step's checkpoint in the state folder; it is removed only once OUT is written, so a
    failure or a signal here loses nothing (`keeping_trained_weights`) and a rerun resumes at the last step, trains
    nothing and comes back here."""
    spec, state_dir, step = prep.spec, prep.spec.state_dir(), trainer.state.global_step
    adapters, verify = spec.adapters, spec.finish.verify
    checkpoint = (complete_checkpoints(state_dir) or [None])[-1]  # Trainer saves one at the last step
    kept = unverified_dir(prep.out)
    with keeping_trained_weights(prep, step, checkpoint):
        adapter = state_dir / "adapter"
        if adapters.save_adapter:  # before merging: merge_and_unload takes the adapters out of the model
            model.save_pretrained(adapter)
        final = lora.merge(model) if adapters.enabled else base
        final.config.use_cache = True
        if resumed >= step:
            say(f"training had finished ({checkpoint.name if checkpoint else 'step ' + str(step)}); writing "
                f"{'and verifying ' if verify else ''}the checkpoint from it")
        else:
            say(f"training done; writing {'and verifying ' if verify else ''}the checkpoint")

        def extra(folder: Path) -> None:
            training_card.write_files(folder, summary, [dict(row) for row in trainer.state.log_history])
            if adapters.save_adapter:
                shutil.copytree(adapter, folder / "adapter")

        training = training_card.section(summary, None if eval_before is None
                                         else evaluation.section(prep, eval_before, None))
        options = WriteOptions(overwrite=spec.finish.overwrite, verify=verify, extra=extra, keep_unverified=kept,
                               training=training, engines_report=False)
        result = write_checkpoint(prep.loaded, prep.plan, prep.out, options, model=final)
    shutil.rmtree(state_dir, ignore_errors=True)  # OUT holds the trained model now
    if (kept / "rope_extend.yaml").is_file():  # a previous run's unverified copy of the same training
        shutil.rmtree(kept, ignore_errors=True)
        say(f"removed {kept} (an earlier run's unverified copy; {prep.out} is {'verified' if result.verified else 'written'})")
    if eval_before is not None:
        say("evaluating the trained checkpoint")
        try:
            evaluation.write_after(prep, result.out, eval_before, evaluation.after(prep, result.out), summary)
        except Exception as exc:
            from ..errors import TrainedNotWrittenError

            raise TrainedNotWrittenError(
                f"{result.out} is written{' and verified' if result.verified else ''}, but its evaluation after "
                f"training failed: {' '.join(str(exc).split())}; evaluate it with `rope-extend eval {result.out} "
                f"--suite {spec.evaluation.suite}`") from None
    return result


def summary(prep: Prepared, steps: int, tokens: int, seconds: float, losses: list[float]) -> dict:
    """training.json's numbers (and the card's): the recipe, the data, steps, tokens, time, device, the loss."""
    import torch

    opt, adapters, plan = prep.spec.optimisation, prep.spec.adapters, prep.plan
    recipe = {
        "method": plan.spec.method, "factor": plan.spec.factor, "original_length": plan.spec.original_max_position_embeddings,
        "target_length": plan.spec.target_length, "window": prep.window, "pose": prep.pose,
        "global_windows": prep.global_windows, "world_size": prep.world, "micro_batch": opt.micro_batch,
        "accumulation": prep.accumulation, "learning_rate": opt.learning_rate, "adam_beta1": opt.adam_beta1,
        "adam_beta2": opt.adam_beta2, "weight_decay": opt.weight_decay, "warmup_steps": opt.warmup(),
        "scheduler": opt.scheduler, "seed": opt.seed, "lora": adapters.enabled, "lora_r": adapters.r,
        "lora_alpha": adapters.alpha, "lora_dropout": adapters.dropout,
        "train_embeddings_and_norms": adapters.train_embeddings_and_norms, "steps": opt.steps,
        "sequence_parallel": prep.parallelism.size,
    }
    return {
        "title": f"{plan.spec.method} x{plan.spec.factor:g}, window {prep.window}",
        "recipe": recipe,
        "data": [s.to_dict() for s in prep.corpus.sources],
        "steps": steps,
        "tokens_trained": tokens,
        "wall_seconds": seconds,
        "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
        "device": f"{prep.device} x{prep.world}, torch {torch.__version__}",
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "loss_means": loss_means(losses),
    }


def loss_means(losses: list[float]) -> dict | None:
    """Mean loss of the first and the last tenth of the logged steps (at least one each): one step's loss depends on
    its batch, so first -> last alone can read as divergence on a short, noisy run."""
    if not losses:
        return None
    k = max(1, len(losses) // 10)
    return {"steps": k, "first": sum(losses[:k]) / k, "last": sum(losses[-k:]) / k}
