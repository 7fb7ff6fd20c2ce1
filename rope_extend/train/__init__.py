"""`rope-extend train`: long-context fine-tuning after the RoPE patch (YaRN's recipe, PoSE, LoRA+).

    from rope_extend.train import TrainSpec, train_model
    result = train_model(TrainSpec("smollm2", "out/smollm2-16k", {"method": "yarn", "factor": 2},
                                   texts=["plays.txt"], steps=100, window=2048))

Modules: `data` (documents, packing, PoSE windows), `recipe` (TrainSpec, defaults, validation), `lora` (peft,
trainable embeddings/norms, tied embeddings), `runner` (Trainer, resume, output), `card` (model card, loss plot).
Importing this package imports no torch/transformers/peft; `train_model` does.
"""

from .recipe import TrainSpec


def train_model(spec: TrainSpec, on_progress=None):
    """Run `spec` (see `rope_extend.train.runner.train_model`)."""
    from .runner import train_model as _train

    return _train(spec, on_progress=on_progress)


__all__ = ["TrainSpec", "train_model"]
