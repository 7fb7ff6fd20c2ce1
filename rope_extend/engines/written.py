"""What a plan writes, as a serving engine sees it: the config slot and lengths, never the method's name.

An engine room (`rope_extend/engines/<name>/`) decides what it serves from what is written, the way the engine
itself does: by the `rope_type` it dispatches on, the config keys it honours and the override syntax it parses. A
method declares what it writes (`RopeMethod.config_slot`, `stock_method`, `acts_on_attention`); `Written.of` reads
that declaration once, so no engine asks which method it was and no method file names an engine.

`features` names what in the config an engine's port may not model (a nested `text_config`, parameters per layer
type, proportional RoPE, DeepSeek's `mscale`): a room that does not list a feature among those it models reports
the checkpoint "unchecked" with the reason (fail closed), never "identical".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..plan import PatchPlan

# The config features an engine room must model before it may call a route identical, in words for its reason.
FEATURES = {
    "text_config": "a config that nests the text model under text_config (multimodal configs)",
    "layer_types": "RoPE parameters per layer type (rope_parameters keyed by full_attention / sliding_attention)",
    "proportional": "proportional RoPE (rope_type 'proportional': Gemma 4, LFM3)",
    "mscale": "DeepSeek's YaRN magnitude (mscale / mscale_all_dim)",
}


@dataclass(frozen=True)
class AttentionLevel:
    """A method that acts on attention: nothing in config.json carries it, so every stock engine serves the model's
    own RoPE and attention up to the window it claims. `mapping` is the method's position map (an engine with an
    equivalent of its own recognises it: llama.cpp's grouped attention is self-extend's map); `elsewhere` where the
    method exists outside rope-extend, in the method's own words."""

    served: str  # what stock loaders serve: "the model WITHOUT self-extend"
    own: str  # the model's own RoPE in words: "its own RoPE: llama3 x8 from 8192"
    elsewhere: str  # where else the method is served
    mapping: Any = None  # the position map (rope_extend.attention.maps), None when it cannot be built


@dataclass(frozen=True)
class Written:
    """What a plan writes into config.json, and what rope-extend serves from it.

    method: the method's name, for the words of a warning only (no engine branches on it).
    slot: the full-attention RoPE slot as written (transformers 5's `rope_parameters` form: rope_type, rope_theta,
        factor...); original_slot: the source model's; rope_parameters: config.json's whole `rope_parameters` as
        written (keyed by layer type where the model has several), what an override of the original model carries.
    original_length: L, what the factor counts from; target_length: the length rope-extend serves;
        max_position_embeddings: what config.json says after the patch (dynamic methods: the threshold L).
    attention_factor: the magnitude rope-extend applies (cos and sin are multiplied by it).
    attention: set for a method that acts on attention (nothing in the config carries it).
    read_as: what stock loaders build from the slot when it is not the method itself (dynamic-yarn is read as
        static yarn), with `read_as_note`, the method's own words for it.
    model_type / architectures: the text model's, when the config is known ("" / () otherwise).
    features: the config features present (`FEATURES`).
    """

    method: str
    slot: Mapping[str, Any]
    original_slot: Mapping[str, Any]
    rope_parameters: Mapping[str, Any]
    original_length: int
    target_length: int
    max_position_embeddings: int
    factor: float
    attention_factor: float
    attention: AttentionLevel | None = None
    read_as: str | None = None
    read_as_note: str | None = None
    model_type: str = ""
    architectures: tuple[str, ...] = ()
    features: frozenset[str] = field(default_factory=frozenset)

    @property
    def rope_type(self) -> str:
        """What every engine dispatches on: the written slot's rope_type."""
        return str(self.slot.get("rope_type", self.slot.get("type", "default")))

    @property
    def nested(self) -> bool:
        """The text model's config sits under `text_config` (an override must reach it there)."""
        return "text_config" in self.features

    @property
    def theta(self) -> float:
        return float(self.slot["rope_theta"])

    @property
    def theta_changed(self) -> bool:
        """The written base differs from the source's (a plain rope_theta change: NTK)."""
        return float(self.original_slot.get("rope_theta", self.theta)) != self.theta

    @classmethod
    def of(cls, plan: PatchPlan, config: Mapping | None = None) -> Written:
        """What `plan` writes, read once; `config` (the source's or the written config.json, as a dict) adds the model
        type, architectures and the config features (None: a config not known, e.g. a plan made in memory)."""
        method = plan.method
        slot = dict(plan.slots.get("full_attention", plan.slots.get(None)) or next(iter(plan.slots.values())))
        old = plan.old_slots.get("full_attention", plan.old_slots.get(None)) or next(iter(plan.old_slots.values()))
        attention = None
        if method.acts_on_attention:
            try:
                mapping = method.mapping(plan.spec)
            except (ValueError, TypeError):  # an unresolved spec: the map's parameters are not known
                mapping = None
            attention = AttentionLevel(method.served, method.own_scheme(plan), method.elsewhere, mapping)
        stock = method.stock_method
        features = set()
        if len(plan.slots) > 1 or any(key is not None for key in plan.slots):
            features.add("layer_types")
        if any(s.get("rope_type") == "proportional" for s in plan.slots.values()):
            features.add("proportional")
        if slot.get("mscale") is not None and slot.get("mscale_all_dim") is not None:
            features.add("mscale")
        model_type, architectures = "", ()
        if config is not None:
            if isinstance(config.get("text_config"), Mapping):
                features.add("text_config")
                text = config["text_config"]
            else:
                text = config
            model_type = str(text.get("model_type") or config.get("model_type") or "")
            from .hf_config import architecture

            found = architecture(dict(config))
            architectures = tuple(config.get("architectures") or ()) or ((found,) if found else ())
        nested = {key: dict(value) for key, value in plan.slots.items() if key is not None}
        return cls(
            method=plan.spec.method,
            slot=slot,
            original_slot=dict(old),
            rope_parameters=nested or slot,
            original_length=int(plan.spec.original_max_position_embeddings),
            target_length=int(plan.spec.target_length),
            max_position_embeddings=int(plan.max_position_embeddings),
            factor=float(plan.spec.factor),
            attention_factor=float(plan.attention_factor),
            attention=attention,
            read_as=None if stock is method else stock.name,
            read_as_note=method.marker_note(plan.spec) if stock is not method else None,
            model_type=model_type,
            architectures=architectures,
            features=frozenset(features),
        )
