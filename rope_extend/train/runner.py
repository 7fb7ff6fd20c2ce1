"""`train_model`: one `rope-extend train` run (what the CLI and `accelerate launch` / `torchrun` call).

Order: validate everything (numbers, method, paths, texts, held-out overlap, window) -> tokenize -> load the model
and patch it with rope-extend's own plan (`patch_model`: the frequencies are rebuilt in the modules, not just the
config) -> optional LoRA -> transformers `Trainer` -> merge -> the checkpoint writer `patch` uses
(`checkpoint.write_model_checkpoint`: portable config, stock reload verified against the trained model, card).

Resumable: Trainer checkpoints go to `OUT.train-state/` beside OUT every `save_steps`; SIGTERM or Ctrl-C saves one at
the end of the current step and stops. Rerunning the same command resumes from the newest complete checkpoint (its
weights, optimizer, scheduler and RNG state; the data is drawn by sample index, so it continues exactly), and ends
at the same weights as an uninterrupted run. The state folder is removed after OUT is written.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
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
from . import card, data, lora
from .recipe import TrainSpec, batch_split, check_numbers, check_static, default_window

FINGERPRINT = "fingerprint.json"
KEEP_CHECKPOINTS = 2


class TrainingInterrupted(KeyboardInterrupt):
    """SIGTERM / Ctrl-C during training: a checkpoint was saved in `state_dir`; rerun to resume."""

    def __init__(self, signum: int, state_dir: Path, step: int):
        super().__init__(f"interrupted at step {step}")
        self.signum, self.state_dir, self.step = signum, state_dir, step


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
def _complete_checkpoints(state: Path) -> list[Path]:
    """checkpoint-N folders a SIGKILL did not cut short (Trainer writes trainer_state.json last), oldest first."""
    found = []
    for folder in state.glob("checkpoint-*"):
        with contextlib.suppress(ValueError):
            step = int(folder.name.split("-", 1)[1])
            if (folder / "trainer_state.json").is_file():
                found.append((step, folder))
    return [f for _, f in sorted(found)]


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
    checkpoints = _complete_checkpoints(state) if state.is_dir() else []
    if main:
        state.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"fingerprint": prep.fingerprint, "spec": asdict(spec)}, default=str) + "\n")
        latest = checkpoints[-1] if checkpoints else None
        for folder in state.glob("checkpoint-*"):  # partial checkpoints of a killed save
            if folder not in checkpoints and folder != latest:
                shutil.rmtree(folder, ignore_errors=True)
    return checkpoints[-1] if checkpoints else None


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


def training_arguments(prep: Prepared, state: Path):
    import torch
    from transformers import TrainingArguments

    spec, device = prep.spec, _device()
    bf16 = spec.dtype == "bfloat16" or (spec.dtype == "auto" and device == "cuda" and torch.cuda.is_bf16_supported())
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
    if spec.gradient_checkpointing:
        kwargs["gradient_checkpointing"] = True
    if device == "cpu" and prep.world > 1:
        kwargs["ddp_backend"] = "gloo"
    return TrainingArguments(**kwargs)


def _trainer_class():
    from torch.utils.data import SequentialSampler
    from transformers import Trainer

    class RopeExtendTrainer(Trainer):
        """Trainer with sequential sampling (samples are already drawn at random by index: the order is the
        same for any process count and after a resume) and cumulative tokens/wall time in every log entry."""

        tokens_per_step = 0
        clock_offset = 0.0
        clock_start = 0.0

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
    from transformers import TrainerCallback

    spec = prep.spec
    tokens_per_step = prep.global_windows * prep.window

    class Control(TrainerCallback):
        """Stops with a checkpoint after the current step on SIGTERM/SIGINT; prints progress lines."""

        signum: int | None = None

        def __init__(self):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if self.signum is not None:
                control.should_save = True
                control.should_training_stop = True
            return control

        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:  # keep the two newest checkpoints (by step, never by mtime)
                for folder in _complete_checkpoints(Path(args.output_dir))[:-KEEP_CHECKPOINTS]:
                    shutil.rmtree(folder, ignore_errors=True)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or on_progress is None or not logs or "loss" not in logs:
                return
            done = state.global_step - resumed
            elapsed = time.perf_counter() - self.started
            rate = done * tokens_per_step / elapsed if elapsed > 0 and done > 0 else 0.0
            eta = (spec.steps - state.global_step) * elapsed / done if done > 0 else float("nan")
            on_progress(f"step {state.global_step}/{spec.steps} loss {logs['loss']:.4f} lr {logs.get('learning_rate', 0):.2e} "
                        f"{rate:,.0f} tokens/s ETA {_duration(eta)}")

    return Control()


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


@contextlib.contextmanager
def _stop_on_signals(control):
    """SIGTERM/SIGINT set a flag the callback turns into 'save and stop' (the CLI's own handlers come back after)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum, frame):
        if control.signum is not None:  # a second signal: stop now
            raise KeyboardInterrupt
        control.signum = signum

    for s in previous:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


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
    model = load_patched_model(prep)
    base = model
    if spec.lora:
        model = lora.wrap(model, spec.lora_r, spec.lora_alpha, spec.lora_dropout, spec.train_embeddings_and_norms)
    dataset = data.WindowDataset(prep.corpus, prep.window, prep.plan.spec.target_length,
                                 spec.steps * prep.global_windows, spec.seed)
    args = training_arguments(prep, state_dir)
    resumed = 0
    if resume_from is not None:
        resumed = int(json.loads((resume_from / "trainer_state.json").read_text()).get("global_step", 0))
        say(f"resuming from {resume_from.name} (step {resumed}/{spec.steps})")
    control = _callbacks(prep, say if on_progress else None, resumed)
    from transformers import PrinterCallback

    trainer = _trainer_class()(model=model, args=args, train_dataset=dataset, data_collator=data.collate,
                               callbacks=[control])
    trainer.remove_callback(PrinterCallback)
    trainer.tokens_per_step = prep.global_windows * prep.window
    trainer.clock_offset = _previous_seconds(resume_from)
    trainer.clock_start = time.perf_counter()
    with _stop_on_signals(control), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from is not None else None)
    if control.signum is not None:
        raise TrainingInterrupted(control.signum, state_dir, trainer.state.global_step)
    history = [dict(row) for row in trainer.state.log_history if "loss" in row]
    losses = [row["loss"] for row in history]
    train_seconds = history[-1]["train_seconds"] if history else time.perf_counter() - started
    tokens = trainer.state.global_step * prep.global_windows * prep.window
    summary = _summary(prep, trainer.state.global_step, tokens, train_seconds, losses)
    if eval_before is not None:
        summary["eval"] = _eval_summary(prep, eval_before, None)
    if not main:
        return TrainResult(None, trainer.state.global_step, tokens, train_seconds, *(losses[:1] or [None]),
                           *(losses[-1:] or [None]), resumed, False, summary)
    adapter = state_dir / "adapter"
    if spec.save_adapter:  # before merging: merge_and_unload takes the adapters out of the model
        model.save_pretrained(adapter)
    final = lora.merge(model) if spec.lora else base
    final.config.use_cache = True
    say("training done; writing and verifying the checkpoint")

    def extra(folder: Path) -> None:
        card.write_files(folder, summary, [dict(row) for row in trainer.state.log_history])
        if spec.save_adapter:
            shutil.copytree(adapter, folder / "adapter")

    result = write_model_checkpoint(final, prep.source, prep.out, prep.plan, overwrite=spec.overwrite,
                                    verify=spec.verify, extra=extra,
                                    training=card.section(summary, None if eval_before is None
                                                          else _eval_section(prep, eval_before, None)))
    if eval_before is not None:
        say("evaluating the trained checkpoint")
        _write_after(prep, result.out, eval_before, _eval_after(prep, result.out), summary)
    shutil.rmtree(state_dir, ignore_errors=True)
    return TrainResult(result.out, trainer.state.global_step, tokens, train_seconds, losses[0] if losses else None,
                       losses[-1] if losses else None, resumed, result.verified, summary)


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


def _eval_before(prep: Prepared) -> list[dict]:
    """SOURCE unpatched and with the plan training-free, on the suite (resumable: finished cases are kept)."""
    from ..eval.runner import run_eval

    return run_eval(str(prep.source), [prep.plan.spec], prep.spec.eval_suite, _eval_dir(prep) / "before",
                    progress=False)


def _eval_after(prep: Prepared, out: Path) -> list[dict]:
    """OUT as stock transformers loads it (its own config carries the scaling: no spec is applied on top), under
    its own name rather than the eval runner's 'unpatched'."""
    from ..eval.runner import run_eval

    return run_eval(str(out), {trained_label(prep): None}, prep.spec.eval_suite, _eval_dir(prep) / "after",
                    include_baseline=False, progress=False)


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
    return {"suite": load_suite(prep.spec.eval_suite).name, "before": str(folder / "before"),
            "after": str(folder / "after") if after is not None else None,
            "variants": {BASELINE: "SOURCE as loaded", training_free_label(prep): "SOURCE patched, training-free",
                         trained_label(prep): "this checkpoint (trained), as stock transformers loads it"},
            "records": rows}


def _eval_section(prep: Prepared, before: list[dict], after: list[dict] | None) -> str:
    """The card's eval block: the eval's own summary tables, one column per variant."""
    from ..eval.runner import summary_markdown
    from ..eval.suite import load_suite

    plan, folder = prep.plan.spec, _eval_dir(prep).name
    head = (f"Suite `{load_suite(prep.spec.eval_suite).name}`: `unpatched` is SOURCE as loaded, "
            f"`{training_free_label(prep)}` SOURCE with {plan.method} x{plan.factor:g} training-free, ")
    if after is None:
        head += "before training (the trained checkpoint's column is added when the run finishes)."
    else:
        head += (f"`{trained_label(prep)}` this checkpoint as stock transformers loads it (no spec applied on top). "
                 f"Full reports: `{folder}/before/report.md`, `{folder}/after/report.md` (beside this folder).")
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
