"""The causal-LM loss in chunks of tokens: never the full-vocabulary logits of a whole window at once.

transformers' `ForCausalLMLoss` upcasts `[B, n, vocab]` logits to float32 and keeps about three such tensors alive
at its peak (the logits, `log_softmax`'s output, their gradient): for SmolLM2 (49152 tokens) at a 16k window that is
~9 GiB, more than the model, its gradients and AdamW state together. Here the model runs with its LM head seeing
only the last position (`head_input`), and the loss is summed over chunks of `chunk_tokens` positions of the
final hidden states; each chunk's `lm_head` + cross-entropy is recomputed in the backward pass
(`torch.utils.checkpoint`), so the logits of one chunk are alive at a time. The result is the same number as
`ForCausalLMLoss` (labels shifted left, -100 ignored, the sum divided by `num_items_in_batch` when the Trainer
passes it, else the mean), up to float summation order.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100
CHUNK_LOGIT_BYTES = 256 << 20  # float32 logits of one chunk (SmolLM2: 1365 positions; a 128k vocabulary: 512)


def chunk_tokens_for(vocab_size: int, budget: int = CHUNK_LOGIT_BYTES) -> int:
    """Positions per chunk so that one chunk's float32 logits take about `budget` bytes (at least 64)."""
    return max(64, budget // (4 * int(vocab_size)))


@contextlib.contextmanager
def head_input(head: torch.nn.Module):
    """Within the block, `head` (the model's LM head) records its input, the final hidden states `[B, n, H]`, in
    the yielded list and is applied to the last position only: the model's own logits cost one token."""
    seen: list[torch.Tensor] = []

    def keep_last(module, args, kwargs):
        hidden = args[0] if args else kwargs.pop("input")
        seen.append(hidden)
        return (hidden[:, -1:],), kwargs

    handle = head.register_forward_pre_hook(keep_last, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def _chunk_loss_sum(head: torch.nn.Module, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = head(hidden).float()  # upcast as transformers' loss does (bf16 logits under autocast)
    return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_loss_sum(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module,
                     chunk_tokens: int) -> torch.Tensor:
    """The summed cross-entropy of `head(hidden)` against `targets` ([B, n], the token each position predicts,
    -100 ignored: labels already shifted), chunk by chunk, each chunk recomputed in the backward pass."""
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_targets = targets.to(hidden.device).reshape(-1)
    total = hidden.new_zeros((), dtype=torch.float32)
    n = flat_targets.numel()
    recompute = torch.is_grad_enabled() and n > chunk_tokens  # one chunk: nothing to save by recomputing
    for start in range(0, n, chunk_tokens):
        piece = (head, flat_hidden[start:start + chunk_tokens], flat_targets[start:start + chunk_tokens])
        if recompute:
            total = total + checkpoint(_chunk_loss_sum, *piece, use_reentrant=False)
        else:
            total = total + _chunk_loss_sum(*piece)
    return total


def chunked_causal_lm_loss(hidden: torch.Tensor, labels: torch.Tensor, head: torch.nn.Module, chunk_tokens: int,
                           num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
    """Next-token cross-entropy of `head(hidden)` against `labels` ([B, n], -100 ignored), chunk by chunk.

    Sum over all predicted positions divided by `num_items_in_batch` if given (the Trainer's count over the whole
    accumulated batch), else by the number of positions with a label (the mean)."""
    shifted = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]  # position t predicts t + 1
    total = chunked_loss_sum(hidden, shifted, head, chunk_tokens)
    if num_items_in_batch is None:
        return total / (shifted != IGNORE_INDEX).sum().to(total.device)
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch
