"""How a patched model's attention reaches `kernels.remapped_attention`, and how that is undone: the same for every
attention-level method (self-extend, dual chunk attention, STRING), whose position map it carries.

Four pieces, installed by `install(model, plan, mapping)` and removed by the handles it returns:

1. A dispatcher for "eager" and "sdpa" in transformers' attention-function registry (`compat.attention_functions`).
   For a module without an attention context it calls the function transformers would have called, with the same
   arguments, so unpatched models (and patched models after `unpatch_model`) are untouched. For a patched module
   whose every distance maps to itself (`PositionMap.is_identity`: short prompts) it does the same: the original
   model, exactly.
2. A forward pre-hook on each patched attention module that records the position of every key of its layer
   (`positions.Positions`). The attention function receives keys already rotated by the model (and the KV cache
   holds rotated keys), so the kernel re-rotates them by the mapped shift and needs each key's position. The
   positions are stored on the KV cache object itself (`cache.__dict__`, one per layer), so they follow the cache
   when it is copied (a reused prefix), cropped (only the first `past` positions are read), or extended piece by
   piece; a cache that arrives without them (filled before patching) is taken as contiguous positions ending
   before the new tokens. Next to them, per layer, the keys the kernel moved by the map's key shift
   (`kernels.moved_keys`), so a decoding step rotates only its new key. They are reused only while the cache still
   holds the very key tensor they were computed from (`compat.cache_layer_keys`): a copied, cropped, reordered
   (beam search) or offloaded cache holds a new tensor, and they are recomputed.
3. Where the positions are known without reading a tensor, so that a decoding step synchronises nothing with the
   device: while the model derives its own positions (`_DerivedPositions`: the caller passed no position ids, so
   they continue the cache), and inside `generate()` (`_Generating`: generate numbers the tokens of each row from
   its attention mask, so after its first forward every step continues each row; that first forward reads the
   positions once to learn each row's left padding). A left-padded batch then runs row by row on each row's real
   keys (one call per row, no mask), as contiguous positions.
4. The context on the module: the method's map, the original inverse frequencies of its RoPE slot, log-n.

Every other attention implementation (flash, flex, paged) is refused at patch time in one line that says to load
the model with `attn_implementation="sdpa"`: the method computes attention itself (on CUDA through FlexAttention,
`passes.py`), so a flash- or flex-loaded model would gain nothing from being patched in place.
"""

from __future__ import annotations

import functools
import inspect
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import compat
from ..errors import UnsupportedModelError
from .kernels import remapped_attention
from .positions import Positions

CONTEXT = "_rope_extend_attention"
POSITIONS = "_rope_extend_positions"
MOVED = "_rope_extend_moved_keys"
SUPPORTED = ("eager", "sdpa")
_LIVE: weakref.WeakSet = weakref.WeakSet()  # patched attention modules; the dispatchers leave when it empties
_SAVED: dict[str, Any] = {}  # implementation -> what the registry held before (None = nothing local)


@dataclass
class AttentionContext:
    mapping: Any  # the method's `maps.PositionMap`
    inv_freq: torch.Tensor
    log_n_original: int | None
    memo: dict  # key-rotation tables by position, shared by the layers of one RoPE slot (see kernels.key_rotation)
    # shared by every patched module of the model: {"derived": True} while the model derives its own positions,
    # {"generating": True} inside generate()
    forward: dict = field(default_factory=dict)


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
        positions, store = module.__dict__.pop(POSITIONS, (None, None))
        n_q, n_k = query.shape[2], key.shape[2]
        if positions is None or positions.count > n_k or positions.count < n_q:
            positions, store = Positions(n_k), None
        first, last = positions.bounds()  # Python ints of host-known positions: nothing read from the device
        long_enough = context.log_n_original and last >= context.log_n_original
        if context.mapping.is_identity(first, last) and not long_enough:
            return original(module, query, key, value, attention_mask, *args, **kwargs)
        scaling = kwargs.get("scaling", args[1] if len(args) > 1 else None)
        if scaling is None:
            scaling = getattr(module, "scaling", query.shape[-1] ** -0.5)
        call = dict(scaling=float(scaling), mapping=context.mapping, inv_freq=context.inv_freq.to(query.device),
                    softcap=kwargs.get("softcap"), log_n_original=context.log_n_original, memo=context.memo)
        if n_q == 1 and positions.known and context.forward.get("generating") and not context.forward.get("derived"):
            attention_mask = None  # generate()'s mask hides each row's padding only, which `_by_rows` leaves out
        if positions.padded and n_q <= positions.count - max(positions.pads):  # every query real: row by row
            return _by_rows(query, key, value, positions, attention_mask, store, call), None
        output = remapped_attention(query, key, value, positions, attention_mask, key_store=store, **call)
        return output, None

    attention.__rope_extend__ = impl
    return attention


def _by_rows(query, key, value, positions: Positions, mask, store, call: dict) -> torch.Tensor:
    """A left-padded batch whose queries are all real tokens (decoding steps): each row on its real keys, which sit
    at contiguous positions, so every row takes a fast path and nothing is read from the device. A decoding step's
    mask (padding only: one query sees every real key) is left out; for several queries, the row's part of it."""
    rows = []
    for b, pad in enumerate(positions.pads):
        row_mask = None if mask is None or query.shape[2] == 1 else mask[b : b + 1, ..., pad : positions.count]
        row_store = store.setdefault(("row", b), {}) if store is not None else None
        rows.append(remapped_attention(query[b : b + 1], key[b : b + 1, :, pad:], value[b : b + 1, :, pad:],
                                       positions.row(b), row_mask, key_store=row_store, **call))
    if store is not None:
        store["keys"] = key  # the cache's key tensor these rows' moved keys were computed from (runtime's check)
    return torch.cat(rows)


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
    """Forward pre-hook: the positions of this call's keys (its queries are the last of them), on the module.

    Where they are known without reading a tensor (the model derives them, or generate() numbers them: see the
    module docstring) and this layer's keys so far are known the same way, the host form of `Positions`: no tensor
    is read or built, and a decoding step is free of host synchronisation. Otherwise the tensor form, from the
    position ids the module receives (query positions [B, q] appended to the layer's key positions)."""
    hidden = kwargs.get("hidden_states", args[0] if args else None)
    if hidden is None:
        return None
    batch, n_q = hidden.shape[0], hidden.shape[1]
    cache = _cache_of(kwargs)
    layer = getattr(module, "layer_idx", 0)
    past = int(cache.get_seq_length(layer)) if cache is not None else 0
    context = module.__dict__.get(CONTEXT)
    state = context.forward if context is not None else {}
    store = cache.__dict__.setdefault(POSITIONS, {}) if cache is not None else {}
    previous = store.get(layer)
    positions = kwargs.get("position_ids")
    known = None
    if state.get("derived") or state.get("generating"):
        host = isinstance(previous, Positions) and previous.known and previous.count >= past
        # generate() continues each row's own positions; a model deriving them (no position ids) continues
        # cache_position for every row alike, which is each row's own only without padding
        if host and (not previous.padded or (state.get("generating") and not state.get("derived"))):
            known = Positions(past + n_q, previous.first, previous.pads)
        elif previous is None and state.get("derived"):
            known = Positions(past + n_q)  # transformers' rule: the cache's length onwards
        elif previous is None and positions is not None and positions.dim() == 2:  # generate's first forward
            known = _left_padded(positions.to(hidden.device).expand(batch, n_q), past)
    if known is not None:
        if cache is None:
            module.__dict__[POSITIONS] = (known, None)
            return None
        store[layer] = known
        module.__dict__[POSITIONS] = (known, _moved_store(cache, layer, past))
        return None
    if positions is None:
        cache_position = kwargs.get("cache_position")
        positions = (cache_position if cache_position is not None
                     else torch.arange(past, past + n_q, device=hidden.device))[None]
    if positions.dim() != 2:
        raise UnsupportedModelError(
            f"{type(module).__name__} receives {positions.dim()}-D position ids (multimodal RoPE sections); "
            "the attention-level methods remap one position per token"
        )
    positions = positions.to(hidden.device).expand(batch, n_q)
    if cache is None:
        module.__dict__[POSITIONS] = (Positions.of(positions), None)
        return None
    if isinstance(previous, Positions) and (previous.known or previous.ids.shape[0] in (1, batch)) \
            and previous.count >= past:
        before = previous.prefix(past).key_ids(positions.device).expand(batch, past)
    else:  # a cache filled before patching: contiguous positions ending before the new tokens
        before = positions[:, :1] - past + torch.arange(past, device=positions.device)[None]
    keys = Positions.of(torch.cat((before, positions), dim=1))
    store[layer] = keys
    module.__dict__[POSITIONS] = (keys, _moved_store(cache, layer, past))
    return None


def _left_padded(positions: torch.Tensor, past: int) -> Positions | None:
    """The host form of generate()'s first positions [B, n] (read once: a prefill's synchronisation), when every row
    is left padding (any positions) followed by positions 0, 1, ... (an empty cache), or continues past with
    past, past + 1, ... (a cache that holds a prefix, no padding); None otherwise (the tensor form is used)."""
    batch, n = positions.shape
    if past:
        expected = torch.arange(past, past + n, device=positions.device)
        return Positions(past + n) if bool((positions == expected).all()) else None
    rows = positions.tolist()
    pads = []
    for row in rows:
        pad = n - 1 - row[-1] if row else 0
        if pad < 0 or row[pad:] != list(range(n - pad)):
            return None
        pads.append(pad)
    return Positions(n, 0, tuple(pads) if any(pads) else ())


def _moved_store(cache, layer: int, past: int) -> dict:
    """This layer's moved keys on the cache (`kernels.moved_keys`), emptied when the cache no longer holds the key
    tensor they were computed from, cut to `past` keys when the cache was cut (a static cache reset)."""
    moved = cache.__dict__.setdefault(MOVED, {}).setdefault(layer, {})
    if moved.get("keys") is None or compat.cache_layer_keys(cache, layer) is not moved["keys"]:
        moved.clear()
    elif moved.get("count", 0) > past:  # (a batch run row by row keeps its counts per row)
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


class _Generating:
    """`model.generate` wrapped (an instance attribute, removed by `remove`): notes, for the attention hooks, that
    the forwards run inside generate(), which numbers each row's tokens from its attention mask, so each step's
    positions continue the row's (`record_positions`). A caller's own `position_ids` turn it off."""

    def __init__(self, model, state: dict):
        self.model, self.state = model, state
        original = type(model).generate

        @functools.wraps(original)
        def generate(*args, **kwargs):
            if "position_ids" in kwargs or state.get("generating"):
                return original(model, *args, **kwargs)
            state["generating"] = True
            try:
                return original(model, *args, **kwargs)
            finally:
                state.pop("generating", None)

        self.wrapper = generate
        model.generate = generate

    def remove(self) -> None:
        if self.model.__dict__.get("generate") is self.wrapper:
            del self.model.__dict__["generate"]
        self.state.pop("generating", None)


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
    if callable(getattr(type(model), "generate", None)) and "generate" not in model.__dict__:
        handles.append(_Generating(model, forward))
    _install_dispatchers()
    return handles
