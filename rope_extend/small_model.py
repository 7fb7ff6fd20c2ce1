"""A small random-weight model of a config, built as stock transformers builds the real one: verification's forward
runs on it (`verify.verify_plan` without the real weights, `verify.run_unpatched`).

The small model keeps everything RoPE and attention depend on (head_dim, the ratio of attention to KV heads, the rope
fields, layer types, partial rotary, sliding windows, attention-scaling knobs) and shrinks what they do not (width,
MLP, vocabulary, experts, repeated layers: one layer per distinct layer signature), so its rotary modules and
attention are the ones the checkpoint builds, and verifying a 70B-shaped config costs what a 135M one does.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import warnings

from . import compat
from .errors import ModelRunError
from .zero3 import without_zero3_init

# What the small model shrinks. RoPE and attention depend on head_dim, the ratio of attention to KV heads, the rope
# fields, layer types, partial rotary, sliding windows and attention-scaling knobs; these are kept. They do not
# depend on the model's width, MLP, vocabulary, expert count or number of layers of the same type.
PROBE_VOCAB = 256
SMALL_INTERMEDIATE = 64
SMALL_EXPERTS = 4
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts")
TOP_K_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_k", "moe_topk", "top_k", "num_selected_experts")
GROUP_KEYS = ("n_group", "topk_group", "num_expert_group", "moe_n_group", "moe_topk_group")
MLP_KEYS = ("ffn_hidden_size", "d_ff", "d_inner")  # besides every *intermediate* key
# How far each attempt shrinks: (narrow width, one layer per layer signature). The first that builds, runs and
# holds the planned rotary modules and at least one attention layer is used; the last is the old, wide model.
LEVELS = ((True, True), (True, False), (False, True))


def _layer_lists(config) -> tuple[int | None, dict[str, list], dict[str, list], dict[int, dict]]:
    """num_hidden_layers; the per-layer lists (layer_types, mlp_layer_types, no_rope_layers, ...); the lists of layer
    indices (attn_layer_indices, mlp_only_layers, ...); and the per-layer overrides of a heterogeneous config
    (transformers 5: per-layer head_dim, KV heads...)."""
    count = config.__dict__.get("num_hidden_layers")
    if not isinstance(count, int) or count < 1:
        return None, {}, {}, {}
    lists, indices = {}, {}
    for key, value in vars(config).items():
        if not isinstance(value, list) or key.startswith("_") or "token" in key:
            continue
        if len(value) == count:
            lists[key] = value
        elif ("layer" in key or "idx" in key or "ids" in key or "indices" in key) and all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < count for v in value
        ):
            indices[key] = value
    spec = config.__dict__.get("_heterogeneity_spec")
    overrides = copy.deepcopy(getattr(spec, "per_layer_overrides", None) or {})
    return count, lists, indices, overrides


def _layer_sections(config, count: int) -> dict[str, int]:
    """Layer counts that split the stack into consecutive sections, in the config's order (Dory's n_input_layers,
    n_recurrent_layers, n_output_layers: they sum to num_hidden_layers and its forward slices the layers by them)."""
    counts = {key: value for key, value in vars(config).items()
              if key.endswith("_layers") and key != "num_hidden_layers" and not key.startswith("_")
              and isinstance(value, int) and not isinstance(value, bool) and value >= 0}
    return counts if len(counts) > 1 and sum(counts.values()) == count else {}


def keep_one_layer_per_signature(small) -> None:
    """One layer for each distinct combination of per-layer settings (e.g. one sliding, one full attention) in each
    section of the stack (see `_layer_sections`), so the small model runs the real one's forward structure."""
    count, lists, indices, overrides = _layer_lists(small)
    if count is None:
        return
    sections = _layer_sections(small, count)
    section_of = [name for name, size in sections.items() for _ in range(size)] or [None] * count
    seen, kept = set(), []
    for index in range(count):
        signature = (
            tuple(repr(value[index]) for value in lists.values())
            + tuple(index in value for value in indices.values())
            + (repr(sorted(overrides.get(index, {}).items())), section_of[index])
        )
        if signature not in seen:
            seen.add(signature)
            kept.append(index)
    if len(kept) == count:
        return
    heterogeneous = "_heterogeneity_spec" in small.__dict__
    small.__dict__.pop("_heterogeneity_spec", None)
    for key, value in lists.items():
        small.__dict__[key] = [value[index] for index in kept]
    for key, value in indices.items():
        small.__dict__[key] = [new for new, old in enumerate(kept) if old in value]
    small.num_hidden_layers = len(kept)
    for name in sections:
        setattr(small, name, sum(section_of[index] == name for index in kept))
    shared = small.__dict__.get("num_kv_shared_layers")
    if isinstance(shared, int) and shared:  # KV sharing across the dropped layers: every kept layer computes its own
        small.num_kv_shared_layers = 0
    if heterogeneous:
        small.per_layer_config = {new: overrides[old] for new, old in enumerate(kept) if old in overrides}


def _narrow(small) -> None:
    """Fewest heads with the same attention-to-KV ratio, the same explicit head_dim, and the width they span."""
    if "_heterogeneity_spec" in small.__dict__:
        return  # per-layer head counts and head_dim: keep the widths
    heads, hidden = getattr(small, "num_attention_heads", None), getattr(small, "hidden_size", None)
    kv = getattr(small, "num_key_value_heads", None) or heads
    if not all(isinstance(v, int) and v > 0 for v in (heads, hidden, kv)) or heads % kv:
        return
    head_dim = getattr(small, "head_dim", None)
    head_dim = head_dim if isinstance(head_dim, int) and head_dim > 0 else hidden // heads
    group = heads // kv
    if hasattr(small, "num_key_value_heads"):
        small.num_key_value_heads = 1
    small.num_attention_heads = group
    small.head_dim = head_dim
    small.hidden_size = group * head_dim


def _shrink_vocab_mlp_experts(small) -> None:
    vocab = int(getattr(small, "vocab_size", PROBE_VOCAB) or PROBE_VOCAB)
    small.vocab_size = min(vocab, PROBE_VOCAB)
    for key, value in list(vars(small).items()):
        if key.endswith("_token_id"):
            if isinstance(value, int) and value >= small.vocab_size:
                setattr(small, key, 0)  # (some config classes want an int; the probe's tokens start at 3)
            elif isinstance(value, list) and any(isinstance(v, int) and v >= small.vocab_size for v in value):
                setattr(small, key, [v for v in value if v < small.vocab_size] or None)
        elif key.startswith("vocab_size_") and isinstance(value, int) and not isinstance(value, bool):
            setattr(small, key, min(value, small.vocab_size))  # per-layer input tables (Gemma 3n's, Gemma 4's PLE)
        elif "intermediate" in key or key in MLP_KEYS:
            if isinstance(value, int) and not isinstance(value, bool):
                setattr(small, key, min(value, SMALL_INTERMEDIATE))
            elif isinstance(value, list) and all(isinstance(v, int) for v in value):
                setattr(small, key, [min(v, SMALL_INTERMEDIATE) for v in value])
    experts = None
    for key in EXPERT_KEYS:
        value = small.__dict__.get(key)
        if isinstance(value, int) and value > SMALL_EXPERTS:
            setattr(small, key, SMALL_EXPERTS)
            experts = SMALL_EXPERTS
    if experts is not None:
        for key in TOP_K_KEYS:
            value = small.__dict__.get(key)
            if isinstance(value, int) and value > experts:
                setattr(small, key, experts)
        for key in GROUP_KEYS:
            if isinstance(small.__dict__.get(key), int):
                setattr(small, key, 1)


def small_config(config, narrow: bool = True, per_signature: bool = True):
    """The same text config, shrunk where RoPE and attention do not look (see LEVELS); the rope fields, head_dim,
    head ratio, layer types, sliding windows and attention-scaling knobs are untouched."""
    small = copy.deepcopy(compat.text_config(config))
    if per_signature:
        keep_one_layer_per_signature(small)
    _shrink_vocab_mlp_experts(small)
    if narrow:
        _narrow(small)
    return small


def base_model_class(config):
    """The base (no head) model class of a config: AutoModel's, or for the text config of a multimodal model that
    AutoModel does not map (Emu3, Mllama), the model class of the same modeling module built on that config."""
    from transformers import AutoModel

    with contextlib.suppress(KeyError, ValueError):
        return AutoModel._model_mapping[type(config)]
    module = importlib.import_module(type(config).__module__.replace(".configuration_", ".modeling_"))
    classes = [obj for obj in vars(module).values()
               if isinstance(obj, type) and getattr(obj, "config_class", None) is type(config)]
    bases = [cls for cls in classes if "For" not in cls.__name__] or classes
    if not bases:
        raise ValueError(f"no model class of {type(config).__name__} in {module.__name__}")
    return bases[0]


def small_model(config):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            cls = base_model_class(config)
            with without_zero3_init():  # a small copy this process checks alone, never partitioned
                return cls._from_config(config, attn_implementation="eager").float().eval()
        except Exception as exc:
            reason = " ".join(str(exc).split())[:200]
            raise ModelRunError(
                f"stock transformers cannot build a {getattr(config, 'model_type', '?')} model from the patched "
                f"config ({type(exc).__name__}: {reason}), so the patch cannot be verified; --no-verify "
                "(patch_model(..., verify=False)) skips the check"
            ) from None


def has_attention(model) -> bool:
    return any(type(module).__name__.endswith("Attention") for module in model.modules())
