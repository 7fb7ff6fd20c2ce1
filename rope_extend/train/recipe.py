"""What a training run is: `TrainSpec` (every knob, with the published recipes' defaults) and its validation.

Defaults follow YaRN's fine-tuning recipe (jquesnelle/yarn `train.sh`): lr 2e-5, 20 warmup steps (capped at 5 % of
short runs), linear decay, AdamW betas (0.9, 0.95), no weight decay, 400 steps, global batch 64 windows. The global
batch is given in tokens (`batch_tokens`, default 64 windows); it is split into `micro_batch` windows per process
and gradient accumulation. LoRA (`lora=True`): r 16, alpha 64, dropout 0.05 on every linear layer but `lm_head`
(YaRN), with the embeddings and norms trainable (LongLoRA's "LoRA+": LoRA alone does not adapt to a longer context).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..memory import LOSS_CHUNK_BYTES, checkpointed_bytes_per_token
from ..spec import RopeSpec, load_spec

DEFAULT_STEPS = 400
DEFAULT_WINDOWS_PER_BATCH = 64
STATE_SUFFIX = ".train-state"  # beside OUT: Trainer checkpoints of a run in progress (resumable)


@dataclass
class TrainSpec:
    """Everything one `rope-extend train` run depends on. `train_model(TrainSpec(...))` runs it."""

    source: str
    output: str
    rope: RopeSpec | dict | str
    texts: list[str] = field(default_factory=list)
    dataset: str | None = None
    dataset_split: str = "train"
    dataset_column: str = "text"
    steps: int = DEFAULT_STEPS
    window: int | None = None  # None: the target length if it fits the machine, else PoSE at the original length
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
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 64
    lora_dropout: float = 0.05
    train_embeddings_and_norms: bool = True  # with LoRA (LongLoRA+)
    save_adapter: bool = False
    save_steps: int | None = None  # None: every 10 % of the run
    logging_steps: int = 1
    dtype: str = "auto"  # auto: bfloat16 on a GPU that has it, else float32
    gradient_checkpointing: str = "auto"  # auto | on | off (auto: on when a micro-batch's activations need it)
    memory_check: bool = True  # refuse before loading a run that does not fit (rope_extend.memory)
    loss_chunk: int | None = None  # positions per loss chunk; None: ~256 MiB of float32 logits (`loss.chunk_tokens_for`)
    sequence_parallel: int = 1  # > 1: each window split over this many processes (DeepSpeed Ulysses)
    deepspeed: str | None = None  # with sequence_parallel: a DeepSpeed JSON config (None: the built-in ZeRO-0)
    eval_suite: str | None = None
    eval_texts: list[str] = field(default_factory=list)  # refused if they overlap a training text
    overwrite: bool = False
    resume: bool = True
    verify: bool = True

    def __post_init__(self):
        if isinstance(self.gradient_checkpointing, bool):  # the Python API's former bool
            self.gradient_checkpointing = "on" if self.gradient_checkpointing else "off"

    # --- derived -------------------------------------------------------------------------------------------------
    def rope_spec(self) -> RopeSpec:
        return load_spec(self.rope)

    def warmup(self) -> int:
        if self.warmup_steps is not None:
            return int(self.warmup_steps)
        return min(20, math.ceil(0.05 * self.steps))

    def global_windows(self, window: int) -> int:
        if self.batch_tokens is None:
            return DEFAULT_WINDOWS_PER_BATCH
        return max(1, self.batch_tokens // window)

    def state_dir(self) -> Path:
        out = Path(self.output).expanduser().absolute()
        return out.parent / f"{out.name}{STATE_SUFFIX}"

    def fingerprint(self, rope: RopeSpec, extra: dict[str, Any]) -> str:
        """What a resumed run must share with the interrupted one (everything that changes the weights); `rope` is
        this run's parsed spec (`rope_spec()`, parsed once by `prepare`)."""
        keep = {k: v for k, v in asdict(self).items()
                if k not in ("output", "overwrite", "resume", "verify", "eval_suite", "eval_texts", "save_steps",
                             "logging_steps", "texts", "dataset", "memory_check", "deepspeed")}  # deepspeed: in `extra`
        if keep["sequence_parallel"] == 1:  # a run without it fingerprints as before the option existed
            del keep["sequence_parallel"]
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
    checks = [
        (spec.steps >= 1, f"--steps {spec.steps} must be >= 1"),
        (spec.window is None or spec.window >= 2, f"--window {spec.window} must be >= 2 tokens"),
        (spec.batch_tokens is None or spec.batch_tokens >= 1, f"--batch-tokens {spec.batch_tokens} must be >= 1"),
        (spec.micro_batch >= 1, f"--micro-batch {spec.micro_batch} must be >= 1"),
        (spec.learning_rate > 0, f"--lr {spec.learning_rate} must be > 0"),
        (spec.warmup_steps is None or spec.warmup_steps >= 0, f"--warmup {spec.warmup_steps} must be >= 0"),
        (spec.lora_r >= 1, f"--lora-r {spec.lora_r} must be >= 1"),
        (0 <= spec.lora_dropout < 1, f"--lora-dropout {spec.lora_dropout} must be in [0, 1)"),
        (spec.save_steps is None or spec.save_steps >= 1, f"--save-steps {spec.save_steps} must be >= 1"),
        (spec.logging_steps >= 1, f"--logging-steps {spec.logging_steps} must be >= 1"),
        (spec.loss_chunk is None or spec.loss_chunk >= 1, f"--loss-chunk {spec.loss_chunk} must be >= 1"),
        (spec.sequence_parallel >= 1, f"--sequence-parallel {spec.sequence_parallel} must be >= 1"),
        (spec.deepspeed is None or spec.sequence_parallel > 1,
         "--deepspeed configures a --sequence-parallel run; for ZeRO without sequence parallelism launch with "
         "`accelerate launch --config_file configs/accelerate/deepspeed-zero3.yaml`"),
        (spec.dtype in ("auto", "float32", "bfloat16", "float16"),
         f"--dtype {spec.dtype!r} is not one of auto, float32, bfloat16, float16"),
        (spec.gradient_checkpointing in ("auto", "on", "off"),
         f"--gradient-checkpointing {spec.gradient_checkpointing!r} is not one of auto, on, off"),
        (not spec.save_adapter or spec.lora, "--save-adapter needs --lora (a full fine-tune has no adapter)"),
        (bool(spec.texts) or spec.dataset is not None, "no training text: pass --text FILE (repeatable) or --dataset"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


def batch_split(global_windows: int, micro_batch: int, replicas: int, sequence_parallel: int = 1) -> int:
    """Gradient-accumulation steps so that micro_batch x replicas x accumulation = the global batch (exactly);
    `replicas` process groups take different windows (each group `sequence_parallel` processes sharing a window)."""
    per_step = micro_batch * replicas
    if global_windows % per_step:
        groups = (f"{replicas} process(es)" if sequence_parallel == 1 else
                  f"{replicas} group(s) of {sequence_parallel} sequence-parallel processes")
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
