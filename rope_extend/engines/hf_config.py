"""How transformers 5.x turns a config.json into `rope_parameters` (vLLM >= 0.12 and SGLang >= 0.5 load configs
through it), ported so the engine ports run without a second transformers install.

Source: transformers 5.24 `PreTrainedConfig.__init__` / `standardize_rope_params` (configuration_utils.py,
modeling_rope_utils.py): a `rope_scaling` key in config.json wins over `rope_parameters`; a top-level `rope_theta`
and `partial_rotary_factor` fill in missing ones (setdefault, never overwrite); `type` becomes `rope_type`; yarn,
llama3 and longrope get `original_max_position_embeddings` from the top level (Phi-3) or from
`max_position_embeddings`. 5.x keeps no top-level `rope_theta` attribute after loading.
"""

from __future__ import annotations

import copy

ORIGINAL_LENGTH_TYPES = ("llama3", "yarn", "longrope")


def text_part(config: dict) -> dict:
    return config["text_config"] if isinstance(config.get("text_config"), dict) else config


def standardize(config: dict, rope_parameters: dict | None, rope_theta=None) -> dict:
    """transformers 5.x `standardize_rope_params` for a flat (or full-attention) slot."""
    params = copy.deepcopy(rope_parameters or {})
    if "full_attention" in params and isinstance(params["full_attention"], dict):
        params = params["full_attention"]
    params.setdefault("rope_type", params.get("type", "default"))
    params.setdefault("rope_theta", rope_theta)
    partial = config.get("partial_rotary_factor")
    if partial is not None:
        params.setdefault("partial_rotary_factor", partial)
    if params["rope_type"] in ORIGINAL_LENGTH_TYPES:
        if config.get("original_max_position_embeddings") is not None:
            params["original_max_position_embeddings"] = config["original_max_position_embeddings"]
        else:
            params.setdefault("original_max_position_embeddings", config.get("max_position_embeddings"))
    return params


def load(config: dict) -> tuple[dict, dict]:
    """(the config's other fields, its rope_parameters) as transformers 5.x loads a config.json dict."""
    config = copy.deepcopy(text_part(config))
    rope = config.pop("rope_scaling", None) or config.get("rope_parameters")
    theta = config.pop("rope_theta", None)
    if theta is None:
        theta = config.get("rotary_emb_base")  # vLLM's patch_rope_parameters also reads this legacy name
    return config, standardize(config, rope, theta)


def load_layer(config: dict, layer_type: str | None) -> tuple[dict, dict]:
    """(fields, rope_parameters) of the layers of `layer_type` (None or "full_attention": `load`). Gemma 3's sliding
    layers: `rope_parameters["sliding_attention"]` of a transformers-5 config, or in a 4.x config.json the default
    RoPE at `rope_local_base_freq` -- what vLLM's and SGLang's gemma3.py build for a sliding layer ("Local attention.
    Override the values in config.json": rope_type default, base rope_local_base_freq)."""
    fields, full = load(config)
    if layer_type in (None, "full_attention"):
        return fields, full
    nested = fields.get("rope_parameters")
    if isinstance(nested, dict) and isinstance(nested.get(layer_type), dict):
        return fields, standardize(fields, nested[layer_type], full.get("rope_theta"))
    if layer_type == "sliding_attention" and fields.get("rope_local_base_freq") is not None:
        return fields, standardize(fields, {"rope_type": "default"}, fields["rope_local_base_freq"])
    return fields, full


def layer_rope(loaded: dict, full: dict, layer_type: str | None) -> dict:
    """The RoPE an engine builds for the layers of `layer_type`: the (overridden) full-attention one, or the layer
    type's own (`load_layer`: Gemma 3's sliding layers)."""
    return full if layer_type in (None, "full_attention") else load_layer(dict(loaded), layer_type)[1]


def architecture(config: dict) -> str | None:
    """The model class an engine picks for config.json: its first `architectures` entry, else (a config made in
    memory, which `save_pretrained` would give one) transformers' causal-LM class for its model_type."""
    given = config.get("architectures") or []
    if given:
        return str(given[0])
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(str(config.get("model_type") or ""))
