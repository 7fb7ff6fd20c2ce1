"""Perplexity by context length, with per-position loss buckets.

The loss is computed from the decoder's final hidden states chunk by chunk (``lm_head`` +
cross-entropy on ``chunk_size`` positions at a time), so a 16k-token sequence never
materialises a ``L x vocab`` fp32 logits tensor.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F


def _decoder(model):
    dec = model.get_decoder() if hasattr(model, "get_decoder") else None
    if dec is None or dec is model:
        dec = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    if dec is None:
        raise TypeError(f"cannot find the decoder of {type(model).__name__}")
    return dec


def _logits(model, hidden: torch.Tensor) -> torch.Tensor:
    logits = model.get_output_embeddings()(hidden).float()
    cfg = model.config
    scale = getattr(cfg, "logits_scaling", None)  # granite
    if scale:
        logits = logits / scale
    cap = getattr(cfg, "final_logit_softcapping", None)  # gemma2
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


@torch.inference_mode()
def token_losses(model, input_ids: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """Next-token cross-entropy for every position: shape ``(L-1,)`` float32 on CPU.

    ``input_ids`` is ``(L,)`` or ``(1, L)``.  Entry ``i`` is the loss of predicting token
    ``i+1`` from tokens ``0..i``.
    """
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.shape[0] != 1:
        raise ValueError("token_losses expects a single sequence")
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)
    hidden = _decoder(model)(input_ids=input_ids, use_cache=False).last_hidden_state
    head_device = model.get_output_embeddings().weight.device
    n = input_ids.shape[1] - 1
    out = []
    for s in range(0, n, chunk_size):
        e = min(s + chunk_size, n)
        logits = _logits(model, hidden[0, s:e].to(head_device))
        target = input_ids[0, s + 1 : e + 1].to(head_device)
        out.append(F.cross_entropy(logits, target, reduction="none").float().cpu())
    return torch.cat(out) if out else torch.zeros(0)


@torch.inference_mode()
def token_losses_unchunked(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Reference implementation through the full logits (for tests / small inputs)."""
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)
    logits = model(input_ids=input_ids, use_cache=False).logits.float()
    return F.cross_entropy(logits[0, :-1], input_ids[0, 1:], reduction="none").cpu()


def bucket_losses(losses: torch.Tensor, bucket_size: int = 1024, original_length: int | None = None) -> list[dict]:
    """Mean loss per position bucket ``[start, end)`` (position = index of the predicted token)."""
    buckets = []
    n = losses.numel()
    # losses[i] predicts token i+1
    positions = torch.arange(1, n + 1)
    edges = list(range(0, n + 1, bucket_size))
    if edges[-1] < n + 1:
        edges.append(n + 1)
    if original_length and 0 < original_length < n + 1 and original_length not in edges:
        edges = sorted(set(edges + [original_length]))
    for a, b in itertools.pairwise(edges):
        mask = (positions >= a) & (positions < b)
        if mask.any():
            buckets.append({"start": a, "end": b, "loss": float(losses[mask].mean()), "n": int(mask.sum())})
    return buckets


def perplexity_metrics(
    losses: torch.Tensor,
    *,
    original_length: int | None = None,
    bucket_size: int = 1024,
    block_size: int = 128,
) -> dict:
    """Mean loss, perplexity with its 95 % block-bootstrap interval, and loss by position, from token losses.

    ``losses`` are the ``L - 1`` next-token losses of an ``L``-token sequence. The interval resamples contiguous
    blocks of ``block_size`` losses (see :mod:`rope_extend.eval.stats` for why); the block means are kept in
    the record so paired differences between variants can be computed later. A sequence of one block has no
    interval (no ``loss_ci`` / ``ppl_ci``; ``ci`` says ``n = 1: no interval``).
    """
    from .stats import NO_INTERVAL, RESAMPLES, block_means, bootstrap_mean

    length = losses.numel() + 1
    means, sizes = block_means(losses.tolist(), block_size)
    mean, lo, hi = bootstrap_mean(means, sizes)  # the mean and an interval that holds it (float64)
    res = {"length": length, "loss": mean, "ppl": math.exp(min(mean, 50.0))}
    if lo is None:  # one block: nothing to resample
        res["ci"] = f"{NO_INTERVAL} (one {block_size}-token block)"
    else:
        res |= {"loss_ci": [lo, hi], "ppl_ci": [math.exp(min(lo, 50.0)), math.exp(min(hi, 50.0))],
                "ci": f"95% percentile bootstrap over {len(means)} contiguous {block_size}-token blocks, {RESAMPLES} "
                      "resamples"}
    res |= {"block_size": block_size, "block_losses": means,
            "buckets": bucket_losses(losses, bucket_size, original_length)}
    if original_length:
        pos = torch.arange(1, losses.numel() + 1)
        inside, beyond = losses[pos < original_length], losses[pos >= original_length]
        res["loss_within_original"] = float(inside.mean()) if inside.numel() else None
        res["loss_beyond_original"] = float(beyond.mean()) if beyond.numel() else None
    return res


def perplexity_at_length(
    model,
    token_ids: torch.Tensor,
    length: int,
    *,
    original_length: int | None = None,
    bucket_size: int = 1024,
    chunk_size: int = 1024,
    block_size: int = 128,
    start: int = 0,
) -> dict:
    """Perplexity of the first *length* tokens of ``token_ids[start:]`` as one sequence."""
    return perplexity_at_lengths(
        model, token_ids, [length], original_length=original_length, bucket_size=bucket_size,
        chunk_size=chunk_size, block_size=block_size, start=start,
    )[length]


def perplexity_at_lengths(
    model,
    token_ids: torch.Tensor,
    lengths: list[int],
    *,
    original_length: int | None = None,
    bucket_size: int = 1024,
    chunk_size: int = 1024,
    block_size: int = 128,
    start: int = 0,
) -> dict[int, dict]:
    """Perplexity of the first ``L`` tokens for every ``L`` in *lengths*, from ONE forward at the longest.

    Exact for a causal model whose positional encoding does not depend on the sequence length (static RoPE
    scaling): the loss at position ``i`` only sees tokens ``0..i``. Dynamic methods rescale with the length, so
    they must call this once per length.
    """
    ids = text_window(token_ids, max(lengths), start)
    losses = token_losses(model, ids, chunk_size=chunk_size)
    return perplexity_from_losses(losses, lengths, original_length=original_length, bucket_size=bucket_size,
                                  block_size=block_size)


def text_window(token_ids: torch.Tensor, length: int, start: int = 0) -> torch.Tensor:
    """``token_ids[start : start + length]``, or ValueError when the text is shorter."""
    token_ids = token_ids.reshape(-1)
    if start + length > token_ids.numel():
        raise ValueError(f"text has {token_ids.numel()} tokens; cannot evaluate {length} tokens from offset {start}")
    return token_ids[start : start + length]


def perplexity_from_losses(losses: torch.Tensor, lengths: list[int], *, original_length: int | None = None,
                           bucket_size: int = 1024, block_size: int = 128) -> dict[int, dict]:
    """`perplexity_metrics` of the first ``L`` tokens for every ``L`` in *lengths*, from the next-token losses of
    the longest (from any engine: a causal model's loss at position ``i`` sees tokens ``0..i`` only)."""
    return {
        L: perplexity_metrics(losses[: L - 1], original_length=original_length, bucket_size=bucket_size,
                              block_size=block_size)
        for L in lengths
    }


def special_prefix(tokenizer) -> list[int]:
    """Tokens the tokenizer adds in front of any text (e.g. ``[BOS]`` for LLaMA, ``[]`` for SmolLM2)."""
    ids = list(tokenizer("", add_special_tokens=True)["input_ids"])
    eos = getattr(tokenizer, "eos_token_id", None)
    # Some tokenizers append EOS: keep only the leading special tokens.
    return [i for i in ids if i != eos] if len(ids) > 1 else ids


def tokenize_text(tokenizer, text: str) -> torch.Tensor:
    """Token ids of *text* (with the tokenizer's leading special tokens, if any)."""
    ids = special_prefix(tokenizer) + list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return torch.tensor(ids, dtype=torch.long)
