"""`train_model`: one `rope-extend train` run (what the CLI and `accelerate launch` / `torchrun` call).

Order: validate everything (numbers, method, paths, texts, held-out overlap, window) -> tokenize -> load the model
and patch it with rope-extend's own plan (`patch_model`: the frequencies are rebuilt in the modules, not just the
config) -> optional LoRA -> transformers `Trainer` -> merge -> the checkpoint writer `patch` uses
(`checkpoint.write_model_checkpoint`: portable config, stock reload verified against the trained model, card).

Memory linear in the window: the loss in chunks (`loss.py`), attention through a memory-efficient SDPA kernel
(`attention.py`, checked before loading), gradient checkpointing when the window needs it (`gradient_checkpointing`).
What it prints (plan, first-micro-batch estimate, in-step lines) and how signals stop it: `progress.py`.
Under `accelerate launch` with FSDP or DeepSpeed ZeRO-3 (also on CPU processes): `sharding.py`; the trained weights
are gathered from every process and the main one writes OUT from a whole copy.

Resumable: Trainer checkpoints go to `OUT.train-state/` beside OUT every `save_steps`; SIGTERM or Ctrl-C saves one at
the end of the current step and stops (a second signal stops at once, keeping the newest checkpoint). Rerunning the same command resumes from the newest complete checkpoint (its
weights, optimizer, scheduler and RNG state; the data is drawn by sample index, so it continues exactly), and ends
at the same weights as an uninterrupted run. The state folder is removed after OUT is written.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import compat, files
from ..checkpoint import check_output_path, write_model_checkpoint
from ..errors import SpecError
from ..hub import resolve_source
from ..plan import check_rope_model, plan_patch
from . import card, data, lora, sharding
from .progress import TrainingInterrupted, complete_checkpoints
from .recipe import (
    TrainSpec,
    activation_bytes,
    batch_split,
    check_numbers,
    check_static,
    default_window,
    needs_checkpointing,
)

FINGERPRINT = "fingerprint.json"
KEEP_CHECKPOINTS = 2


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


@dataclass
class Prepared:
    """Everything validated before any model is loaded."""

    spec: TrainSpec
    source: Path
    out: Path
    plan: object
    tokenizer: object
    corpus: data.Corpus
    window: int
    world: int
    accumulation: int
    global_windows: int
    fingerprint: str


def _world() -> tuple[int, int]:
    return int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))


def prepare(spec: TrainSpec) -> Prepared:
    """Validate the whole run and tokenize its data; refuses bad input in one line before any model is loaded."""
    check_numbers(spec)
    check_dtype_on_device(spec.dtype, _device())
    sharding.check_lora(spec.lora and spec.train_embeddings_and_norms)
    rope = spec.rope_spec()
    check_static(rope)
    source = resolve_source(spec.source)
    out = check_output_path(source, Path(spec.output), spec.overwrite)
    state = spec.state_dir()
    if source.resolve() in state.resolve().parents:
        raise ValueError(f"the training state folder {str(state)!r} would be inside SOURCE; choose another -o")
    config = files.load_config(source)
    text = compat.text_config(config)
    check_rope_model(text)
    plan = plan_patch(config, rope)
    if plan.is_identity():
        raise SpecError(f"{rope.method} x{rope.factor:g} changes nothing on this model; choose a factor > 1",
                        field="factor", value=rope.factor)
    groups: list[tuple[str, list[data.Document], bool]] = []
    train_docs: list[data.Document] = []
    if spec.texts:
        docs = data.read_text_files(spec.texts)
        train_docs += docs
        groups += [(d.name, [d], True) for d in docs]
    if spec.dataset is not None:
        name, rows = data.read_dataset(spec.dataset, spec.dataset_split, spec.dataset_column)
        train_docs += rows
        groups.append((name, rows, False))
    for path in spec.eval_texts:
        p = Path(path).expanduser()
        if p.is_file():
            data.check_no_overlap(train_docs, p.read_text(encoding="utf-8", errors="replace"), str(path))
    if spec.eval_suite is not None:  # an unknown or invalid suite is refused here, and so is a suite text trained on
        from ..eval.suite import load_suite
        from ..eval.texts import load_text

        suite = load_suite(spec.eval_suite)
        for name in (suite.perplexity.texts if suite.perplexity is not None else []):
            data.check_no_overlap(train_docs, load_text(name), f"{name} (suite {suite.name})")
    target, original = plan.spec.target_length, plan.spec.original_max_position_embeddings
    window = spec.window
    if window is None:
        window = default_window(target, original, _weights_bytes(source), text.hidden_size, text.num_hidden_layers,
                                text.vocab_size, _available_memory())
    if window > target:
        raise ValueError(f"--window {window} is longer than the target length {target}; use --window <= {target}")
    from transformers import AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = AutoTokenizer.from_pretrained(source)
    corpus = data.build_corpus(tokenizer, groups, window)
    world, _ = _world()
    global_windows = spec.global_windows(window)
    accumulation = batch_split(global_windows, spec.micro_batch, world)
    digest = spec.fingerprint({"window": window, "global_windows": global_windows,
                               "data": [s.sha256 for s in corpus.sources], "source": _config_digest(source)})
    return Prepared(spec, source, out, plan, tokenizer, corpus, window, world, accumulation, global_windows, digest)


def _config_digest(source: Path) -> str:
    import hashlib

    return hashlib.sha256((source / "config.json").read_bytes()).hexdigest()[:16]


def _weights_bytes(source: Path) -> int:
    return sum(p.stat().st_size for p in source.glob("*.safetensors"))


def _available_memory() -> int:
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            free, _ = torch.cuda.mem_get_info()
            return int(free)
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 << 30


# --- resume state ----------------------------------------------------------------------------------------------------
def _open_state(prep: Prepared, main: bool) -> Path | None:
    """The checkpoint to resume from (or None); refuses a state folder left by a different run."""
    state, spec = prep.spec.state_dir(), prep.spec
    marker = state / FINGERPRINT
    if state.exists() and not spec.resume:
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
        marker.write_text(json.dumps({"fingerprint": prep.fingerprint, "spec": asdict(spec)}, default=str) + "\n")
        latest = checkpoints[-1] if checkpoints else None
        for folder in state.glob("checkpoint-*"):  # partial checkpoints of a killed save
            if folder not in checkpoints and folder != latest:
                shutil.rmtree(folder, ignore_errors=True)
    return checkpoints[-1] if checkpoints else None


def check_dtype_on_device(dtype: str, device: str) -> None:
    """float16 trains only where accelerate runs fp16 mixed precision (autocast with its gradient scaler): CUDA and
    other accelerators. On the CPU accelerate turns it off without a word and the run would train in float32."""
    if dtype == "float16" and device == "cpu":
        raise SpecError("--dtype float16 needs a GPU: accelerate runs fp16 mixed precision (with its gradient scaler) "
                        "only on accelerators, and on the CPU the run would silently train in float32; use --dtype "
                        "bfloat16 (CPU autocast) or float32", field="dtype", value=dtype)


# --- the run ---------------------------------------------------------------------------------------------------------
def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_patched_model(prep: Prepared):
    """The model loaded from SOURCE with rope-extend's plan applied (frequencies rebuilt, config rewritten)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from ..patch import patch_model

    hf_logging.disable_progress_bar()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(prep.source, **compat.dtype_kwargs(torch.float32))
        patch_model(model, prep.plan.spec, verify=True)
    model.config.use_cache = False
    return model


def gradient_checkpointing(prep: Prepared) -> tuple[bool, str]:
    """(on?, the reason the progress line gives): `--gradient-checkpointing on|off`, or `auto`: on when one
    micro-batch's activations (`recipe.activation_bytes`) would take more than half of the memory the weights,
    gradients and AdamW state leave free."""
    mode = prep.spec.gradient_checkpointing
    if _fsdp_checkpoints():  # transformers refuses both at once: FSDP's own wraps every layer
        return False, "gradient checkpointing by FSDP (fsdp_activation_checkpointing in the accelerate config)"
    if mode in ("on", "off"):
        return mode == "on", f"gradient checkpointing {mode}"
    text = compat.text_config(files.load_config(prep.source))
    hidden, heads, layers = text.hidden_size, text.num_attention_heads, text.num_hidden_layers
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    q_dim, kv_dim = heads * head_dim, (getattr(text, "num_key_value_heads", None) or heads) * head_dim
    float32 = prep.spec.dtype == "float32" or (prep.spec.dtype == "auto" and _device() == "cpu")
    element = 4 if float32 else 2  # mixed precision keeps most activations in 16 bits
    activations = activation_bytes(prep.spec.micro_batch * prep.window, hidden, text.intermediate_size, kv_dim,
                                   layers, element)
    params = (layers * (2 * hidden * (q_dim + kv_dim) + 3 * hidden * text.intermediate_size)
              + text.vocab_size * hidden * (1 if getattr(text, "tie_word_embeddings", False) else 2))
    available, fixed = _available_memory(), 16 * params  # float32 weights, gradients, AdamW's two moments
    on = needs_checkpointing(activations, fixed, available)
    return on, (f"gradient checkpointing {'on' if on else 'off'} (auto: ~{activations / 2**30:.1f} GiB of "
                f"activations per micro-batch without it, {available / 2**30:.1f} GiB available)")


def _fsdp_checkpoints() -> bool:
    """An accelerate FSDP launch whose config checkpoints activations itself (on the CPU too: `sharding.fsdp_on_cpu`)."""
    return (sharding.asked() == "FSDP"
            and os.environ.get("FSDP_ACTIVATION_CHECKPOINTING", "false").lower() == "true")


def _trains_in_bf16(spec: TrainSpec, device: str) -> bool:
    """bf16 mixed precision: asked for, or `--dtype auto` on a GPU that has bf16."""
    import torch

    return spec.dtype == "bfloat16" or (spec.dtype == "auto" and device == "cuda" and torch.cuda.is_bf16_supported())


def training_arguments(prep: Prepared, state: Path, checkpointing: bool | None = None):
    from transformers import TrainingArguments

    spec, device = prep.spec, _device()
    bf16 = _trains_in_bf16(spec, device)
    kwargs = dict(
        output_dir=str(state),
        max_steps=spec.steps,
        per_device_train_batch_size=spec.micro_batch,
        gradient_accumulation_steps=prep.accumulation,
        learning_rate=spec.learning_rate,
        warmup_steps=spec.warmup(),
        lr_scheduler_type=spec.scheduler,
        adam_beta1=spec.adam_beta1,
        adam_beta2=spec.adam_beta2,
        weight_decay=spec.weight_decay,
        max_grad_norm=spec.max_grad_norm,
        optim="adamw_torch",
        seed=spec.seed,
        data_seed=spec.seed,
        logging_steps=spec.logging_steps,
        logging_first_step=True,
        save_strategy="steps",
        save_steps=spec.save_steps or max(1, spec.steps // 10),
        save_total_limit=None,  # pruned by step number in the callback (Trainer's own rotation sorts by mtime, which
        # races with the other ranks still writing their rng_state_N.pth in DDP)
        report_to=[],
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        bf16=bf16,
        fp16=spec.dtype == "float16",
        use_cpu=device == "cpu",
        full_determinism=device == "cpu",
        log_level="error",
    )
    if checkpointing is None:
        checkpointing = gradient_checkpointing(prep)[0]
    if checkpointing:
        kwargs["gradient_checkpointing"] = True
        kwargs["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    if device == "cpu" and prep.world > 1:
        kwargs["ddp_backend"] = "gloo"
    return TrainingArguments(**kwargs)


def _memory_plan(prep: Prepared, args):
    """(the attention path, positions per loss chunk) for this run's device and compute dtype: the attention
    kernel is checked to be a memory-efficient one (`attention.choose`, refusing the run otherwise) and the loss
    never holds more than one chunk's logits (`loss.py`)."""
    import torch

    from . import attention
    from .loss import chunk_tokens_for

    config = files.load_config(prep.source)
    dtype = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else torch.float32
    choice = attention.choose(config, _device(), dtype, prep.window)
    return choice, prep.spec.loss_chunk or chunk_tokens_for(compat.text_config(config).vocab_size)


def _trainer_class():
    from torch.utils.data import SequentialSampler
    from transformers import Trainer

    class RopeExtendTrainer(Trainer):
        """Trainer with sequential sampling (samples are already drawn at random by index: the order is the
        same for any process count and after a resume) and cumulative tokens/wall time in every log entry."""

        tokens_per_step = 0
        clock_offset = 0.0
        clock_start = 0.0
        loss_chunk_tokens = 0  # > 0: the loss in chunks of this many positions (`loss.py`); 0: transformers' own

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
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

        def _get_train_sampler(self, *args, **kwargs):
            return SequentialSampler(self.train_dataset)

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


def _callbacks(prep: Prepared, on_progress: Callable[[str], None] | None, resumed: int):
    from .progress import callback

    return callback(prep.spec.steps, resumed, prep.global_windows * prep.window, prep.accumulation,
                    prep.spec.micro_batch * prep.window, prep.spec.state_dir(), KEEP_CHECKPOINTS, on_progress)


def train_model(spec: TrainSpec, on_progress: Callable[[str], None] | None = None) -> TrainResult:
    """Run one training (see the module docstring). Returns a `TrainResult`; raises `TrainingInterrupted` after
    saving a checkpoint when SIGTERM/SIGINT arrives."""
    started = time.perf_counter()
    prep = prepare(spec)
    world, rank = _world()
    main = rank == 0
    say = on_progress if (on_progress is not None and main) else (lambda line: None)
    say(f"data: {len(prep.corpus.streams)} streams, {prep.corpus.tokens:,} tokens; window {prep.window}"
        f"{' (PoSE, positions to ' + str(prep.plan.spec.target_length) + ')' if prep.window < prep.plan.spec.target_length else ''}; "
        f"global batch {prep.global_windows} windows ({world} process(es) x {spec.micro_batch} x {prep.accumulation})")
    eval_before = _eval_before(prep) if (spec.eval_suite and main) else None
    resume_from = _open_state(prep, main)
    state_dir = spec.state_dir()
    checkpointing, checkpointing_line = gradient_checkpointing(prep)
    args = training_arguments(prep, state_dir, checkpointing)
    choice, chunk = _memory_plan(prep, args)
    say(f"attention: {choice.describe()}; {checkpointing_line}; loss in chunks of {chunk:,} positions")
    model, base = _model_to_train(prep)
    dataset = data.WindowDataset(prep.corpus, prep.window, prep.plan.spec.target_length,
                                 spec.steps * prep.global_windows, spec.seed)
    resumed = 0
    if resume_from is not None:
        resumed = int(json.loads((resume_from / "trainer_state.json").read_text()).get("global_step", 0))
        say(f"resuming from {resume_from.name} (step {resumed}/{spec.steps})")
    from .progress import newest_checkpoint, plan_line, stop_on_signals

    say(plan_line(spec.steps, resumed, prep.global_windows * prep.window, prep.accumulation,
                  spec.micro_batch * prep.window))
    control = _callbacks(prep, say if on_progress else None, resumed)
    from transformers import PrinterCallback

    from . import attention

    with sharding.fsdp_on_cpu():
        trainer = _trainer_class()(model=model, args=args, train_dataset=dataset, data_collator=data.collate,
                                   callbacks=[control])
    trainer.remove_callback(PrinterCallback)
    processes = sharding.describe(trainer)
    if world > 1 or sharding.asked():
        say(f"processes: {processes}")
    note = sharding.note(trainer)
    if note:
        say(note)
    trainer.tokens_per_step = prep.global_windows * prep.window
    trainer.loss_chunk_tokens = chunk
    trainer.clock_offset = _previous_seconds(resume_from)
    trainer.clock_start = time.perf_counter()
    with stop_on_signals(control), attention.installed(choice), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from is not None else None)
    if control.signum is not None:
        raise TrainingInterrupted(control.signum, state_dir, trainer.state.global_step, newest_checkpoint(state_dir))
    history = [dict(row) for row in trainer.state.log_history if "loss" in row]
    losses = [row["loss"] for row in history]
    train_seconds = history[-1]["train_seconds"] if history else time.perf_counter() - started
    tokens = trainer.state.global_step * prep.global_windows * prep.window
    summary = _summary(prep, trainer.state.global_step, tokens, train_seconds, losses)
    summary["precision"] = _precision(args)
    summary["processes"] = processes
    if eval_before is not None:
        summary["eval"] = _eval_summary(prep, eval_before, None)
    if sharding.is_sharded(trainer):  # every process gathers; the main one writes from a whole copy
        with _keeping_trained_weights(prep, trainer.state.global_step,
                                      (complete_checkpoints(state_dir) or [None])[-1]):
            model = sharding.unsharded_model(trainer, lambda: _whole_copy(prep))
        base = model if not spec.lora else None
    if not main:
        return TrainResult(None, trainer.state.global_step, tokens, train_seconds, *(losses[:1] or [None]),
                           *(losses[-1:] or [None]), resumed, False, summary)
    with compat.without_zero3_init():  # the writer's stock reload is this process's alone
        result = _write_trained(prep, trainer, model, base, summary, eval_before, resumed, say)
    return TrainResult(result.out, trainer.state.global_step, tokens, train_seconds, losses[0] if losses else None,
                       losses[-1] if losses else None, resumed, result.verified, summary)


def _model_to_train(prep: Prepared):
    """(the model to train, the base model inside it): SOURCE patched with the plan, LoRA-wrapped when asked (peft
    changes the base model in place)."""
    spec = prep.spec
    base = load_patched_model(prep)
    if not spec.lora:
        return base, base
    return lora.wrap(base, spec.lora_r, spec.lora_alpha, spec.lora_dropout, spec.train_embeddings_and_norms,
                     spec.seed), base


def _whole_copy(prep: Prepared):
    """The model as training started, built whole in this process, for a sharded run's gathered weights."""
    with compat.without_zero3_init():
        return _model_to_train(prep)[0]


# --- after the optimizer: write OUT, throwing nothing away -----------------------------------------------------------
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
def _keeping_trained_weights(prep: Prepared, step: int, checkpoint: Path | None):
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


def _write_trained(prep: Prepared, trainer, model, base, summary: dict, eval_before, resumed: int, say):
    """Write OUT from the trained model (merging LoRA), verify it, evaluate it (--eval-suite). Before this runs,
    Trainer saved the last step's checkpoint in the state folder; it is removed only once OUT is written, so a
    failure or a signal here loses nothing (`_keeping_trained_weights`) and a rerun resumes at the last step, trains
    nothing and comes back here."""
    spec, state_dir, step = prep.spec, prep.spec.state_dir(), trainer.state.global_step
    checkpoint = (complete_checkpoints(state_dir) or [None])[-1]  # Trainer saves one at the last step
    kept = unverified_dir(prep.out)
    with _keeping_trained_weights(prep, step, checkpoint):
        adapter = state_dir / "adapter"
        if spec.save_adapter:  # before merging: merge_and_unload takes the adapters out of the model
            model.save_pretrained(adapter)
        final = lora.merge(model) if spec.lora else base
        final.config.use_cache = True
        if resumed >= step:
            say(f"training had finished ({checkpoint.name if checkpoint else 'step ' + str(step)}); writing "
                f"{'and verifying ' if spec.verify else ''}the checkpoint from it")
        else:
            say(f"training done; writing {'and verifying ' if spec.verify else ''}the checkpoint")

        def extra(folder: Path) -> None:
            card.write_files(folder, summary, [dict(row) for row in trainer.state.log_history])
            if spec.save_adapter:
                shutil.copytree(adapter, folder / "adapter")

        result = write_model_checkpoint(final, prep.source, prep.out, prep.plan, overwrite=spec.overwrite,
                                        verify=spec.verify, extra=extra, keep_unverified=kept,
                                        training=card.section(summary, None if eval_before is None
                                                              else _eval_section(prep, eval_before, None)))
    shutil.rmtree(state_dir, ignore_errors=True)  # OUT holds the trained model now
    if (kept / "rope_extend.yaml").is_file():  # a previous run's unverified copy of the same training
        shutil.rmtree(kept, ignore_errors=True)
        say(f"removed {kept} (an earlier run's unverified copy; {prep.out} is {'verified' if result.verified else 'written'})")
    if eval_before is not None:
        say("evaluating the trained checkpoint")
        try:
            _write_after(prep, result.out, eval_before, _eval_after(prep, result.out), summary)
        except Exception as exc:
            from ..errors import TrainedNotWrittenError

            raise TrainedNotWrittenError(
                f"{result.out} is written{' and verified' if result.verified else ''}, but its evaluation after "
                f"training failed: {' '.join(str(exc).split())}; evaluate it with `rope-extend eval {result.out} "
                f"--suite {spec.eval_suite}`") from None
    return result


def _previous_seconds(resume_from: Path | None) -> float:
    if resume_from is None:
        return 0.0
    rows = json.loads((resume_from / "trainer_state.json").read_text()).get("log_history", [])
    return float(next((r["train_seconds"] for r in reversed(rows) if "train_seconds" in r), 0.0))


def _summary(prep: Prepared, steps: int, tokens: int, seconds: float, losses: list[float]) -> dict:
    spec, plan = prep.spec, prep.plan
    import torch

    recipe = {
        "method": plan.spec.method, "factor": plan.spec.factor, "original_length": plan.spec.original_max_position_embeddings,
        "target_length": plan.spec.target_length, "window": prep.window, "pose": prep.window < plan.spec.target_length,
        "global_windows": prep.global_windows, "world_size": prep.world, "micro_batch": spec.micro_batch,
        "accumulation": prep.accumulation, "learning_rate": spec.learning_rate, "adam_beta1": spec.adam_beta1,
        "adam_beta2": spec.adam_beta2, "weight_decay": spec.weight_decay, "warmup_steps": spec.warmup(),
        "scheduler": spec.scheduler, "seed": spec.seed, "lora": spec.lora, "lora_r": spec.lora_r,
        "lora_alpha": spec.lora_alpha, "lora_dropout": spec.lora_dropout,
        "train_embeddings_and_norms": spec.train_embeddings_and_norms, "steps": spec.steps,
    }
    return {
        "title": f"{plan.spec.method} x{plan.spec.factor:g}, window {prep.window}",
        "recipe": recipe,
        "data": [s.to_dict() for s in prep.corpus.sources],
        "steps": steps,
        "tokens_trained": tokens,
        "wall_seconds": seconds,
        "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
        "device": f"{_device()} x{prep.world}, torch {torch.__version__}",
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "loss_means": loss_means(losses),
    }


def _precision(args) -> str:
    """The compute precision the Trainer ran in, for training.json and the card."""
    if args.bf16:
        return "bfloat16 mixed precision (float32 weights and optimizer state)"
    if args.fp16:
        return "float16 mixed precision (float32 weights and optimizer state, loss scaling)"
    return "float32"


def loss_means(losses: list[float]) -> dict | None:
    """Mean loss of the first and the last tenth of the logged steps (at least one each): one step's loss depends on
    its batch, so first -> last alone can read as divergence on a short, noisy run."""
    if not losses:
        return None
    k = max(1, len(losses) // 10)
    return {"steps": k, "first": sum(losses[:k]) / k, "last": sum(losses[-k:]) / k}


# --- before/after eval -----------------------------------------------------------------------------------------------
def _eval_dir(prep: Prepared) -> Path:
    return prep.out.parent / f"{prep.out.name}-eval"


def training_free_label(prep: Prepared) -> str:
    """The eval's name for SOURCE with the plan applied training-free ('yarn-x2', as `rope-extend eval` names it)."""
    from ..eval.variants import variant_name

    return variant_name(prep.plan.spec, set())


def trained_label(prep: Prepared) -> str:
    """The eval's name for the trained checkpoint: 'trained yarn-x2'."""
    return f"trained {training_free_label(prep)}"


def eval_settings(spec: TrainSpec) -> dict:
    """Where `--eval-suite` runs, the same before and after: the training's device; float32 on the CPU (as the CPU
    records in eval/reports), bfloat16 on a GPU that trains in it (as the GPU records), float32 when asked."""
    device = _device()
    if device == "cpu":
        return {"device": "cpu", "dtype": "float32"}
    return {"device": device, "dtype": "bfloat16" if _trains_in_bf16(spec, device) else "float32"}


def _eval_before(prep: Prepared) -> list[dict]:
    """SOURCE unpatched and with the plan training-free, on the suite (resumable: finished cases are kept)."""
    from ..eval.runner import run_eval

    return run_eval(str(prep.source), [prep.plan.spec], prep.spec.eval_suite, _eval_dir(prep) / "before",
                    progress=False, **eval_settings(prep.spec))


def _eval_after(prep: Prepared, out: Path) -> list[dict]:
    """OUT as stock transformers loads it (its own config carries the scaling: no spec is applied on top), under
    its own name rather than the eval runner's 'unpatched'."""
    from ..eval.runner import run_eval

    return run_eval(str(out), {trained_label(prep): None}, prep.spec.eval_suite, _eval_dir(prep) / "after",
                    include_baseline=False, progress=False, **eval_settings(prep.spec))


def _eval_summary(prep: Prepared, before: list[dict], after: list[dict] | None) -> dict:
    """training.json's `eval`: every case's headline number, copied from the eval's own records."""
    from ..eval.suite import load_suite
    from ..eval.variants import BASELINE

    rows = []
    for r in before + (after or []):
        m = r["metrics"]
        row = {"variant": r["variant"], "case_id": r["case_id"], "kind": r["kind"], "length": r["length"]}
        if "ppl" in m:
            row.update(ppl=m["ppl"], ppl_ci=m.get("ppl_ci"))
        elif "score" in m:
            row["score"] = m["score"]
        rows.append(row)
    folder = _eval_dir(prep)
    return {"suite": load_suite(prep.spec.eval_suite).name, **eval_settings(prep.spec), "before": str(folder / "before"),
            "after": str(folder / "after") if after is not None else None,
            "variants": {BASELINE: "SOURCE as loaded", training_free_label(prep): "SOURCE patched, training-free",
                         trained_label(prep): "this checkpoint (trained), as stock transformers loads it"},
            "records": rows}


def _eval_section(prep: Prepared, before: list[dict], after: list[dict] | None) -> str:
    """The card's eval block: the eval's own summary tables, one column per variant."""
    from ..eval.runner import summary_markdown
    from ..eval.suite import load_suite

    plan, where = prep.plan.spec, eval_settings(prep.spec)
    head = (f"Suite `{load_suite(prep.spec.eval_suite).name}` ({where['device']}, {where['dtype']}): `unpatched` is "
            "SOURCE as loaded, "
            f"`{training_free_label(prep)}` SOURCE with {plan.method} x{plan.factor:g} training-free, ")
    if after is None:
        head += "before training (the trained checkpoint's column is added when the run finishes)."
    else:
        # The reports' folder is beside OUT, not published with it: the card points to what is (training.json).
        head += (f"`{trained_label(prep)}` this checkpoint as stock transformers loads it (no spec applied on top). "
                 f"`{card.SUMMARY_FILE}` (`eval`) holds every measurement.")
    return f"{card.EVAL_START}\n{head}\n\n{summary_markdown(before + (after or [])).rstrip()}\n{card.EVAL_END}"


def _write_after(prep: Prepared, out: Path, before: list[dict], after: list[dict], summary: dict) -> None:
    """Replace the card's before-only eval block with before + after, and add both to training.json."""
    readme = out / "README.md"
    readme.write_text(card.replace_eval(readme.read_text(), _eval_section(prep, before, after)))
    summary["eval"] = _eval_summary(prep, before, after)
    (out / card.SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")


def progress_printer(stream=None) -> Callable[[str], None]:
    """One line per log step (stderr, flushed); on a terminal the line is rewritten in place."""
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
