"""Run-time behaviour of dynamic methods (dynamic NTK, dynamic YaRN, LongRoPE) in a patched model.

The problem (transformers #25104): a dynamic method recomputes the frequencies from the current length, so while
generating, keys already in the KV cache were rotated at an older scale than the queries that read them, and
token-by-token decoding gives different results from one forward pass over the same text. LongRoPE has the same
problem when it switches factor lists at the original length.

rope-extend's `consistent` mode (the default) fixes the scale per request: `model.generate` is wrapped so that the
scale is computed once from prompt length + max_new_tokens and held for every step. Every key and query of the
request then uses the same frequencies, so incremental logits equal the logits of one forward pass over the final
sequence, and there is nothing to recompute per step (cost: one frequency computation per request). Outside
`generate`, each forward uses its own length (a long input followed by a short one resets); manual decoding loops
hold the scale with `fixed_rope_length(model, n)`.

The `stock` mode reproduces transformers' behaviour exactly (the scale follows the longest length seen and resets
below L), including its KV-cache inconsistency.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch

MODES = ("consistent", "stock")

# (sequence length or None for the original frequencies, device) -> (inv_freq, attention factor)
ComputeFn = Callable[[int | None, torch.device], "tuple[torch.Tensor, float]"]


class DynamicRopeHook:
    """Forward pre-hook on a rotary module that sets its frequencies for the current request/sequence length.

    compute: the method at a given length (None = original frequencies); original: the threshold L;
    two_state: the method has only two states, up to L and beyond (LongRoPE), so any length > L is one key.
    """

    def __init__(self, compute: ComputeFn, original: int, slot: str | None, prefix: str, per_layer_type: bool,
                 mode: str, two_state: bool = False):
        self.compute, self.original, self.two_state = compute, int(original), two_state
        self.slot, self.prefix, self.per_layer_type, self.mode = slot, prefix, per_layer_type, mode
        self.fixed: int | None = None  # request length held by generate / fixed_rope_length
        self.current: int | None = None  # the length the buffers hold (None = original frequencies)

    def _key(self, seq_len: int) -> int | None | bool:
        """The length to compute frequencies at (None = original); False = keep what the buffers hold."""
        if self.fixed is not None:
            seq_len = self.fixed
        if self.two_state:
            return self.original + 1 if seq_len > self.original else None
        if self.mode == "stock" and self.fixed is None:
            current = self.current or self.original
            if seq_len > current:
                return seq_len
            if seq_len < self.original and current > self.original:
                return None
            return False
        return seq_len if seq_len > self.original else None

    def __call__(self, module, args, kwargs):
        position_ids = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
        if position_ids is None:
            return None
        if self.per_layer_type:
            layer_type = kwargs.get("layer_type", args[2] if len(args) > 2 else None)
            if layer_type is not None and layer_type != self.slot:
                return None
        key = self._key(int(position_ids.max()) + 1)
        if key is False or key == self.current:
            return None
        buffer = getattr(module, f"{self.prefix}inv_freq")
        inv_freq, attention = self.compute(key, buffer.device)
        with torch.no_grad():
            buffer.copy_(inv_freq.to(buffer.dtype))
        setattr(module, f"{self.prefix}attention_scaling", float(attention))
        self.current = key
        return None


def hooks_of(model) -> list[DynamicRopeHook]:
    """The dynamic hooks installed on a model's rotary modules."""
    return [
        hook
        for module in model.modules()
        for hook in module._forward_pre_hooks.values()
        if isinstance(hook, DynamicRopeHook)
    ]


@contextlib.contextmanager
def fixed_rope_length(model, length: int):
    """Hold a dynamic method's scale at `length` tokens (the final length of a manual decoding loop)."""
    hooks = hooks_of(model)
    previous = [hook.fixed for hook in hooks]
    for hook in hooks:
        hook.fixed = int(length)
    try:
        yield
    finally:
        for hook, value in zip(hooks, previous):
            hook.fixed = value


def request_length(model, args, kwargs) -> int | None:
    """Upper bound of the final sequence length of a `generate` call: prompt length + max_new_tokens."""
    inputs = kwargs.get("input_ids", args[0] if args else None)
    if inputs is None:
        inputs = kwargs.get("inputs", kwargs.get("inputs_embeds"))
    if not isinstance(inputs, torch.Tensor):
        return None
    prompt = inputs.shape[1]
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    max_new = kwargs.get("max_new_tokens", getattr(config, "max_new_tokens", None) if config is not None else None)
    if max_new is not None:
        return prompt + int(max_new)
    max_length = kwargs.get("max_length", getattr(config, "max_length", None) if config is not None else None)
    return int(max_length) if max_length is not None else None


def wrap_generate(model) -> None:
    """Install the per-request scale on `model.generate` (instance attribute; removed by `unwrap_generate`)."""
    if "generate" in model.__dict__:
        return
    original = type(model).generate

    @functools.wraps(original)
    def generate(*args, **kwargs):
        length = request_length(model, args, kwargs)
        if length is None:
            return original(model, *args, **kwargs)
        with fixed_rope_length(model, length):
            return original(model, *args, **kwargs)

    model.generate = generate


def unwrap_generate(model) -> None:
    model.__dict__.pop("generate", None)
