"""Toy checkpoints on disk for exercising eval's pipeline without downloads: a tiny random LLaMA with a tiny BPE
tokenizer (built offline in about a second), and the demo model cut to a short window.

Used by the session fixtures of the tests (tests/conftest.py), tools/compat_checks.py and tools/run_vllm_engines.py.
Numbers they produce are meaningless; only the plumbing is real. (tests/tiny.py is another thing: the test suite's
in-memory models of every supported architecture.)
"""

from __future__ import annotations

import os
from pathlib import Path


def tiny_tokenizer(vocab_size: int = 1000):
    """Byte-level BPE trained on the stdlib docs prose (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from .probes import PASSKEY_FILLER, PASSKEY_NEEDLE, PASSKEY_QUESTION
    from .texts import pydoc_topics_text

    text = pydoc_topics_text()[:200_000]
    extra = " ".join(PASSKEY_FILLER) + " " + PASSKEY_NEEDLE + " " + PASSKEY_QUESTION
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([extra] * 20 + text.split("\n\n"), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )


def tiny_llama(vocab_size: int = 1000, max_position_embeddings: int = 256, seed: int = 0, **overrides):
    """Random ``LlamaForCausalLM``: hidden 64, 4 heads, 2 layers."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": max_position_embeddings,
        "rope_theta": 10000.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
        "tie_word_embeddings": False,
    }
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    return model.eval()


def tiny_checkpoint(path: str | os.PathLike, vocab_size: int = 1000, max_position_embeddings: int = 256) -> Path:
    """Save a tiny model + tokenizer to *path* (reused if already there)."""
    path = Path(path)
    if (path / "config.json").is_file() and (path / "tokenizer.json").is_file():
        return path
    tok = tiny_tokenizer(vocab_size)
    model = tiny_llama(len(tok), max_position_embeddings)
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def short_window_demo(path: str | os.PathLike, layers: int = 2, window: int = 256, source=None) -> Path:
    """The demo model (SmolLM2-135M) cut to its first `layers` decoder layers, with a `window`-token context, saved to
    *path* with its tokenizer (reused if already there; ~140 MB for 2 layers).

    Unlike a random model, its log-probabilities are sharp, so a RoPE that differs moves them measurably (by 0.1 and
    more where float32 kernels differ by ~1e-5), and "beyond the window" starts after a few hundred tokens: what
    the real-engine tests serve. Its RoPE is the demo's (head_dim 64, base 1e5), its window is not what it was
    trained at (8192): numbers from it are for parity, not quality."""
    import json
    import shutil

    from safetensors import safe_open
    from safetensors.torch import save_file

    path = Path(path)
    if (path / "config.json").is_file() and (path / "model.safetensors").is_file():
        return path
    if source is None:
        from ..demo_model import smollm2_path

        source = smollm2_path()
    source = Path(source)
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    keep = {}
    with safe_open(str(source / "model.safetensors"), framework="pt") as f:
        for key in f.keys():
            if not key.startswith("model.layers.") or int(key.split(".")[2]) < layers:
                keep[key] = f.get_tensor(key)
    save_file(keep, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config.update(num_hidden_layers=layers, max_position_embeddings=window)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        if (source / name).is_file():
            shutil.copy(source / name, tmp / name)
    tmp.rename(path)
    return path
