"""The second stage of a training run: the model and transformers' `Trainer` that trains it.

From `Prepared` (the run's plan, config, window and batch split, `prepare.py`): the model loaded from SOURCE with
the plan applied as planned (`patch.apply_patch(model, plan)`: the frequencies are rebuilt in the modules, not just the
config), LoRA-wrapped when asked; the `TrainingArguments` of the recipe; gradient checkpointing when the window
needs it; the memory plan (a memory-efficient attention kernel, `sdpa.py`; the loss in chunks, `loss.py`);
the resume state in `OUT.train-state/`; and `RopeExtendTrainer`, the Trainer subclass (sequential sampling, the
chunked loss, checkpoints without config.json, tokens and wall time in every log entry).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from .. import compat, memory
from ..zero3 import without_zero3_init
from . import lora, sequence_parallel, sharding
from .prepare import Prepared, available_memory
from .progress import complete_checkpoints
from .recipe import needs_checkpointing

FINGERPRINT = "fingerprint.json"
KEEP_CHECKPOINTS = 2


# --- the model -------------------------------------------------------------------------------------------------------
def load_patched_model(prep: Prepared):
    """The model loaded from SOURCE with the run's plan applied (frequencies rebuilt, config rewritten); the plan
    was verified when it was made (`prepare`)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from ..patch import apply_patch

    hf_logging.disable_progress_bar()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(prep.source, **compat.dtype_kwargs(torch.float32))
        apply_patch(model, prep.plan)
    model.config.use_cache = False
    prep.parallelism.check_loaded(model)
    return model


class ModelToTrain(NamedTuple):
    """The model the Trainer trains (LoRA-wrapped when asked) and the base model inside it."""

    model: Any
    base: Any


def model_to_train(prep: Prepared) -> ModelToTrain:
    """SOURCE patched with the plan, LoRA-wrapped when asked (peft changes the base model in place)."""
    adapters = prep.spec.adapters
    base = load_patched_model(prep)
    if not adapters.enabled:
        return ModelToTrain(base, base)
    return ModelToTrain(lora.wrap(base, adapters.r, adapters.alpha, adapters.dropout,
                                  adapters.train_embeddings_and_norms, prep.spec.optimisation.seed), base)


def whole_copy(prep: Prepared):
    """The model as training started, built whole in this process, for a sharded run's gathered weights."""
    with without_zero3_init():
        return model_to_train(prep).model


# --- the arguments ---------------------------------------------------------------------------------------------------
class Checkpointing(NamedTuple):
    """Whether gradient checkpointing is on, and why (the progress line's words)."""

    on: bool
    why: str


def gradient_checkpointing(prep: Prepared) -> Checkpointing:
    """(on?, the reason the progress line gives): `--gradient-checkpointing on|off`, or `auto`: on when one
    micro-batch's activations (`memory.activation_bytes`) would take more than half of the memory the weights,
    gradients and AdamW state leave free."""
    mode, dtype = prep.spec.compute.gradient_checkpointing, prep.spec.compute.dtype
    if _fsdp_checkpoints():  # transformers refuses both at once: FSDP's own wraps every layer
        return Checkpointing(False, "gradient checkpointing by FSDP (fsdp_activation_checkpointing in the accelerate "
                             "config)")
    if mode in ("on", "off"):
        return Checkpointing(mode == "on", f"gradient checkpointing {mode}")
    float32 = dtype == "float32" or (dtype == "auto" and prep.device == "cpu")
    element = 4 if float32 else 2  # mixed precision keeps most activations in 16 bits
    activations = prep.micro_tokens * memory.training_per_token(prep.text, element, checkpointing=False)
    params = memory.weights_bytes(prep.source, "float32") // 4
    available, fixed = available_memory(), memory.ADAMW_BYTES * params  # float32 weights, gradients, AdamW's moments
    on = needs_checkpointing(activations, fixed, available)
    return Checkpointing(on, f"gradient checkpointing {'on' if on else 'off'} (auto: ~{activations / 2**30:.1f} GiB "
                         f"of activations per micro-batch without it, {available / 2**30:.1f} GiB available)")


def _fsdp_checkpoints() -> bool:
    """An accelerate FSDP launch whose config checkpoints activations itself (on the CPU too: `sharding.fsdp_on_cpu`)."""
    return (sharding.asked() == "FSDP"
            and os.environ.get("FSDP_ACTIVATION_CHECKPOINTING", "false").lower() == "true")


def training_arguments(prep: Prepared, state: Path, checkpointing: bool | None = None):
    from transformers import TrainingArguments

    opt, progress, device = prep.spec.optimisation, prep.spec.progress, prep.device
    # Mixed precision is accelerate's autocast (float32 weights and optimizer state), except with a DeepSpeed config
    # of rope-extend's own (--sequence-parallel): DeepSpeed then runs in float32 and the autocast is rope-extend's
    # (`forward_autocast`), so that it is the same scheme as one process; DeepSpeed's bf16 would train bf16 weights.
    mixed = prep.compute_dtype if forward_autocast(prep) is None else "float32"
    kwargs = dict(
        output_dir=str(state),
        max_steps=opt.steps,
        per_device_train_batch_size=opt.micro_batch,
        gradient_accumulation_steps=prep.accumulation,
        learning_rate=opt.learning_rate,
        warmup_steps=opt.warmup(),
        lr_scheduler_type=opt.scheduler,
        adam_beta1=opt.adam_beta1,
        adam_beta2=opt.adam_beta2,
        weight_decay=opt.weight_decay,
        max_grad_norm=opt.max_grad_norm,
        optim="adamw_torch",
        seed=opt.seed,
        data_seed=opt.seed,
        logging_steps=progress.logging_steps,
        logging_first_step=True,
        save_strategy="steps",
        save_steps=progress.save_steps or max(1, opt.steps // 10),
        save_total_limit=None,  # pruned by step number in the callback (Trainer's own rotation sorts by mtime, which
        # races with the other ranks still writing their rng_state_N.pth in DDP)
        report_to=[],
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        bf16=mixed == "bfloat16",
        fp16=mixed == "float16",
        use_cpu=device == "cpu",
        full_determinism=device == "cpu",
        log_level="error",
    )
    if checkpointing is None:
        checkpointing = gradient_checkpointing(prep).on
    if checkpointing:
        kwargs["gradient_checkpointing"] = True
        kwargs["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    if device == "cpu" and prep.world > 1:
        kwargs["ddp_backend"] = "gloo"
    kwargs.update(prep.parallelism.training_arguments(prep.world))
    args = TrainingArguments(**kwargs)
    prep.parallelism.arguments_made()
    return args


def forward_autocast(prep: Prepared):
    """The autocast dtype rope-extend applies to the model's forward itself (None: accelerate's, or none): a
    mixed-precision run on a DeepSpeed config of rope-extend's own (`--sequence-parallel`: `prep.deepspeed`)."""
    import torch

    if prep.deepspeed is None or prep.compute_dtype == "float32":
        return None
    return getattr(torch, prep.compute_dtype)


def precision(prep: Prepared) -> str:
    """The compute precision the run trains in, for training.json and the card."""
    if prep.compute_dtype == "bfloat16":
        return "bfloat16 mixed precision (float32 weights and optimizer state)"
    if prep.compute_dtype == "float16":
        return "float16 mixed precision (float32 weights and optimizer state, loss scaling)"
    return "float32"


def memory_plan(prep: Prepared):
    """(the attention path, positions per loss chunk) for this run's device and compute dtype: the attention
    kernel is checked to be a memory-efficient one (`sdpa.choose`, refusing the run otherwise) and the loss
    never holds more than one chunk's logits (`loss.py`)."""
    import torch

    from . import sdpa
    from .loss import chunk_tokens_for

    choice = sdpa.choose(prep.config, prep.device, getattr(torch, prep.compute_dtype), prep.window)
    return choice, prep.spec.compute.loss_chunk or chunk_tokens_for(prep.text.vocab_size)


# --- resume state ----------------------------------------------------------------------------------------------------
def open_state(prep: Prepared, main: bool) -> Path | None:
    """The checkpoint to resume from (or None); refuses a state folder left by a different run."""
    state, spec = prep.spec.state_dir(), prep.spec
    marker = state / FINGERPRINT
    if state.exists() and not spec.progress.resume:
        if main:
            shutil.rmtree(state, ignore_errors=True)
        return None
    if marker.is_file():
        recorded = json.loads(marker.read_text()).get("fingerprint")
        if recorded != prep.fingerprint:
            raise ValueError(f"{str(state)!r} holds the state of a different training run (other data, model or "
                             "recipe); rerun with the same arguments, or pass --restart to discard it")
    checkpoints = complete_checkpoints(state) if state.is_dir() else []
    if main:
        state.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"fingerprint": prep.fingerprint, "spec": spec.flat()}, default=str) + "\n")
        latest = checkpoints[-1] if checkpoints else None
        for folder in state.glob("checkpoint-*"):  # partial checkpoints of a killed save
            if folder not in checkpoints and folder != latest:
                shutil.rmtree(folder, ignore_errors=True)
    return checkpoints[-1] if checkpoints else None


def resumed_step(checkpoint: Path | None) -> int:
    """The step a checkpoint was saved at (0: a fresh run)."""
    if checkpoint is None:
        return 0
    return int(json.loads((checkpoint / "trainer_state.json").read_text()).get("global_step", 0))


def previous_seconds(checkpoint: Path | None) -> float:
    """The training wall time logged up to a checkpoint (0: a fresh run)."""
    if checkpoint is None:
        return 0.0
    rows = json.loads((checkpoint / "trainer_state.json").read_text()).get("log_history", [])
    return float(next((r["train_seconds"] for r in reversed(rows) if "train_seconds" in r), 0.0))


def callbacks(prep: Prepared, on_progress: Callable[[str], None] | None, resumed: int):
    from .progress import callback

    return callback(prep.spec.optimisation.steps, resumed, prep.tokens_per_step, prep.accumulation, prep.micro_tokens,
                    prep.spec.state_dir(), KEEP_CHECKPOINTS, on_progress)


# --- the Trainer -----------------------------------------------------------------------------------------------------
def trainer_class():
    from torch.utils.data import SequentialSampler
    from transformers import Trainer

    class RopeExtendTrainer(Trainer):
        """Trainer with sequential sampling (samples are already drawn at random by index: the order is the
        same for any process count and after a resume) and cumulative tokens/wall time in every log entry."""

        tokens_per_step = 0
        clock_offset = 0.0
        clock_start = 0.0
        loss_chunk_tokens = 0  # > 0: the loss in chunks of this many positions (`loss.py`); 0: transformers' own
        forward_autocast = None  # the autocast dtype of the model's forward when rope-extend applies it itself

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if self.loss_chunk_tokens and sequence_parallel.active(self):  # the batch holds this process's shard
                return sequence_parallel.compute_loss(self, model, inputs, self.loss_chunk_tokens, return_outputs,
                                                      self.forward_autocast)
            if not self.loss_chunk_tokens or "labels" not in inputs:
                return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                            num_items_in_batch=num_items_in_batch)
            from .loss import chunked_causal_lm_loss, head_input

            inputs = dict(inputs)
            labels = inputs.pop("labels")
            head = self.accelerator.unwrap_model(model).get_output_embeddings()
            # Through the wrapper's forward (DDP's gradient hooks), the head on one token. The chunks below call
            # the head again, outside that forward: ZeRO-3's module hooks gather its weight for each call (and each
            # recomputation); FSDP2 keeps the root's weights unsharded from the forward to its backward.
            with head_input(head) as seen:
                outputs = model(**inputs)
            scaled = self.model_accepts_loss_kwargs and num_items_in_batch is not None  # as Trainer.compute_loss
            loss = chunked_causal_lm_loss(seen[0], labels, head, self.loss_chunk_tokens,
                                          num_items_in_batch if scaled else None)
            # Zero, but the backward now passes through the model's output as well: FSDP2 runs its root's
            # pre-backward hook from there (without it the root's weights are freed while the backward still reads
            # them: a segfault in the final norm's backward on 2 CPU processes).
            loss = loss + 0.0 * outputs.logits.float().sum()
            if scaled and self.args.average_tokens_across_devices:
                loss = loss * (self.accelerator.num_processes if self.args.n_gpu <= 1 else self.args.n_gpu)
            return (loss, outputs) if return_outputs else loss

        def training_step(self, model, inputs, *args, **kwargs):
            if sequence_parallel.active(self):  # `model` is DeepSpeed's engine here
                sequence_parallel.keep_grad_norm(model)
            return super().training_step(model, inputs, *args, **kwargs)

        def _get_train_sampler(self, *args, **kwargs):
            return SequentialSampler(self.train_dataset)

        def get_resumed_dataloader(self, dataloader, num_batches):
            if sequence_parallel.active(self):  # the Ulysses adapter hides the DataLoader accelerate would skip in
                return sequence_parallel.resumed_dataloader(dataloader, num_batches)
            return super().get_resumed_dataloader(dataloader, num_batches)

        def _save(self, output_dir=None, *args, **kwargs):
            # A checkpoint keeps no config.json: resuming, transformers 5's Trainer re-reads it with the generic
            # PreTrainedConfig class, which fails on a rope scaling (no max_position_embeddings). The model is
            # rebuilt from SOURCE and the plan on resume; only the weights come from the checkpoint.
            super()._save(output_dir, *args, **kwargs)
            if not self.args.should_save:  # every rank calls _save; only the main one writes (and removes)
                return
            folder = Path(output_dir if output_dir is not None else self.args.output_dir)
            with contextlib.suppress(FileNotFoundError):
                (folder / "config.json").unlink()

        def log(self, logs, *args, **kwargs):
            logs = dict(logs)
            logs["tokens"] = int(self.state.global_step * self.tokens_per_step)
            logs["train_seconds"] = round(self.clock_offset + time.perf_counter() - self.clock_start, 3)
            return super().log(logs, *args, **kwargs)

    return RopeExtendTrainer
