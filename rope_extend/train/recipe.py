"""What a training run is: `TrainSpec` (every knob, with the published recipes' defaults, grouped by the stage that
owns it: data, optimisation, adapters, compute, parallelism, progress, evaluation, finish) and its validation.

Defaults follow YaRN's fine-tuning recipe (jquesnelle/yarn `train.sh`): lr 2e-5, 20 warmup steps (capped at 5 % of
short runs), linear decay, AdamW betas (0.9, 0.95), no weight decay, 400 steps, global batch 64 windows. The global
batch is given in tokens (`batch_tokens`, default 64 windows); it is split into `micro_batch` windows per process
and gradient accumulation. LoRA (`lora=True`): r 16, alpha 64, dropout 0.05 on every linear layer but `lm_head`
(YaRN), with the embeddings and norms trainable (LongLoRA's "LoRA+": LoRA alone does not adapt to a longer context).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..memory import LOSS_CHUNK_BYTES, checkpointed_bytes_per_token
from ..spec import RopeSpec, load_spec

DEFAULT_STEPS = 400
DEFAULT_WINDOWS_PER_BATCH = 64
STATE_SUFFIX = ".train-state"  # beside OUT: Trainer checkpoints of a run in progress (resumable)


@dataclass
class DataOptions:
    """`prepare`'s: what is read and tokenized, and the window it is cut into."""

    texts: list[str] = field(default_factory=list)
    dataset: str | None = None
    dataset_split: str = "train"
    dataset_column: str = "text"
    window: int | None = None  # None: the target length if it fits the machine, else PoSE at the original length


@dataclass
class OptimisationOptions:
    """`trainer`'s: the optimizer, its schedule and the global batch (transformers' `TrainingArguments`)."""

    steps: int = DEFAULT_STEPS
    batch_tokens: int | None = None  # None: 64 windows
    micro_batch: int = 1
    learning_rate: float = 2e-5
    warmup_steps: int | None = None  # None: min(20, ceil(5 % of steps))
    scheduler: str = "linear"
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0

    def warmup(self) -> int:
        if self.warmup_steps is not None:
            return int(self.warmup_steps)
        return min(20, math.ceil(0.05 * self.steps))

    def global_windows(self, window: int) -> int:
        if self.batch_tokens is None:
            return DEFAULT_WINDOWS_PER_BATCH
        return max(1, self.batch_tokens // window)


@dataclass
class AdapterOptions:
    """`trainer`'s (`lora.wrap`) and `finish`'s (merge, --save-adapter): LoRA or a full fine-tune. A field's
    `flat` name is its keyword in `TrainSpec(...)` and its key in training.json's recipe."""

    enabled: bool = field(default=False, metadata={"flat": "lora"})
    r: int = field(default=16, metadata={"flat": "lora_r"})
    alpha: int = field(default=64, metadata={"flat": "lora_alpha"})
    dropout: float = field(default=0.05, metadata={"flat": "lora_dropout"})
    train_embeddings_and_norms: bool = True  # with LoRA (LongLoRA+)
    save_adapter: bool = False


@dataclass
class ComputeOptions:
    """`trainer`'s memory plan and precision; `prepare`'s memory check."""

    dtype: str = "auto"  # auto: bfloat16 on a GPU that has it, else float32
    gradient_checkpointing: str = "auto"  # auto | on | off (auto: on when a micro-batch's activations need it)
    memory_check: bool = True  # refuse before loading a run that does not fit (rope_extend.memory)
    loss_chunk: int | None = None  # positions per loss chunk; None: ~256 MiB of float32 logits (`loss.chunk_tokens_for`)

    def __post_init__(self):
        if isinstance(self.gradient_checkpointing, bool):  # the Python API's former bool
            self.gradient_checkpointing = "on" if self.gradient_checkpointing else "off"


@dataclass
class ParallelismOptions:
    """How the windows spread over processes: `parallelism.choose` turns these into the run's one strategy."""

    sequence_parallel: int = 1  # > 1: each window split over this many processes (DeepSpeed Ulysses)
    deepspeed: str | None = None  # with sequence_parallel: a DeepSpeed JSON config (None: the built-in ZeRO-0)

    @property
    def splits_windows(self) -> bool:
        """Whether processes share each window (the one place that asks)."""
        return self.sequence_parallel > 1


@dataclass
class ProgressOptions:
    """`trainer`'s and `progress`'s: the log and the resumable state in OUT.train-state/."""

    save_steps: int | None = None  # None: every 10 % of the run
    logging_steps: int = 1
    resume: bool = True


@dataclass
class EvaluationOptions:
    """`evaluation`'s: --eval-suite before and after, and the held-out texts checked against the training data."""

    suite: str | None = field(default=None, metadata={"flat": "eval_suite"})
    texts: list[str] = field(default_factory=list, metadata={"flat": "eval_texts"})  # refused if they overlap a
    # training text


@dataclass
class FinishOptions:
    """`finish`'s: how OUT is written."""

    overwrite: bool = False
    verify: bool = True


GROUPS = {"data": DataOptions, "optimisation": OptimisationOptions, "adapters": AdapterOptions,
          "compute": ComputeOptions, "parallelism": ParallelismOptions, "progress": ProgressOptions,
          "evaluation": EvaluationOptions, "finish": FinishOptions}


def _flat_name(f) -> str:
    return f.metadata.get("flat", f.name)


# every flat keyword of `TrainSpec(...)` -> (its group, the field there)
FLAT = {_flat_name(f): (group, f.name) for group, cls in GROUPS.items() for f in fields(cls)}
# what a resumed run need not share with the interrupted one (the strategy's own part: `Parallelism.fingerprint`)
NOT_FINGERPRINTED = ("output", "overwrite", "resume", "verify", "eval_suite", "eval_texts", "save_steps",
                     "logging_steps", "texts", "dataset", "memory_check", "sequence_parallel", "deepspeed")


@dataclass(init=False)
class TrainSpec:
    """Everything one `rope-extend train` run depends on, grouped by the stage that owns it. `train_model(TrainSpec(...))`
    runs it.

    `TrainSpec(source, output, rope, steps=100, lora=True, ...)` takes every option by its flat name (the CLI's
    flag, training.json's recipe key: `FLAT`) and puts it in its group; a whole group may be given instead
    (`optimisation=OptimisationOptions(steps=100)`).
    """

    source: str
    output: str
    rope: RopeSpec | dict | str
    data: DataOptions
    optimisation: OptimisationOptions
    adapters: AdapterOptions
    compute: ComputeOptions
    parallelism: ParallelismOptions
    progress: ProgressOptions
    evaluation: EvaluationOptions
    finish: FinishOptions

    def __init__(self, source: str, output: str, rope: RopeSpec | dict | str, **options: Any):
        self.source, self.output, self.rope = source, output, rope
        given = {name: options.pop(name) for name in GROUPS if name in options}
        flat: dict[str, dict[str, Any]] = {name: {} for name in GROUPS}
        for key, value in options.items():
            if key not in FLAT:
                raise TypeError(f"TrainSpec() got an unexpected keyword argument {key!r}")
            group, name = FLAT[key]
            if group in given:
                raise TypeError(f"TrainSpec() got {key!r} and the whole group {group!r}; pass one")
            flat[group][name] = value
        for name, cls in GROUPS.items():
            setattr(self, name, given[name] if name in given else cls(**flat[name]))

    # --- derived -------------------------------------------------------------------------------------------------
    def rope_spec(self) -> RopeSpec:
        return load_spec(self.rope)

    def flat(self) -> dict[str, Any]:
        """Every option under its flat name (what `TrainSpec(...)` takes), as one dict."""
        out = {"source": self.source, "output": self.output, "rope": copy.deepcopy(self.rope)}
        for name in GROUPS:
            group = getattr(self, name)
            out.update({_flat_name(f): copy.deepcopy(getattr(group, f.name)) for f in fields(group)})
        return out

    def state_dir(self) -> Path:
        out = Path(self.output).expanduser().absolute()
        return out.parent / f"{out.name}{STATE_SUFFIX}"

    def fingerprint(self, rope: RopeSpec, extra: dict[str, Any]) -> str:
        """What a resumed run must share with the interrupted one (everything that changes the weights); `rope` is
        this run's parsed spec (`rope_spec()`, parsed once by `prepare`); `extra` holds what prepare derived and the
        parallelism strategy's part (`Parallelism.fingerprint`: nothing for whole windows, so a run without
        sequence parallelism fingerprints as before the option existed)."""
        keep = {k: v for k, v in self.flat().items() if k not in NOT_FINGERPRINTED}
        keep["rope"] = rope.to_dict()
        keep.update(extra)
        return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def check_static(spec: RopeSpec) -> None:
    """Training needs a static RoPE written into the config: dynamic methods recompute the frequencies from
    max(position_ids) + 1, and attention-level methods (self-extend, dual-chunk, string) remap attention in-process
    only, so the Trainer's attention would not be the one the checkpoint is served with."""
    method = spec.rope_method
    if method.acts_on_attention:
        raise SpecError(
            f"method {spec.method!r} remaps attention at inference (in-process, rope_extend.patch_model); training "
            "runs the model's own attention kernel and would fine-tune a model that is not the one served; train "
            f"with a static frequency method (yarn, linear, ntk, ntk-by-parts, llama3), or apply {spec.method} "
            "to the model as it is, without training",
            field="method", value=spec.method,
        )
    if getattr(method, "dynamic", False):
        raise SpecError(
            f"method {spec.method!r} is dynamic: it recomputes the RoPE frequencies from the longest position of each "
            "forward, so training windows (and PoSE's position jumps) would each see different frequencies than "
            "inference; train with a static method (yarn, linear, ntk, ntk-by-parts, llama3)",
            field="method", value=spec.method,
        )


def check_numbers(spec: TrainSpec) -> None:
    """One line per bad number, before anything is loaded."""
    data, opt, adapters, compute = spec.data, spec.optimisation, spec.adapters, spec.compute
    progress, parallel = spec.progress, spec.parallelism
    checks = [
        (opt.steps >= 1, f"--steps {opt.steps} must be >= 1"),
        (data.window is None or data.window >= 2, f"--window {data.window} must be >= 2 tokens"),
        (opt.batch_tokens is None or opt.batch_tokens >= 1, f"--batch-tokens {opt.batch_tokens} must be >= 1"),
        (opt.micro_batch >= 1, f"--micro-batch {opt.micro_batch} must be >= 1"),
        (opt.learning_rate > 0, f"--lr {opt.learning_rate} must be > 0"),
        (opt.warmup_steps is None or opt.warmup_steps >= 0, f"--warmup {opt.warmup_steps} must be >= 0"),
        (adapters.r >= 1, f"--lora-r {adapters.r} must be >= 1"),
        (0 <= adapters.dropout < 1, f"--lora-dropout {adapters.dropout} must be in [0, 1)"),
        (progress.save_steps is None or progress.save_steps >= 1, f"--save-steps {progress.save_steps} must be >= 1"),
        (progress.logging_steps >= 1, f"--logging-steps {progress.logging_steps} must be >= 1"),
        (compute.loss_chunk is None or compute.loss_chunk >= 1, f"--loss-chunk {compute.loss_chunk} must be >= 1"),
        (parallel.sequence_parallel >= 1, f"--sequence-parallel {parallel.sequence_parallel} must be >= 1"),
        (parallel.deepspeed is None or parallel.splits_windows,
         "--deepspeed configures a --sequence-parallel run; for ZeRO without sequence parallelism launch with "
         "`accelerate launch --config_file configs/accelerate/deepspeed-zero3.yaml`"),
        (compute.dtype in ("auto", "float32", "bfloat16", "float16"),
         f"--dtype {compute.dtype!r} is not one of auto, float32, bfloat16, float16"),
        (compute.gradient_checkpointing in ("auto", "on", "off"),
         f"--gradient-checkpointing {compute.gradient_checkpointing!r} is not one of auto, on, off"),
        (not adapters.save_adapter or adapters.enabled, "--save-adapter needs --lora (a full fine-tune has no adapter)"),
        (bool(data.texts) or data.dataset is not None, "no training text: pass --text FILE (repeatable) or --dataset"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


def batch_split(global_windows: int, micro_batch: int, replicas: int, groups: str) -> int:
    """Gradient-accumulation steps so that micro_batch x replicas x accumulation = the global batch (exactly);
    `replicas` process groups take different windows, `groups` says what they are (`Parallelism.groups`)."""
    per_step = micro_batch * replicas
    if global_windows % per_step:
        raise ValueError(
            f"the global batch of {global_windows} windows does not split into {groups} x "
            f"--micro-batch {micro_batch}; choose --batch-tokens as a multiple of {per_step} windows"
        )
    return global_windows // per_step


def default_window(target: int, original: int, model_bytes: int, hidden: int, layers: int, vocab: int,
                   available: int) -> int:
    """The target length if one window's training memory fits in half the available memory, else PoSE at the
    model's original length (the PoSE paper trains at the original window). `model_bytes`: the float32 weights."""
    # Memory is linear in the window (memory-efficient attention, the loss in chunks, gradient checkpointing when
    # needed); the loss's one chunk of float32 logits (and its gradient) is a constant.
    per_token = checkpointed_bytes_per_token(hidden, layers)
    need = model_bytes * 4 + target * per_token + LOSS_CHUNK_BYTES  # weights + grads + AdamW; one loss chunk
    return target if need <= available // 2 else min(original, target)


def needs_checkpointing(activations: int, fixed: int, available: int) -> bool:
    """`auto`: checkpoint when one micro-batch's activations would take more than half of what the weights,
    gradients and optimizer state (`fixed`) leave of the available memory."""
    return activations > max(available - fixed, 0) // 2
