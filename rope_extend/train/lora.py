"""LoRA for context extension: peft adapters on every linear layer but `lm_head`, plus trainable embeddings and
norms (LongLoRA's "LoRA+"), with tied embeddings kept tied through training, merging and reloading.

peft's `modules_to_save` copies a module; a tied embedding copied without `ensure_weight_tying=True` comes apart
from `lm_head`, and after merging `from_pretrained` re-ties them to one of the two (peft #2777, #2864). Here the
embedding goes through `modules_to_save` with `ensure_weight_tying=True`, and `check_tied` asserts the merged
model still shares one tensor.
"""

from __future__ import annotations

from torch import nn

NORM_SUFFIX = "norm"  # matches every RMSNorm/LayerNorm module name of the supported families (LongLoRA's "norm")


def embedding_and_norm_names(model: nn.Module) -> list[str]:
    """Suffixes for `modules_to_save`: the input embedding's name and every module whose name ends in 'norm'."""
    embedding = model.get_input_embeddings()
    names = [n for n, m in model.named_modules() if m is embedding]
    norms = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                    if n.rsplit(".", 1)[-1].endswith(NORM_SUFFIX) and not list(m.children())})
    return [names[0].rsplit(".", 1)[-1]] + norms


def is_tied(model: nn.Module) -> bool:
    out = model.get_output_embeddings()
    return out is not None and out.weight is model.get_input_embeddings().weight


def wrap(model: nn.Module, r: int, alpha: int, dropout: float, embeddings_and_norms: bool, seed: int):
    """The peft model to train (the base model is changed in place by peft). The adapters' random initialisation
    is drawn from `seed`: the same in every process and for any process count (before, it came from whatever the
    process's generator had reached, which launching 2 processes changes)."""
    import torch
    from peft import LoraConfig, get_peft_model

    tied = bool(getattr(model.config, "tie_word_embeddings", False)) and is_tied(model)
    extra = embedding_and_norm_names(model) if embeddings_and_norms else None
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules="all-linear",  # peft excludes the output layer (lm_head)
        modules_to_save=extra,
        ensure_weight_tying=tied and embeddings_and_norms,
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, config)


def trainable_names(model: nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


def merge(peft_model) -> nn.Module:
    """Adapters merged into the base weights; the plain transformers model, with its rope-extend patch intact."""
    merged = peft_model.merge_and_unload()
    tie = getattr(merged, "tie_weights", None)
    if bool(getattr(merged.config, "tie_word_embeddings", False)) and tie is not None:
        tie()
    check_tied(merged)
    return merged


def check_tied(model: nn.Module) -> None:
    if bool(getattr(model.config, "tie_word_embeddings", False)) and not is_tied(model):
        raise RuntimeError("the merged model's input and output embeddings are no longer one tensor although its "
                           "config ties them; the saved checkpoint would reload differently (peft #2777)")
