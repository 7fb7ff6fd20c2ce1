"""How a patched model's attention reaches `kernels.remapped_attention`, and how that is undone.

Three pieces, installed by `install(model, plan, mapping)` and removed by the handles it returns:

1. A dispatcher for "eager" and "sdpa" in transformers' attention-function registry (`compat.attention_functions`).
   For a module without an attention context it calls the function transformers would have called, with the same
   arguments, so unpatched models (and patched models after `unpatch_model`) are untouched. For a patched module
   whose every distance is below the method's window (short prompts) it does the same: the original model, exactly.
2. A forward pre-hook on each patched attention module that records the position of every key of its layer. The
   attention function receives keys already rotated by the model (and the KV cache holds rotated keys), so the
   kernel re-rotates them by the mapped shift and needs each key's position. The positions are stored on the KV
   cache object itself (`cache.__dict__`, one tensor per layer), so they follow the cache when it is copied
   (a reused prefix), cropped (only the first `past` positions are read), or extended piece by piece; a cache that
   arrives without them (filled before patching) is taken as contiguous positions ending before the new tokens.
   Next to them, per layer, the keys the kernel moved by the map's key shift (`kernels.moved_keys`), so a decoding
   step rotates only its new key. They are reused only while the cache still holds the very key tensor they were
   computed from (`compat.cache_layer_keys`): a copied, cropped, reordered (beam search) or offloaded cache holds a
   new tensor, and they are recomputed.
3. The context on the module: the method's map, the original inverse frequencies of its RoPE slot, log-n.

Every other attention implementation (flash, flex, paged) is refused at patch time in one line that says to load
the model with `attn_implementation="sdpa"`: the method computes attention itself (on CUDA through FlexAttention,
`passes.py`), so a flash- or flex-loaded model would gain nothing from being patched in place.
"""

from __future__ import annotations

import inspect
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import compat
from ..errors import UnsupportedModelError
from .kernels import remapped_attention

CONTEXT = "_rope_extend_attention"
POSITIONS = "_rope_extend_positions"
MOVED = "_rope_extend_moved_keys"
SUPPORTED = ("eager", "sdpa")
_LIVE: weakref.WeakSet = weakref.WeakSet()  # patched attention modules; the dispatchers leave when it empties
_SAVED: dict[str, Any] = {}  # implementation -> what the registry held before (None = nothing local)


@dataclass
class AttentionContext:
    mapping: Any
    inv_freq: torch.Tensor
    log_n_original: int | None
    memo: dict  # key-rotation tables by position, shared by the layers of one RoPE slot (see kernels.key_rotation)
    forward: dict = field(default_factory=dict)  # {"derived": True} while the model derives its own positions


@dataclass(frozen=True)
class Span:
    """Positions known on the host without reading a tensor: first .. first + count - 1, every batch row alike."""

    first: int
    count: int


def _original_function(impl: str, module):
    if impl in _SAVED and _SAVED[impl] is not None:
        return _SAVED[impl]
    if impl == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    return compat.attention_functions().global_function(impl)


def _dispatcher(impl: str):
    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        original = _original_function(impl, module)
        context = module.__dict__.get(CONTEXT)
        if context is None:
            return original(module, query, key, value, attention_mask, *args, **kwargs)
        q_pos, k_pos, store, span = module.__dict__.pop(POSITIONS, (None, None, None, None))
        n_q, n_k = query.shape[2], key.shape[2]
        if span is not None and (span.count > n_k or span.count < n_q):
            span = None
        if span is None and (q_pos is None or k_pos is None or q_pos.shape[-1] != n_q or k_pos.shape[-1] > n_k):
            span, q_pos, k_pos, store = Span(0, n_k), None, None, None
        if span is not None:  # positions known as Python ints: nothing read from the device (decoding steps)
            last = span.first + span.count - 1
            long_enough = context.log_n_original and last >= context.log_n_original
            by_span = getattr(context.mapping, "is_identity_span", None)  # a map without it: its tensor test
            identity = by_span(span.first, last) if by_span is not None else context.mapping.is_identity(
                *(torch.arange(span.first, last + 1, device=query.device)[None],) * 2)
        else:
            long_enough = context.log_n_original and int(q_pos.max()) >= context.log_n_original
            identity = context.mapping.is_identity(q_pos, k_pos)
        if identity and not long_enough:
            return original(module, query, key, value, attention_mask, *args, **kwargs)
        scaling = kwargs.get("scaling", args[1] if len(args) > 1 else None)
        if scaling is None:
            scaling = getattr(module, "scaling", query.shape[-1] ** -0.5)
        output = remapped_attention(
            query, key, value, q_pos, k_pos, attention_mask, float(scaling), context.mapping,
            context.inv_freq.to(query.device), softcap=kwargs.get("softcap"),
            log_n_original=context.log_n_original, memo=context.memo, key_store=store,
            span=None if span is None else (span.first, span.count),
        )
        return output, None

    attention.__rope_extend__ = impl
    return attention


def _install_dispatchers() -> None:
    registry = compat.attention_functions()
    for impl in SUPPORTED:
        if getattr(registry.get_local(impl), "__rope_extend__", None) == impl:
            continue
        _SAVED[impl] = registry.get_local(impl)
        registry.set_local(impl, _dispatcher(impl))


def _remove_dispatchers() -> None:
    registry = compat.attention_functions()
    for impl in SUPPORTED:
        if getattr(registry.get_local(impl), "__rope_extend__", None) == impl:
            registry.set_local(impl, _SAVED.get(impl))
        _SAVED.pop(impl, None)


def _cache_of(kwargs: dict):
    for name in ("cache", "past_key_values", "past_key_value"):
        if kwargs.get(name) is not None:
            return kwargs[name]
    return None


def record_positions(module, args, kwargs):
    """Forward pre-hook: the positions of this call's queries and of every key of this layer, on the module.

    While the model derives its own positions (`note_derived_positions`: the caller passed none, so they are the
    cache's length onwards) and this layer's keys so far sit at 0 .. past - 1, they are a `Span` of Python ints
    and no tensor is read or built: a decoding step is then free of host synchronisation. Otherwise, tensors
    (query positions [B, q], key positions [B, k]) from the position ids the module receives."""
    hidden = kwargs.get("hidden_states", args[0] if args else None)
    if hidden is None:
        return None
    batch, n_q = hidden.shape[0], hidden.shape[1]
    cache = _cache_of(kwargs)
    layer = getattr(module, "layer_idx", 0)
    past = int(cache.get_seq_length(layer)) if cache is not None else 0
    context = module.__dict__.get(CONTEXT)
    derived = context is not None and context.forward.get("derived", False)
    store = cache.__dict__.setdefault(POSITIONS, {}) if cache is not None else {}
    previous = store.get(layer)
    if derived and (previous is None or (isinstance(previous, Span) and previous.first == 0
                                          and previous.count >= past)):
        span = Span(0, past + n_q)
        if cache is None:
            module.__dict__[POSITIONS] = (None, None, None, span)
            return None
        store[layer] = span
        module.__dict__[POSITIONS] = (None, None, _moved_store(cache, layer, past), span)
        return None
    positions = kwargs.get("position_ids")
    if positions is None:
        cache_position = kwargs.get("cache_position")
        positions = (cache_position if cache_position is not None
                     else torch.arange(past, past + n_q, device=hidden.device))[None]
    if positions.dim() != 2:
        raise UnsupportedModelError(
            f"{type(module).__name__} receives {positions.dim()}-D position ids (multimodal RoPE sections); "
            "self-extend and dual-chunk remap one position per token"
        )
    positions = positions.to(hidden.device).expand(batch, n_q)
    if cache is None:
        module.__dict__[POSITIONS] = (positions, positions, None, None)
        return None
    if isinstance(previous, Span):
        previous = torch.arange(previous.first, previous.first + previous.count, device=positions.device)[None]
    if previous is not None and previous.shape[0] in (1, batch) and previous.shape[1] >= past:
        before = previous[:, :past].to(positions.device).expand(batch, past)
    else:  # a cache filled before patching: contiguous positions ending before the new tokens
        before = positions[:, :1] - past + torch.arange(past, device=positions.device)[None]
    keys = torch.cat((before, positions), dim=1)
    store[layer] = keys
    module.__dict__[POSITIONS] = (positions, keys, _moved_store(cache, layer, past), None)
    return None


def _moved_store(cache, layer: int, past: int) -> dict:
    """This layer's moved keys on the cache (`kernels.moved_keys`), emptied when the cache no longer holds the key
    tensor they were computed from, cut to `past` keys when the cache was cut (a static cache reset)."""
    moved = cache.__dict__.setdefault(MOVED, {}).setdefault(layer, {})
    if moved.get("keys") is None or compat.cache_layer_keys(cache, layer) is not moved["keys"]:
        moved.clear()
    elif moved["count"] > past:
        moved["count"] = past
    return moved


def _positions_module(model, modules):
    """The innermost module that holds every patched attention module and takes `position_ids` and
    `inputs_embeds`: the one that derives the positions when the caller passes none (LlamaModel and the like; a
    decoder layer receives them), or None."""
    found = None
    for _, candidate in model.named_modules():
        try:
            parameters = inspect.signature(candidate.forward).parameters
        except (TypeError, ValueError):
            continue
        if "position_ids" not in parameters or "inputs_embeds" not in parameters:  # not a decoder layer
            continue
        inside = {id(m) for m in candidate.modules()}
        if all(id(m) in inside for m in modules):
            found = candidate
    return found


class _DerivedPositions:
    """Pre- and post-hook on the module that derives positions: notes, for the attention hooks of one forward,
    whether the caller passed neither `position_ids` nor `cache_position` (the model then uses the cache's length
    onwards, transformers' rule), so the positions are known without reading a tensor."""

    def __init__(self, module, state: dict):
        self.state = state
        self.signature = inspect.signature(module.forward)
        self.handles = [module.register_forward_pre_hook(self.before, with_kwargs=True),
                        module.register_forward_hook(self.after, always_call=True)]

    def before(self, module, args, kwargs):
        try:
            given = self.signature.bind_partial(*args, **kwargs).arguments
        except TypeError:
            given = {"position_ids": True}
        self.state["derived"] = given.get("position_ids") is None and given.get("cache_position") is None \
            and kwargs.get("cache_position") is None
        return None

    def after(self, *_):
        self.state.pop("derived", None)
        return None

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.state.pop("derived", None)


class _Handle:
    def __init__(self, module, hook):
        self.module, self.hook = module, hook

    def remove(self) -> None:
        self.hook.remove()
        self.module.__dict__.pop(CONTEXT, None)
        self.module.__dict__.pop(POSITIONS, None)
        _LIVE.discard(self.module)
        if not len(_LIVE):
            _remove_dispatchers()


def attention_modules(model) -> list[tuple[str, Any]]:
    """(name, module) of every self-attention module with a layer index (q/k/v projections of any layout)."""
    found = []
    for name, module in model.named_modules():
        if not hasattr(module, "layer_idx") or not type(module).__name__.endswith("Attention"):
            continue
        if any(hasattr(module, attr) for attr in ("q_proj", "qkv_proj", "query_key_value", "Wqkv")):
            found.append((name, module))
    return found


def _layer_slot(module, config, targets) -> str | None | bool:
    """The RoPE slot of the module's layer, or False when the layer is not a target."""
    layer_types = getattr(config, "layer_types", None)
    if compat.FLAT in targets:
        return compat.FLAT
    layer_type = layer_types[module.layer_idx] if layer_types else "full_attention"
    return layer_type if layer_type in targets else False


def install(model, plan, mapping, log_n: bool) -> list[_Handle]:
    """Put the method's attention on every target layer of `model`; return handles that undo it."""
    config = compat.text_config(model.config)
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if impl not in SUPPORTED:
        raise UnsupportedModelError(
            f"{plan.spec.method} runs with attn_implementation 'eager' or 'sdpa'; this model uses {impl!r}, whose "
            "kernel cannot remap positions per key (rope-extend computes this attention itself, with FlexAttention "
            "on CUDA). Load it with attn_implementation='sdpa' (or 'eager')"
        )
    if impl == "eager" and not compat.EAGER_THROUGH_ATTENTION_REGISTRY:
        raise UnsupportedModelError(
            f"transformers {compat.TRANSFORMERS_VERSION} calls its eager attention directly, so {plan.spec.method} "
            "cannot reach it; load the model with attn_implementation='sdpa'"
        )
    modules = attention_modules(model)
    if not modules:
        raise UnsupportedModelError(
            f"no attention module with q/k/v projections and a layer index found in {type(model).__name__}; "
            f"{plan.spec.method} acts on transformers' attention modules"
        )
    handles: list = []
    original = plan.spec.original_max_position_embeddings if log_n else None
    memos: dict = {}
    forward: dict = {}  # shared by every patched module: whether this forward's positions are the derived ones
    for name, module in modules:
        slot = _layer_slot(module, config, plan.targets)
        if slot is False:
            continue
        window = getattr(module, "sliding_window", None)
        if window:
            for handle in handles:
                handle.remove()
            raise UnsupportedModelError(
                f"{name} uses sliding-window attention ({window} tokens): its cache keeps only the last keys, so "
                f"{plan.spec.method} cannot remap distances there; disable the sliding window or scale only the "
                "full-attention layer type"
            )
        inv_freq, _ = plan.compute(slot)
        module.__dict__[CONTEXT] = AttentionContext(mapping, inv_freq.float(), original, memos.setdefault(slot, {}),
                                                    forward)
        _LIVE.add(module)
        handles.append(_Handle(module, module.register_forward_pre_hook(record_positions, with_kwargs=True)))
    if not handles:
        raise UnsupportedModelError(f"no attention layer of {type(model).__name__} serves layer types "
                                    f"{list(plan.targets)}")
    positions_module = _positions_module(model, [handle.module for handle in handles])
    if positions_module is not None:
        handles.append(_DerivedPositions(positions_module, forward))
    _install_dispatchers()
    return handles
