"""Which attention kernel a training run gets, and the one swap that keeps it memory-efficient.

Training calls transformers' "sdpa" attention with no mask tensor (the all-ones 2-D mask of every sample lets
transformers pass `is_causal=True` instead; PoSE needs that explicit mask, see `data.WindowDataset`). Which of
torch's SDPA kernels then runs depends on the device and the compute dtype, and with grouped-query attention on
`enable_gqa`, which transformers sets whenever there is no mask:

- CPU, every dtype: the flash kernel for CPU, GQA included (checked by `tests/test_train_memory.py`).
- CUDA, bfloat16 / float16: flash, GQA included.
- CUDA, float32: flash has no float32, and the memory-efficient kernel takes float32 but (in the torch releases
  this was written against) not `enable_gqa`, so torch falls back to the math kernel, which materialises a
  window x window score matrix per head and layer (136 GiB at a 16k window on SmolLM2, issue 36). The swap here,
  `expanded_kv`, repeats the key/value heads before SDPA (linear memory: window x heads x head_dim) so the
  memory-efficient kernel takes the call.

`choose(...)` asks torch's own dispatcher (`torch._fused_sdp_choice`, what `scaled_dot_product_attention` calls)
for the kernel of the model's head shapes on the device, first as transformers calls it, then with K/V expanded,
and refuses the run when both would take the math kernel. Not run on a GPU when it was written: the CUDA branch
follows torch's `sdp_utils.cpp`; on a GPU the progress line says which kernel was found.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .. import compat

SDPA = "sdpa"
EXPANDED = "sdpa with K/V heads expanded"
_KERNELS = {0: "math", 1: "flash", 2: "memory-efficient", 3: "cuDNN", 4: "overrideable"}
_PROBE_TOKENS = 256


@dataclass
class AttentionChoice:
    how: str  # SDPA or EXPANDED
    kernel: str  # torch's kernel name ("flash", "memory-efficient", ...) or "unknown"

    def describe(self) -> str:
        return f"{self.how} ({self.kernel} kernel)"


def _heads(config) -> tuple[int, int, int]:
    text = compat.text_config(config)
    heads = text.num_attention_heads
    kv = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return heads, kv, head_dim


def _kernel(query, key, value, gqa: bool) -> str:
    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None:  # a private function: if a torch release drops it, say so rather than guess
        return "unknown"
    try:
        index = int(choose(query, key, value, None, 0.0, True, enable_gqa=gqa))
    except (RuntimeError, TypeError):
        return "unknown"
    return _KERNELS.get(index, "unknown")


def choose(config, device: torch.device | str, dtype: torch.dtype, window: int) -> AttentionChoice:
    """The attention path for training `config` at `window` in `dtype` (the autocast compute dtype) on `device`;
    raises ValueError when torch has only the math kernel for it (naming the dtype and what to use instead)."""
    heads, kv, head_dim = _heads(config)
    device = torch.device(device)
    q = torch.zeros(1, heads, _PROBE_TOKENS, head_dim, dtype=dtype, device=device)
    k = torch.zeros(1, kv, _PROBE_TOKENS, head_dim, dtype=dtype, device=device)
    native = _kernel(q, k, k, gqa=kv != heads)
    if native != "math" or kv == heads:
        if native == "math":
            raise _no_kernel(dtype, device, window, heads)
        return AttentionChoice(SDPA, native)
    expanded = torch.zeros(1, heads, _PROBE_TOKENS, head_dim, dtype=dtype, device=device)
    kernel = _kernel(q, expanded, expanded, gqa=False)
    if kernel == "math":
        raise _no_kernel(dtype, device, window, heads)
    return AttentionChoice(EXPANDED, kernel)


def _no_kernel(dtype, device, window: int, heads: int) -> ValueError:
    per_layer = heads * window * window * 4 / 2**30
    return ValueError(
        f"--dtype {str(dtype).replace('torch.', '')}: torch has no memory-efficient attention kernel for it on "
        f"{device} (only the math kernel, which stores a {window} x {window} score matrix per head: "
        f"{per_layer:.1f} GiB per layer at --window {window}); use --dtype bfloat16 (or float16)")


def expanded_kv_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                          is_causal=None, **kwargs):
    """transformers' sdpa attention with the key/value heads repeated first (no `enable_gqa`): the call shape
    CUDA's memory-efficient kernel accepts. Same arguments and output layout as `sdpa_attention_forward`."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(query.shape[2] > 1 and attention_mask is None and causal)
    output = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                              dropout_p=dropout, scale=scaling, is_causal=causal)
    return output.transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def installed(choice: AttentionChoice):
    """Within the block, transformers' "sdpa" entry is `expanded_kv_attention` when `choice` says so (the model's
    config keeps "sdpa": nothing of this reaches a saved checkpoint); the previous entry comes back after."""
    if choice.how != EXPANDED:
        yield
        return
    registry = compat.attention_functions()
    previous = registry.get_local(SDPA)
    registry.set_local(SDPA, expanded_kv_attention)
    try:
        yield
    finally:
        registry.set_local(SDPA, previous)
