"""`--sequence-parallel N`: each window split over N processes, on DeepSpeed's Ulysses (Arctic Long Sequence
Training, ALST) through transformers' `Trainer` and accelerate's `ParallelismConfig(sp_backend="deepspeed")`.

FSDP and ZeRO-3 shard the parameters, not the sequence; at long windows the activations dominate. Under Ulysses
each process holds 1/N of every window (its tokens, their activations, their share of the loss); in each attention
layer an all-to-all trades the sequence split for a head split, so every process attends over the whole window for
1/N of the heads, then trades back. transformers and accelerate wire it up (`UlyssesSPAttentionHF` replaces the
model's attention function, `UlyssesSPDataLoaderAdapter` shards each batch of every process over the group and
shifts its labels before the split); rope-extend adds what its own recipe needs, each piece named here:

- `prepare` (`check` / `check_attention` / `check_launch` / `deepspeed_config`, called by `parallelism.choose`, which
  wraps this module in the strategy the stages call): what cannot work is refused in one line before
  training, naming the fix (heads not divisible by N, a window not a multiple of N, eager attention, float16, a
  launch that started fewer processes than N, FSDP, a ZeRO-3 config that cannot gather the trained weights, a
  transformers/accelerate/DeepSpeed without Ulysses).
- `deepspeed_config` / `arguments`: the DeepSpeed config (a launch through `accelerate launch` with a DeepSpeed
  config keeps its own; otherwise `--deepspeed FILE` or the built-in `DEFAULT_ZERO`) and the `ParallelismConfig`;
  `join_deepspeed_comm` starts DeepSpeed's communication layer over the CPU processes' gloo group.
- `compute_loss`: rope-extend's loss in chunks (`loss.py`) on each process's shard of the pre-shifted labels,
  combined over the group by transformers' own token-weighted mean (`deepspeed_sp_compute_loss`, which also knows
  how each DeepSpeed release scales the gradients), the forward under rope-extend's autocast in mixed precision.
- `resumed_dataloader`: a resumed run skips what it trained through DeepSpeed's data adapter.
- `keep_grad_norm`, `planned_accumulation_quiet`: the log records `grad_norm` as the one-process log does, and
  accelerate's accumulation-mismatch warning is not shown for the accumulation rope-extend planned.
- `compile_note`: the line said before DeepSpeed compiles its shared-memory op for CPU processes (once).
- `attention_scoped`: DeepSpeed replaces transformers' "sdpa" entry process-wide; it is put back after training, so
  the writer's verification (one process) runs the model's own attention.

PoSE's position ids are part of every batch: the adapter shards them with the tokens (each process rotates its own
tokens at their true positions) and Ulysses gathers them again before attention.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
from pathlib import Path

from packaging.version import Version

from ..errors import SpecError

MIN_DEEPSPEED = "0.18.2"  # accelerate's floor for ALST/Ulysses (pyproject.toml's `deepspeed` extra)
INSTALL = f"pip install 'rope-extend[train,deepspeed]', or pip install 'deepspeed>={MIN_DEEPSPEED}'"
ATTENTION = "sdpa"  # the kernel Ulysses wraps here (GPUs may use flash attention; eager cannot be sharded)
SHARDABLE_ATTENTION = ("sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
# The built-in DeepSpeed config (`--deepspeed` not given, and no accelerate DeepSpeed config): ZeRO stage 0, every
# process holding the whole model and optimizer state as under DDP (sequence parallelism splits the activations, not
# the weights). On 2 CPU processes stages 1 and 2 ran 7x and 16x slower per step than stage 0 (many small
# collectives), stage 3 2x. "auto" values are filled from the run's own arguments by transformers. configs/deepspeed/
# ships it (zero0.json) and the stage-3 variants, for models whose weights and optimizer state do not fit one device.
DEFAULT_ZERO = {
    "zero_optimization": {"stage": 0},
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "bf16": {"enabled": "auto"},
    "fp16": {"enabled": "auto"},
}


def _launch_hint(n: int) -> str:
    return (f"start {n} processes (or a multiple of {n}) with `torchrun --nproc_per_node {n} -m rope_extend train ...`, "
            f"`deepspeed --num_gpus {n} -m rope_extend train ...` or `accelerate launch --use_deepspeed --num_processes "
            f"{n} -m rope_extend train ...`")


def missing_support() -> str | None:
    """What the installed transformers / accelerate / DeepSpeed lack for Ulysses sequence parallelism (None: none)."""
    if importlib.util.find_spec("deepspeed") is None:
        return f"DeepSpeed is not installed ({INSTALL})"
    deepspeed = importlib.metadata.version("deepspeed")
    if Version(deepspeed) < Version(MIN_DEEPSPEED):
        return f"DeepSpeed {deepspeed} has no Ulysses for Hugging Face models ({INSTALL})"
    try:
        from accelerate.utils import DeepSpeedSequenceParallelConfig  # noqa: F401
    except ImportError:
        return (f"accelerate {importlib.metadata.version('accelerate')} has no DeepSpeed sequence parallelism "
                "(pip install -U accelerate)")
    from transformers.integrations import deepspeed as hf_deepspeed

    if not hasattr(hf_deepspeed, "deepspeed_sp_compute_loss"):
        return (f"transformers {importlib.metadata.version('transformers')} has no DeepSpeed sequence parallelism "
                "in its Trainer (pip install -U transformers)")
    return None


def prepare(n: int, deepspeed: str | None, dtype: str, text_config, window: int, world: int,
            launched_with: str | None) -> dict | None:
    """Everything checked before the tokenizer and the model load (`check`, `check_launch`), and the DeepSpeed config
    rope-extend gives the run: None under an accelerate DeepSpeed launch (it brings its own), else `--deepspeed FILE`
    (`deepspeed`) or `DEFAULT_ZERO`."""
    check(n, text_config, window, dtype)
    check_launch(n, world, launched_with)
    if launched_with != "DeepSpeed":
        return deepspeed_config(deepspeed)
    if deepspeed is not None:
        raise SpecError(f"--deepspeed {deepspeed} and the accelerate launch's DeepSpeed config both configure "
                        "DeepSpeed; pass one (drop --deepspeed, or launch with torchrun)", field="deepspeed",
                        value=deepspeed)
    return None


def check(n: int, text_config, window: int, dtype: str) -> None:
    """Refuse, before any model is loaded, what Ulysses cannot shard (`n` > 1)."""
    if dtype == "float16":
        raise SpecError(f"--sequence-parallel {n} with --dtype float16: rope-extend's autocast on DeepSpeed runs "
                        "without a loss scaler; use --dtype bfloat16", field="dtype", value=dtype)
    heads = text_config.num_attention_heads
    kv = getattr(text_config, "num_key_value_heads", None) or heads
    if heads % n:
        fits = [d for d in range(2, heads + 1) if heads % d == 0 and (kv % d == 0 or d % kv == 0)]
        raise SpecError(f"--sequence-parallel {n}: the model has {heads} attention heads, which do not split over {n} "
                        f"processes (Ulysses gives each process heads/N of them); use --sequence-parallel "
                        f"{' or '.join(map(str, fits[:4])) or '1'}", field="sequence_parallel", value=n)
    if kv % n and n % kv:
        raise SpecError(f"--sequence-parallel {n}: the model's {kv} key/value heads neither split over {n} processes "
                        f"nor divide {n} (Ulysses splits or repeats them); use a divisor or a multiple of {kv}",
                        field="sequence_parallel", value=n)
    if window % n:
        low, high = window - window % n, window - window % n + n
        raise SpecError(f"--sequence-parallel {n}: --window {window} does not split into {n} equal shards (every "
                        f"process holds window/N tokens); use --window {high}" + (f" or {low}" if low else ""),
                        field="window", value=window)
    check_attention(n, getattr(text_config, "_attn_implementation", None), "SOURCE's config.json")


def check_attention(n: int, implementation: str | None, where: str) -> None:
    """Eager attention builds the full 4-D mask and cannot be sharded (DeepSpeed refuses it); `None` is
    transformers' default, sdpa for the families rope-extend trains."""
    if implementation in (None, *SHARDABLE_ATTENTION):
        return
    raise SpecError(f"--sequence-parallel {n}: {where} asks for attn_implementation {implementation!r}, which "
                    f"Ulysses cannot shard (it needs {ATTENTION} here, or a flash-attention kernel on GPUs); use a "
                    "copy of SOURCE whose config.json leaves attn_implementation out, or train without "
                    "--sequence-parallel", field="sequence_parallel", value=n)


def check_launch(n: int, world: int, asked: str | None) -> None:
    """The launch must have started a multiple of N processes, and not under FSDP."""
    if world < n or world % n:
        raise SpecError(f"--sequence-parallel {n} splits each window over {n} processes, but this launch started "
                        f"{world}; {_launch_hint(n)} (a plain `accelerate launch --num_processes {n}` on a machine "
                        "without GPUs starts one)", field="sequence_parallel", value=n)
    if asked == "FSDP":
        raise SpecError(f"--sequence-parallel {n} runs on DeepSpeed (Ulysses), not FSDP; launch without the FSDP "
                        "config: configs/accelerate/deepspeed-zero3.yaml or torchrun", field="sequence_parallel",
                        value=n)
    reason = missing_support()
    if reason:
        raise SpecError(f"--sequence-parallel {n} needs DeepSpeed's Ulysses through transformers' Trainer: {reason}",
                        field="sequence_parallel", value=n)


def deepspeed_config(path: str | None) -> dict:
    """The DeepSpeed config of a `--sequence-parallel` run launched without accelerate's DeepSpeed config:
    `--deepspeed FILE` (a JSON file, as transformers' `--deepspeed` takes), else `DEFAULT_ZERO`."""
    if path is None:
        return json.loads(json.dumps(DEFAULT_ZERO))
    file = Path(path).expanduser()
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise SpecError(f"--deepspeed {path!r} is not a readable DeepSpeed JSON config ({exc}); pass one of "
                        "configs/deepspeed/*.json", field="deepspeed", value=path) from None
    zero = config.get("zero_optimization", {}) if isinstance(config, dict) else None
    if not isinstance(zero, dict):
        raise SpecError(f"--deepspeed {path!r} is not a DeepSpeed config (a JSON object with zero_optimization); "
                        "pass one of configs/deepspeed/*.json", field="deepspeed", value=path)
    if zero.get("stage") == 3 and not zero.get("stage3_gather_16bit_weights_on_model_save"):
        raise SpecError(f"--deepspeed {path!r}: ZeRO stage 3 without zero_optimization."
                        "stage3_gather_16bit_weights_on_model_save true, so the trained weights could not be gathered "
                        "to write OUT; set it to true (configs/deepspeed/zero3.json has it)", field="deepspeed",
                        value=path)
    return config


def arguments(n: int, world: int, deepspeed: dict | None) -> dict:
    """The `TrainingArguments` keywords of an N-way Ulysses run over `world` processes: groups of N processes
    share each window, world / N groups take different windows (data parallel)."""
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DeepSpeedSequenceParallelConfig

    handler = DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=True, sp_attn_implementation=ATTENTION)
    kwargs = {"parallelism_config": ParallelismConfig(sp_backend="deepspeed", sp_size=n,
                                                      dp_replicate_size=world // n, sp_handler=handler)}
    if deepspeed is not None:
        kwargs["deepspeed"] = deepspeed
    return kwargs


def join_deepspeed_comm() -> None:
    """DeepSpeed's communication layer over the process group transformers started. On the CPU transformers starts a
    gloo group through accelerate (counting the processes) and leaves DeepSpeed's layer to `deepspeed.initialize`,
    which comes after Ulysses has asked it for its groups (`parallel_state_sp` asserts it is up); on GPUs it is up
    already (this then does nothing)."""
    import torch.distributed
    from deepspeed import comm

    if not comm.is_initialized():
        comm.init_distributed(dist_backend=torch.distributed.get_backend(), auto_mpi_discovery=False)


SHM_OP = "ShareMemCommBuilder"  # DeepSpeed's shared-memory collectives between CPU processes, compiled on first use


def compile_note() -> str | None:
    """The line to say before DeepSpeed compiles its shared-memory communication op (CPU processes only; torch's
    JIT build, once per machine and torch, then reused), or None when it is built already or not used here."""
    from pathlib import Path

    try:
        import deepspeed.ops
        from deepspeed.accelerator import get_accelerator
        from deepspeed.git_version_info import installed_ops
        from deepspeed.ops.op_builder.builder import OpBuilder
        from torch.utils.cpp_extension import _get_build_directory

        builder = get_accelerator().create_op_builder(SHM_OP)
        if (builder is None or builder.name in OpBuilder._loaded_ops or installed_ops.get(builder.name)
                or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False)):
            return None
        folder = Path(_get_build_directory(builder.name, verbose=False))
    except Exception:  # another DeepSpeed or torch layout: nothing to say, DeepSpeed builds it or not
        return None
    if (folder / f"{builder.name}.so").is_file():
        return None
    return (f"DeepSpeed compiles its shared-memory communication op ({builder.name}) for these CPU processes first: "
            f"once per machine and torch, {SHM_COMPILE}, reused from {folder} afterwards")


SHM_COMPILE = "2.5-7 min on 2 busy cores"  # measured: docs/train.md#sequence-parallelism


def active(trainer) -> bool:
    pc = getattr(trainer.accelerator, "parallelism_config", None)
    return pc is not None and pc.sp_backend == "deepspeed" and pc.sp_enabled


def compute_loss(trainer, model, inputs: dict, chunk_tokens: int, return_outputs: bool, autocast=None):
    """The training loss of one process's shard: `loss.chunked_loss_sum` over the shard's pre-shifted labels (the
    adapter shifted them before splitting, so the last token of a shard predicts the first of the next), its mean
    combined over the group by transformers' `deepspeed_sp_compute_loss` (the mean over the whole window; each
    process backpropagates its own share). The Trainer then averages the windows of a step: the one-process token
    mean, as every window holds the same number of predicted positions (`data.py`). `autocast`: the dtype the
    model's forward runs in under mixed precision (as accelerate's wrapper does for one process; the loss chunks
    run outside it, as there)."""
    import torch
    from transformers.integrations.deepspeed import deepspeed_sp_compute_loss

    from .loss import IGNORE_INDEX, chunked_loss_sum, head_input

    head = trainer.accelerator.unwrap_model(model).get_output_embeddings()

    def forward(**batch):
        targets = batch.pop("shift_labels")
        batch.pop("labels", None)
        mixed = (torch.autocast(trainer.accelerator.device.type, dtype=autocast) if autocast is not None
                 else contextlib.nullcontext())
        with head_input(head) as seen, mixed:
            outputs = model(**batch)
        count = (targets != IGNORE_INDEX).sum().to(seen[0].device)
        outputs.loss = chunked_loss_sum(seen[0], targets, head, chunk_tokens) / count.clamp(min=1)
        outputs.loss = outputs.loss + 0.0 * outputs.logits.float().sum()  # as `RopeExtendTrainer.compute_loss`
        return outputs

    return deepspeed_sp_compute_loss(trainer.accelerator, forward, inputs, return_outputs,
                                     trainer.accelerator.parallelism_config)


def keep_grad_norm(engine) -> None:
    """transformers logs the gradient norm DeepSpeed reports (`get_global_grad_norm`), which DeepSpeed keeps only
    from a ZeRO or mixed-precision optimizer: under the built-in ZeRO-0 config it clips float32 gradients by their
    norm and drops the number, so the log of a sequence-parallel run had no `grad_norm` where the one-process log
    has it. Within `engine`, the clipping keeps its norm (the same `clip_grad_norm_` on the same gradients). Other
    engines (ZeRO >= 1, DeepSpeed's bf16) report their own and are left as they are."""
    if getattr(engine, "_rope_extend_keeps_grad_norm", False) or not hasattr(engine, "clip_fp32_gradients"):
        return
    from deepspeed.runtime.utils import clip_grad_norm_

    def clip_fp32_gradients():
        norm = clip_grad_norm_(parameters=engine.module.parameters(), max_norm=engine.gradient_clipping(),
                               mpu=engine.mpu)
        engine._global_grad_norm = float(norm)

    engine.clip_fp32_gradients = clip_fp32_gradients
    engine._rope_extend_keeps_grad_norm = True


@contextlib.contextmanager
def planned_accumulation_quiet(accumulation: int):
    """transformers' Trainer hands accelerate a DeepSpeed config whose accumulation it filled ("auto") and a plugin
    of 1 (DeepSpeed accumulates), and accelerate warns "Gradient accumulation steps mismatch: GradientAccumulationPlugin
    has 1, DeepSpeed config has N. Using DeepSpeed's value." for every run. Within the block the warning is dropped
    when N is the accumulation rope-extend planned (nothing is wrong); any other N is shown."""
    import logging
    import re

    mismatch = re.compile(r"Gradient accumulation steps mismatch: .* DeepSpeed config has (\d+)\.")

    class Planned(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            found = mismatch.search(record.getMessage())
            return not (found and int(found.group(1)) == accumulation)

    logger = logging.getLogger("accelerate.accelerator")
    planned = Planned()
    logger.addFilter(planned)
    try:
        yield
    finally:
        logger.removeFilter(planned)


def resumed_dataloader(adapter, micro_batches: int):
    """The Ulysses data adapter without its first `micro_batches` (what a resumed run trained already).
    transformers skips batches with accelerate's `skip_first_batches`, which needs the wrapped DataLoader (`.dataset`)
    that the adapter hides (transformers 5.25: AttributeError on resume). The adapter yields N micro-batches (one per
    process of the group) per batch of the DataLoader it wraps: whole batches are skipped there, the rest here."""
    from accelerate import skip_first_batches

    n = adapter.sp_world_size
    resumed = type(adapter)(skip_first_batches(adapter.dl, micro_batches // n), sp_rank=adapter.sp_rank,
                            sp_group=adapter.sp_group, sp_world_size=n, device=adapter.device)
    for _ in range(micro_batches % n):
        next(resumed)
    return resumed


@contextlib.contextmanager
def attention_scoped():
    """DeepSpeed's `register_with_transformers` replaces transformers' attention entry for the whole process; within
    this block only: afterwards the entry that was there comes back."""
    from .. import compat

    registry = compat.attention_functions()
    previous = registry.get_local(ATTENTION)
    try:
        yield
    finally:
        registry.set_local(ATTENTION, previous)


def describe(n: int, world: int) -> str:
    """The progress line's words for how the windows are spread."""
    groups = world // n
    return (f"Ulysses sequence parallel: each window split over {n} processes, each holding 1/{n} of its tokens and "
            f"activations" + (f"; {groups} such groups train on different windows" if groups > 1 else ""))
