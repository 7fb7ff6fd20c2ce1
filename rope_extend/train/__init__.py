"""`rope-extend train`: long-context fine-tuning after the RoPE patch (YaRN's recipe, PoSE, LoRA+).

    from rope_extend.train import TrainSpec, train_model
    result = train_model(TrainSpec("smollm2", "out/smollm2-16k", {"method": "yarn", "factor": 2},
                                   texts=["plays.txt"], steps=100, window=2048))

A run in stages, `runner.train_model` calling each once: `prepare` (validation, SOURCE's config read once, the
run's one plan, the data tokenized: all before any model loads), `trainer` (the patched model, LoRA, the Trainer,
the resume state), `finish` (OUT written with that plan, verified, nothing trained thrown away), `evaluation`
(--eval-suite before and after). Beside them: `recipe` (TrainSpec: its options grouped by the stage that owns
them, defaults, validation), `parallelism` (how windows spread over processes: one strategy, chosen once by
`prepare`; `sequence_parallel` is its Ulysses side), `data` (documents, packing, PoSE windows), `lora` (peft,
trainable embeddings/norms, tied embeddings), `loss` (the loss in chunks), `sdpa` (which SDPA kernel training gets:
a memory-efficient one), `sharding` (FSDP / ZeRO-3 under accelerate), `progress` (what a run prints, signals),
`training_card` (the card's training section, the loss plot, the log files).
Importing this package imports no torch/transformers/peft; `train_model` does.
"""

from .recipe import TrainSpec


def train_model(spec: TrainSpec, on_progress=None):
    """Run `spec` (see `rope_extend.train.runner.train_model`)."""
    from .runner import train_model as _train

    return _train(spec, on_progress=on_progress)


__all__ = ["TrainSpec", "train_model"]
