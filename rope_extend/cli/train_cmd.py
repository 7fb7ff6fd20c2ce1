"""`rope-extend train`: fine-tune a checkpoint at its new length after the RoPE patch (thin over rope_extend.train).

Imports nothing heavy at module level: torch/transformers/peft/datasets load inside the command.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..terminal import shell_path
from .app import app, fail, say
from .options import (
    Dtype,
    Factor,
    NoMemoryCheck,
    NoVerify,
    Overwrite,
    Private,
    PushToHub,
    Sets,
    SpecFile,
    TargetLength,
    UnpatchedModel,
    build_spec,
    method_option,
)

if TYPE_CHECKING:
    from ..train import TrainSpec
    from ..train.runner import TrainResult

EXAMPLES = """Examples:

  rope-extend train smollm2 --method yarn --factor 2 --text plays.txt --text kjv.txt --window 2048 --steps 200 -o out/smollm2-16k

  rope-extend train ./my-model --config configs/yarn-x8.yaml --dataset ./books --lora -o out/my-model-64k

  accelerate launch -m rope_extend train ./my-model --method yarn --factor 4 --text a.txt -o out/model-train

  torchrun --nproc_per_node 4 -m rope_extend train ./my-model --method yarn --factor 16 --text a.txt --window 65536 --sequence-parallel 4 -o out/model-64k

  rope-extend train smollm2 --method yarn --factor 2 --text plays.txt -o out/smollm2-16k --push-to-hub me/smollm2-16k

Rerunning the same command after an interruption (SIGTERM, Ctrl-C, SIGKILL) resumes from OUT.train-state/.
"""


@app.command(name="train", epilog=EXAMPLES)
def train_command(
    source: UnpatchedModel,
    output: Annotated[Path, typer.Option("-o", "--output", help="Output checkpoint folder (written atomically).")],
    method: method_option("Static scaling method (yarn, linear, ...).") = None,
    factor: Factor = None,
    target_length: TargetLength = None,
    config: SpecFile = None,
    sets: Sets = None,
    text: Annotated[list[Path] | None, typer.Option("--text", help="Training text file, one document (repeatable).")] = None,
    dataset: Annotated[str | None, typer.Option("--dataset", help="datasets folder (save_to_disk or data files) or Hub dataset id.")] = None,
    dataset_split: Annotated[str, typer.Option("--dataset-split")] = "train",
    dataset_column: Annotated[str, typer.Option("--dataset-column")] = "text",
    steps: Annotated[int, typer.Option("--steps", help="Optimizer steps (YaRN: 400).")] = 400,
    window: Annotated[int | None, typer.Option("--window", "-w", help="Training window; shorter than the target "
                                               "length = PoSE (default: the target if it fits, else the original length).")] = None,
    batch_tokens: Annotated[int | None, typer.Option("--batch-tokens", help="Global batch in tokens (default 64 windows).")] = None,
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Windows per process per forward.")] = 1,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate.")] = 2e-5,
    warmup: Annotated[int | None, typer.Option("--warmup", help="Warmup steps (default min(20, 5 % of steps)).")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    lora: Annotated[bool, typer.Option("--lora", help="LoRA (r 16, alpha 64) + trainable embeddings and norms.")] = False,
    lora_r: Annotated[int, typer.Option("--lora-r")] = 16,
    lora_alpha: Annotated[int, typer.Option("--lora-alpha")] = 64,
    lora_dropout: Annotated[float, typer.Option("--lora-dropout", help="Dropout on the adapters' input (each process draws its own masks).")] = 0.05,
    lora_only: Annotated[bool, typer.Option("--lora-only", help="LoRA without the trainable embeddings and norms (adapts less to long context).")] = False,
    no_embeddings_norms: Annotated[bool, typer.Option("--no-train-embeddings-norms", hidden=True, help="The older name of --lora-only.")] = False,
    save_adapter: Annotated[bool, typer.Option("--save-adapter", help="Also keep the adapter in OUT/adapter.")] = False,
    save_steps: Annotated[int | None, typer.Option("--save-steps", help="Checkpoint every N steps (default 10 % of the run).")] = None,
    logging_steps: Annotated[int, typer.Option("--logging-steps", help="Progress line and log entry every N steps.")] = 1,
    dtype: Dtype = "auto",
    gradient_checkpointing: Annotated[str, typer.Option(
        "--gradient-checkpointing", help="auto (on when a micro-batch's activations need it; the progress line "
        "says which), on, off.")] = "auto",
    loss_chunk: Annotated[int | None, typer.Option("--loss-chunk", help="Positions per loss chunk (default: ~256 MiB of float32 logits).")] = None,
    sequence_parallel: Annotated[int, typer.Option("--sequence-parallel", help="Split each window over N processes (DeepSpeed Ulysses); launch a multiple of N processes.")] = 1,
    deepspeed: Annotated[Path | None, typer.Option("--deepspeed", help="DeepSpeed JSON config of a --sequence-parallel run (default: ZeRO-0; configs/deepspeed/).")] = None,
    eval_suite: Annotated[str | None, typer.Option("--eval-suite", help="Eval suite before/after; into the card.")] = None,
    eval_text: Annotated[list[Path] | None, typer.Option("--eval-text", help="Held-out text: refused if it overlaps a training text.")] = None,
    overwrite: Overwrite = False,
    restart: Annotated[bool, typer.Option("--restart", help="Discard OUT.train-state and start over.")] = False,
    no_verify: NoVerify = False,
    no_memory_check: NoMemoryCheck = False,
    push_to_hub: PushToHub = None,
    private: Private = False,
) -> None:
    """Fine-tune SOURCE at the extended length (YaRN recipe, PoSE windows, optional LoRA+) and write OUT."""
    from ..train import TrainSpec

    rope = build_spec(method, factor, target_length, config, sets or [])
    if push_to_hub:
        _check_push(push_to_hub, output, private)
    spec = TrainSpec(
        source=source, output=str(output), rope=rope, texts=[str(t) for t in text or []], dataset=dataset,
        dataset_split=dataset_split, dataset_column=dataset_column, steps=steps, window=window,
        batch_tokens=batch_tokens, micro_batch=micro_batch, learning_rate=lr, warmup_steps=warmup, seed=seed,
        lora=lora, lora_r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
        train_embeddings_and_norms=not (lora_only or no_embeddings_norms),
        save_adapter=save_adapter, save_steps=save_steps, logging_steps=logging_steps, dtype=dtype,
        gradient_checkpointing=gradient_checkpointing, loss_chunk=loss_chunk, sequence_parallel=sequence_parallel,
        deepspeed=str(deepspeed) if deepspeed is not None else None,
        eval_suite=eval_suite, eval_texts=[str(t) for t in eval_text or []], overwrite=overwrite, resume=not restart,
        verify=not no_verify, memory_check=not no_memory_check,
    )
    result = _train(spec)
    if result.out is None:  # not the main process of a distributed run
        return
    _say_written(result)
    if push_to_hub:
        from .push_cmd import publish

        publish(result.out, push_to_hub, private, dry_run=False, flag="--push-to-hub", written_now=True)


def _train(spec: TrainSpec) -> TrainResult:
    """`train_model` with a progress line per step; an interrupt (SIGTERM, Ctrl-C) is one line, from the main
    process of a distributed run, and the exit status 128 + the signal (OUT.train-state/ resumes it)."""
    from ..train.progress import TrainingInterrupted, progress_printer
    from ..train.runner import train_model

    try:
        return train_model(spec, on_progress=progress_printer())
    except TrainingInterrupted as stop:
        if os.environ.get("RANK", "0") == "0":  # one line for a distributed run too, from its main process
            print(f"rope-extend: {stop.message()}", file=sys.stderr, flush=True)
        raise SystemExit(128 + int(stop.signum)) from None


def _say_written(result: TrainResult) -> None:
    """What was written: OUT, the steps, tokens and time, the loss, and whether stock transformers verified it."""
    from ..train.training_card import loss_line

    if result.first_loss is None:
        fail("training logged no loss")
    say(f"wrote {shell_path(result.out)}: {result.steps} steps, {result.tokens:,} tokens in {result.seconds:.1f} s; loss "
        f"{loss_line(result.summary)}; "
        f"{'verified with stock transformers (reload equals the trained model)' if result.verified else 'NOT verified'}",
        hang="  ")


def _check_push(repo_id: str, output: Path, private: bool) -> None:
    """Before training: a bad repo id fails now; a missing token is said now (the push at the end will fail
    without one, keeping OUT; the warning names the command that pushes it then)."""
    from ..errors import CheckpointError
    from ..hub import check_repo_id
    from ..publish.plan import hub_token

    check_repo_id(repo_id, "--push-to-hub")
    try:
        hub_token()
    except CheckpointError as exc:
        later = f"rope-extend push {output} {repo_id}" + (" --private" if private else "")
        print(f"rope-extend: warning: {exc}; training runs, and OUT will be kept for `{later}`", file=sys.stderr,
              flush=True)
