"""The one place that knows how transformers 4.x and 5.x lay RoPE out in configs and modules.

Version-neutral form used everywhere else: a *slot table* ``{layer_type_or_None: params}`` where ``params`` is a
flat transformers-5-style dict (``rope_type``, ``rope_theta``, ``factor``, ``original_max_position_embeddings``, ...)
and the key is ``None`` for a model with one RoPE for all layers, or a layer type (``full_attention``,
``sliding_attention``) for models with per-layer-type RoPE (Gemma 3).

- 4.x: top-level ``rope_theta`` + ``rope_scaling`` (older checkpoints: ``type`` instead of ``rope_type``); Gemma 3's
  local base is ``rope_local_base_freq`` and its local module is a second module ``rotary_emb_local``.
- 5.x: ``rope_parameters`` (nested per layer type where the model declares it); ``rope_scaling`` in a config.json
  takes precedence over ``rope_parameters`` and a top-level ``rope_theta`` fills in a missing one.

`portable_config_dict` writes both forms consistently so a config.json loads to the same frequencies in either line.
"""

from __future__ import annotations

import copy
import functools
import math
import warnings
from typing import TYPE_CHECKING, Any

import transformers
from packaging.version import Version

if TYPE_CHECKING:
    import torch

TRANSFORMERS_VERSION = Version(transformers.__version__)
TRANSFORMERS_V5 = TRANSFORMERS_VERSION.major >= 5


@functools.cache
def generate_cache_keyword() -> str:
    """The keyword that hands a prefilled KV cache to a model's forward and `generate`: the one the running
    transformers' Llama forward declares. `cache` from 5.24 (where `past_key_values` warns as deprecated), and
    `past_key_values` before, in 4.x and 5.0-5.23 alike: there `cache=` is refused by `generate` and swallowed by the
    forward's `**kwargs`, leaving the cache empty."""
    import inspect

    from transformers.models.llama.modeling_llama import LlamaModel

    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


MARKER_KEY = "rope_extend"
# Top-level legacy names some config classes read instead of rope_theta / partial_rotary_factor (both lines).
LEGACY_ALIASES = {"gpt_neox": {"rotary_emb_base": "rope_theta", "rotary_pct": "partial_rotary_factor"}}
FLAT = None  # slot key of a model whose layers share one RoPE
# Model types whose modeling code in the running transformers builds RoPE without reading any scaling field, with
# why and what works (so rope-extend refuses them instead of writing a scaling that would load unscaled).
NO_SCALING_FIELD = {} if TRANSFORMERS_V5 else {
    "dbrx": "transformers 4.x builds DBRX's RoPE from attn_config.rope_theta alone and reads no rope_scaling, so no "
    "scaled config.json would load as scaled; transformers >= 5 reads DBRX's rope_parameters and can extend it",
    "nemotron": "transformers 4.x's Nemotron rotary module hard-codes the default RoPE and reads no rope_scaling, so "
    "no scaled config.json would load as scaled; transformers >= 5 reads Nemotron's rope_parameters and can extend it",
}
# Model types whose rotary module in the running transformers picks the scaling type itself whenever rope_scaling is
# set, whatever its rope_type says (4.x Llama 4: llama3), so only that type (or no rope_scaling) loads as planned.
FORCED_SCALING_TYPE = {} if TRANSFORMERS_V5 else {"llama4_text": "llama3", "llama4": "llama3"}

# Model types whose config.json `rope_scaling` reaches only the full-attention layers, the sliding ones rotating with
# the default RoPE at `rope_theta`: 4.x builds their sliding module with rope_type "default" and 5.x's config class
# applies a legacy `rope_scaling` to `rope_parameters["full_attention"]` alone (OLMo 3).
FULL_ATTENTION_SCALING = {"olmo3"}


def _plain(value: Any) -> Any:
    return copy.deepcopy(value) if isinstance(value, (dict, list)) else value


def _layer_types(config) -> list[str]:
    return list(dict.fromkeys(getattr(config, "layer_types", None) or []))


def _rope_slot_keys(config) -> list[str]:
    """Keys a 5.x nested `rope_parameters` may use: the layer types, or the rope labels a config class declares
    instead (DeepSeek-V4: `main` for sliding layers, `compress` for its compressed-attention layers)."""
    return _layer_types(config) + [label for label in getattr(type(config), "_rope_type_labels", ()) or ()]


def _normalise(params: dict | None, rope_theta: float | None) -> dict:
    params = dict(params or {})
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    out = {"rope_type": rope_type}
    theta = params.pop("rope_theta", None)
    out["rope_theta"] = float(theta if theta is not None else (rope_theta if rope_theta is not None else 10000.0))
    out.update({k: _plain(v) for k, v in params.items() if v is not None})
    return out


def read_slots(config) -> dict[str | None, dict]:
    """The model's RoPE parameters as a slot table (see module docstring)."""
    rope_parameters = getattr(config, "rope_parameters", None) if TRANSFORMERS_V5 else None
    layer_types = _layer_types(config)
    if TRANSFORMERS_V5 and rope_parameters:
        nested = [key for key in rope_parameters if key in _rope_slot_keys(config)]
        if nested:
            return {key: _normalise(rope_parameters[key], None) for key in nested if rope_parameters[key] is not None}
        return {FLAT: _normalise(rope_parameters, getattr(config, "rope_theta", None))}
    # 4.x (or a 5.x config without rope_parameters)
    scaling = getattr(config, "rope_scaling", None)
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        theta = getattr(config, "rotary_emb_base", None)
    full = _normalise(scaling, theta)
    partial = getattr(config, "partial_rotary_factor", None)
    if partial is not None:
        full.setdefault("partial_rotary_factor", float(partial))
    if full["rope_type"] in ("yarn", "llama3", "longrope"):
        # Phi-3 keeps the pretraining length at top level and it wins there, as in transformers.
        top = getattr(config, "original_max_position_embeddings", None)
        full["original_max_position_embeddings"] = top or full.get(
            "original_max_position_embeddings", config.max_position_embeddings
        )
    # Sliding layers with their own default RoPE: at rope_local_base_freq (Gemma 3), or at rope_theta (OLMo 3)
    local_base = getattr(config, "rope_local_base_freq", None)
    if local_base is None and getattr(config, "model_type", None) in FULL_ATTENTION_SCALING:
        local_base = full["rope_theta"]
    if local_base is not None and "sliding_attention" in layer_types:
        return {"full_attention": full, "sliding_attention": {"rope_type": "default", "rope_theta": float(local_base)}}
    return {FLAT: full}


def layer_config(config, slot: str | None):
    """The config one layer type's layers see: transformers 5 heterogeneous configs (Gemma 4, DeepSeek-V4...) keep
    per-layer values such as head_dim in `per_layer_config`, and reading them globally raises."""
    if slot is not None and "_heterogeneity_spec" in getattr(config, "__dict__", {}):
        try:
            return config.per_layer_config[slot]
        except (ValueError, KeyError, IndexError, TypeError):
            pass
    return config


def rotary_dim(config, params: dict, slot: str | None = None) -> int:
    """head_dim (explicit if the config has one; per layer type where the config varies it) x
    partial_rotary_factor."""
    config = layer_config(config, slot)
    try:
        head_dim = getattr(config, "head_dim", None)
        head_dim = head_dim or config.hidden_size // config.num_attention_heads
    except (AttributeError, RuntimeError, TypeError, ZeroDivisionError) as exc:
        from .errors import UnsupportedModelError

        raise UnsupportedModelError(
            f"model type {getattr(config, 'model_type', '?')!r}: its config has no head_dim nor hidden_size and "
            f"num_attention_heads at top level ({type(exc).__name__}), so the rotary dimension it rotates is not "
            "known; rope-extend rescales models whose config gives them"
        ) from None
    partial = params.get("partial_rotary_factor")
    if partial is None:
        partial = getattr(config, "partial_rotary_factor", None)
    if partial is None:
        partial = getattr(config, "rotary_pct", None)
    return int(head_dim * (1.0 if partial is None else partial))


def write_slots(config, slots: dict[str | None, dict], max_position_embeddings: int, marker: dict | None) -> None:
    """Rewrite an in-memory config in the running transformers' own layout (and the legacy keys it keeps)."""
    full = slots.get("full_attention", slots.get(FLAT)) or next(iter(slots.values()))
    if TRANSFORMERS_V5:
        if FLAT in slots:
            config.rope_parameters = _plain(slots[FLAT])
        else:
            rope_parameters = dict(config.rope_parameters or {})
            rope_parameters.update({key: _plain(value) for key, value in slots.items()})
            config.rope_parameters = _nested_truncate(rope_parameters, full)
    else:
        config.rope_theta = full["rope_theta"]
        config.rope_scaling = scaling_dict(full, getattr(config, "model_type", ""))
        if "sliding_attention" in slots and hasattr(config, "rope_local_base_freq"):
            config.rope_local_base_freq = slots["sliding_attention"]["rope_theta"]
        for alias, key in LEGACY_ALIASES.get(getattr(config, "model_type", ""), {}).items():
            if key in full and hasattr(config, alias):
                setattr(config, alias, full[key])
    if _top_level_original(getattr(config, "original_max_position_embeddings", None), full):
        config.original_max_position_embeddings = full["original_max_position_embeddings"]
    config.max_position_embeddings = int(max_position_embeddings)
    if marker is None:
        if hasattr(config, MARKER_KEY):
            delattr(config, MARKER_KEY)
    else:
        setattr(config, MARKER_KEY, _plain(marker))


# Config classes whose 4.x validator accepts only {type: longrope, short_factor, long_factor} in rope_scaling;
# both lines then derive the factor and attention factor from max_position_embeddings / original length.
LONGROPE_ONLY = {"phi3", "phimoe", "phi4_multimodal"}
# Config classes whose 4.x validator accepts only {type: linear|dynamic, factor} (OLMo family, Fuyu...).
TYPE_FACTOR_ONLY = {"olmo", "olmo2", "fuyu", "chameleon"}


def _top_level_original(current, full: dict) -> bool:
    """Write the original length at top level too? Phi-3 keeps it there, and 4.x longrope reads it only there."""
    if "original_max_position_embeddings" not in full:
        return False
    return current is not None or full.get("rope_type") == "longrope"


def _nested_truncate(rope_parameters: dict, full: dict) -> dict:
    """transformers 5.x YaRN reads `truncate` from the top of `rope_parameters` even when it is nested per layer
    type, so a nested config carries the full-attention value there too (otherwise truncate=false is lost)."""
    rope_parameters.pop("truncate", None)
    if "truncate" in full:
        rope_parameters["truncate"] = full["truncate"]
    return rope_parameters


def scaling_dict(params: dict, model_type: str = "") -> dict | None:
    """The 4.x ``rope_scaling`` dict for one slot (None when the slot is plain RoPE)."""
    if params.get("rope_type", "default") == "default":
        return None
    if model_type in LONGROPE_ONLY and params["rope_type"] == "longrope":
        return {"type": "longrope", "short_factor": params["short_factor"], "long_factor": params["long_factor"]}
    if model_type in TYPE_FACTOR_ONLY and params["rope_type"] in ("linear", "dynamic"):
        return {"type": params["rope_type"], "factor": float(params["factor"])}
    return {key: _plain(value) for key, value in params.items() if key not in ("partial_rotary_factor", "rope_theta")}


def portable_config_dict(
    config_dict: dict, slots: dict[str | None, dict], max_position_embeddings: int, marker: dict | None
) -> dict:
    """A config.json dict that loads to the same RoPE in transformers 4.x and 5.x, without rope-extend.

    Writes ``rope_parameters`` (5.x, nested where the model nests it), ``rope_scaling`` + top-level ``rope_theta``
    (4.x; 5.x gives ``rope_scaling`` precedence, so both carry identical values), Gemma 3's ``rope_local_base_freq``,
    Phi-3's top-level ``original_max_position_embeddings``, ``max_position_embeddings`` and the provenance marker.
    """
    out = copy.deepcopy(config_dict)
    full = slots.get("full_attention", slots.get(FLAT)) or next(iter(slots.values()))
    legacy_local = False
    if FLAT in slots:
        out["rope_parameters"] = _plain(slots[FLAT])
    else:
        # Nested entries of layer types no layer uses stay too: some config classes (Mellum, Laguna) read a nested
        # table only when all its layer types are there, and would take a partial one for a flat one. So do the
        # None entries of layer types without RoPE (Ergo's NoPE full attention), which the modeling code indexes.
        kept = {key: _plain(value) for key, value in (config_dict.get("rope_parameters") or {}).items()
                if (isinstance(value, dict) or value is None and key in (config_dict.get("layer_types") or ()))
                and key not in slots}
        out["rope_parameters"] = _nested_truncate({**kept, **{key: _plain(value) for key, value in slots.items()}}, full)
        # Gemma 3's 4.x form: rope_scaling + rope_theta for full attention, rope_local_base_freq for sliding layers
        # (OLMo 3's: the same without a local base)
        gemma3_form = "rope_local_base_freq" in out or out.get("model_type", "").startswith("gemma3")
        legacy_local = gemma3_form or out.get("model_type") in FULL_ATTENTION_SCALING
        if "sliding_attention" in slots and gemma3_form:
            out["rope_local_base_freq"] = slots["sliding_attention"]["rope_theta"]
    out["rope_theta"] = full["rope_theta"]
    out["rope_scaling"] = scaling_dict(full, out.get("model_type", ""))
    if FLAT not in slots and not legacy_local:
        # Per-layer-type RoPE that only 5.x config classes nest: there a config.json `rope_scaling` would replace
        # the nested table (Mellum, Laguna; even `null` does) or be applied to the sliding layers too
        # (ModernBERT-decoder).
        out.pop("rope_scaling")
    if "partial_rotary_factor" in full and (FLAT in slots or legacy_local):
        # (a nested 5.x table keeps it per layer type: at top level 5.x would set it into every other layer type's
        # dict on load, e.g. LFM3's plain sliding layers beside its proportional full-attention ones)
        out["partial_rotary_factor"] = full["partial_rotary_factor"]
    for alias, key in LEGACY_ALIASES.get(out.get("model_type", ""), {}).items():
        if key in full:
            out[alias] = full[key]
    out.pop("type", None)
    if _top_level_original(out.get("original_max_position_embeddings"), full):
        out["original_max_position_embeddings"] = full["original_max_position_embeddings"]
    out["max_position_embeddings"] = int(max_position_embeddings)
    if marker is None:
        out.pop(MARKER_KEY, None)
    else:
        out[MARKER_KEY] = _plain(marker)
    return out


def dtype_kwargs(dtype) -> dict:
    """`from_pretrained`'s dtype keyword: `dtype` in 5.x, `torch_dtype` in 4.x."""
    return {"dtype" if TRANSFORMERS_V5 else "torch_dtype": dtype}


def text_config(config):
    """The text model's config (multimodal configs nest it); the config itself otherwise."""
    get_text = getattr(config, "get_text_config", None)
    text = get_text() if callable(get_text) else None
    return text if text is not None else config


def text_part(config_dict: dict) -> dict:
    """The text model's part of a config.json dict (multimodal configs nest it under text_config)."""
    nested = config_dict.get("text_config")
    return nested if isinstance(nested, dict) else config_dict


def portable_checkpoint_config(
    config_dict: dict, slots: dict[str | None, dict], max_position_embeddings: int, marker: dict | None
) -> dict:
    """`portable_config_dict` applied to the text part of a whole config.json dict (nested or not)."""
    part = text_part(config_dict)
    portable = portable_config_dict(part, slots, max_position_embeddings, marker)
    if part is config_dict:
        return portable
    return {**copy.deepcopy(config_dict), "text_config": portable}


def read_marker(config) -> dict | None:
    marker = getattr(config, MARKER_KEY, None)
    return dict(marker) if isinstance(marker, dict) else None


# --- rotary modules ------------------------------------------------------------------------------------------------
def module_slots(name: str, module, slots: dict[str | None, dict]) -> list[tuple[str | None, str]]:
    """Which slots a rotary module serves, as (slot key, buffer prefix) pairs.

    5.x per-layer-type modules hold ``{layer_type}_inv_freq`` buffers; 4.x Gemma 3 has a second module
    ``rotary_emb_local`` for sliding layers; every other module serves the flat slot (or full attention).
    """
    prefixed = [key for key in slots if key is not None and hasattr(module, f"{key}_inv_freq")]
    if prefixed:
        return [(key, f"{key}_") for key in prefixed]
    if FLAT in slots:
        return [(FLAT, "")]
    last = name.rsplit(".", 1)[-1]
    if last in slots:  # 4.x OLMo 3: a ModuleDict of one module per layer type
        return [(last, "")]
    if "local" in last and "sliding_attention" in slots:
        return [("sliding_attention", "")]
    return [("full_attention", "")]


def set_module_rope_type(module, prefix: str, slot: str | None, rope_type: str) -> str:
    """Set the rope_type a stock rotary module dispatches on; return the previous one."""
    current = getattr(module, "rope_type", None)
    if isinstance(current, dict):
        previous = current.get(slot)
        current[slot] = rope_type
        return previous
    module.rope_type = rope_type
    return current


def params_close(a: dict, b: dict, rel: float = 1e-9) -> bool:
    """Two slot dicts describe the same RoPE (numbers compared with a relative tolerance)."""
    keys = set(a) | set(b)
    for key in keys:
        x, y = a.get(key), b.get(key)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool):
            if not math.isclose(float(x), float(y), rel_tol=rel, abs_tol=0.0):
                return False
        elif isinstance(x, list) and isinstance(y, list):
            if len(x) != len(y) or any(not math.isclose(float(p), float(q), rel_tol=rel) for p, q in zip(x, y)):
                return False
        elif x != y:
            return False
    return True


# --- snapshot / restore for unpatch --------------------------------------------------------------------------------
_ROPE_CONFIG_ATTRS = (
    ("rope_parameters",) if TRANSFORMERS_V5 else ("rope_scaling", "rope_theta", "rope_local_base_freq")
) + ("rope_theta", "max_position_embeddings", "original_max_position_embeddings", MARKER_KEY)
_MISSING = object()


def snapshot_rope_config(config) -> dict:
    """Everything `write_slots` may change, so `restore_rope_config` can put it back exactly."""
    return {name: _plain(config.__dict__.get(name, _MISSING)) for name in dict.fromkeys(_ROPE_CONFIG_ATTRS)}


def restore_rope_config(config, snapshot: dict) -> None:
    for name, value in snapshot.items():
        if value is _MISSING:
            config.__dict__.pop(name, None)
        else:
            config.__dict__[name] = _plain(value)


def stock_config(config, slots: dict[str | None, dict], max_position_embeddings: int, marker: dict | None):
    """The config stock transformers builds from the portable config.json of this plan.

    Raises ValueError with the config class's own complaint when it refuses the new RoPE (Phi-3 accepts only
    longrope, for example).
    """
    data = portable_config_dict(config.to_dict(), slots, max_position_embeddings, marker)
    data.pop("transformers_version", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return type(config).from_dict(data)


def stock_rope(config, slot: str | None, device=None) -> tuple[torch.Tensor, float]:
    """(inv_freq, attention_factor) that stock transformers builds at construction for one slot of `config`."""
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = read_slots(config)[slot]
    rope_type = params["rope_type"]
    if rope_type == "default":
        dim = rotary_dim(config, params, slot)
        inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        return inv_freq, 1.0
    fn = ROPE_INIT_FUNCTIONS[rope_type]
    if TRANSFORMERS_V5 and slot is not None:
        return fn(config, device, layer_type=slot)
    return fn(config, device)


# --- attention functions ---------------------------------------------------------------------------------------------
class _AttentionRegistry:
    """transformers' attention-function registry (`ALL_ATTENTION_FUNCTIONS`), local overrides only.

    5.x dispatches "eager" through it too (`get_interface(impl, eager_attention_forward)` returns a local "eager"
    entry); 4.x calls its modeling file's `eager_attention_forward` directly and only looks non-eager names up.
    """

    def __init__(self):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        self.functions = ALL_ATTENTION_FUNCTIONS

    def get_local(self, name: str):
        return self.functions._local_mapping.get(name)

    def set_local(self, name: str, function) -> None:
        if function is None:
            self.functions._local_mapping.pop(name, None)
        else:
            self.functions._local_mapping[name] = function

    def global_function(self, name: str):
        return type(self.functions)._global_mapping[name]


@functools.cache
def eager_through_attention_registry() -> bool:
    """Does the running transformers' modeling code look "eager" up in the registry? From 5.1, whose
    `get_interface(impl, eager_attention_forward)` (what the modeling files call) returns a local "eager" entry; 4.x
    and 5.0 call their modeling file's `eager_attention_forward` directly and look only other names up."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return hasattr(type(ALL_ATTENTION_FUNCTIONS), "get_interface")


def attention_functions() -> _AttentionRegistry:
    return _AttentionRegistry()


def cache_layer_keys(cache, layer: int):
    """The key tensor a KV cache holds for one layer (transformers 4.56+ and 5.x: `cache.layers[i].keys`), or None
    for a cache of another layout (the caller then treats whatever it derived from the keys as stale)."""
    layers = getattr(cache, "layers", None)
    if layers is None or not 0 <= layer < len(layers):
        return None
    return getattr(layers[layer], "keys", None)


# Module attributes computed on first use: reading them imports transformers' modeling code (seconds).
_COMPUTED = {
    "GENERATE_CACHE_KEYWORD": generate_cache_keyword,
    "EAGER_THROUGH_ATTENTION_REGISTRY": eager_through_attention_registry,
}


def __getattr__(name: str):
    if name in _COMPUTED:
        return _COMPUTED[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
