"""One reader of a model's RoPE facts: slots, rotary dimensions, original length, marker.

Planning, evaluation, `inspect` and the checkpoint writer all read a config through `read_rope`, so they agree on
what the model is, in particular on the original (pretraining) length L:

1. a config rope-extend patched carries a marker with the pristine RoPE and length: L comes from there;
2. otherwise the (full-attention) slot's scheme says: `original_max_position_embeddings` (yarn, llama3,
   longrope...), or `max_position_embeddings / factor` for a shipped `linear` scheme;
3. otherwise `max_position_embeddings`.

Multimodal configs nest the text model's config: `read_rope` always reads the text config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import compat

FLAT_KEY = "_all"
# rope_types that are a model's own RoPE, not a scaling of it ("proportional": Gemma 4's and LFM3's partial rotation
# at frequencies spread over the whole head_dim).
UNSCALED_TYPES = ("default", "proportional")  # JSON name of the flat slot (None) in the marker


def scheme_type(params: dict) -> str:
    """The scaling a slot carries, by transformers' rope_type: a proportional slot with a `factor` is a linear
    scaling of the model's own proportional RoPE (transformers divides every frequency by it)."""
    rope_type = params.get("rope_type", "default")
    if rope_type == "proportional" and float(params.get("factor") or 1.0) != 1.0:
        return "linear"
    return rope_type


def encode_slots(slots: dict[str | None, dict]) -> dict[str, dict]:
    return {FLAT_KEY if key is None else key: dict(value) for key, value in slots.items()}


def decode_slots(slots: dict[str, dict]) -> dict[str | None, dict]:
    return {None if key == FLAT_KEY else key: dict(value) for key, value in slots.items()}


def slot_original_length(params: dict, max_position_embeddings: int) -> int:
    """The pretraining length behind one slot's scheme."""
    if params.get("original_max_position_embeddings"):
        return int(params["original_max_position_embeddings"])
    if scheme_type(params) == "linear" and params.get("factor"):
        return int(round(max_position_embeddings / float(params["factor"])))
    return int(max_position_embeddings)


@dataclass(frozen=True)
class RopeFacts:
    """What a (text) config says about its RoPE.

    slots: the current slot table (see `compat`); pristine_slots / pristine_max_position_embeddings: before any
    rope-extend patch (from the marker), else the current ones. max_position_embeddings is None when the config
    has none.
    """

    config: Any
    model_type: str
    slots: dict[str | None, dict]
    rotary_dims: dict[str | None, int]
    max_position_embeddings: int | None
    marker: dict | None
    pristine_slots: dict[str | None, dict]
    pristine_max_position_embeddings: int | None

    @property
    def main_slot(self) -> str | None:
        """The slot that carries the model's length: full attention (or the flat slot)."""
        return "full_attention" if "full_attention" in self.slots else next(iter(self.slots))

    def original_length(self, slot: str | None = ...) -> int | None:
        """The pretraining length L behind `slot` (default: the main slot), None if the config has no length."""
        slot = self.main_slot if slot is ... else slot
        if self.pristine_max_position_embeddings is None:
            return None
        params = self.pristine_slots.get(slot, self.pristine_slots[self.main_slot])
        return slot_original_length(params, self.pristine_max_position_embeddings)

    @property
    def window(self) -> int | None:
        """The length the model reaches now: max_position_embeddings, or its scheme's original length x factor when
        that is longer (Qwen2.5's YaRN x4 from 32768 in a config that keeps 32768). None without a length."""
        return _window(self.slots[self.main_slot], self.max_position_embeddings)

    @property
    def shipped_window(self) -> int | None:
        """The length the model reached before any rope-extend patch (`window` of the pristine config): what a method
        that keeps the model's scheme calls the original length L (Llama 3.1: 131072, not llama3's 8192)."""
        return _window(self.pristine_slots.get(self.main_slot, next(iter(self.pristine_slots.values()))),
                       self.pristine_max_position_embeddings)

    @property
    def is_scaled(self) -> bool:
        """True when the config already carries a scheme (its own or an earlier rope-extend patch)."""
        return self.marker is not None or any(
            scheme_type(p) not in UNSCALED_TYPES for p in self.slots.values()
        )


def _window(params: dict, max_position_embeddings: int | None) -> int | None:
    """max_position_embeddings, or the slot's scheme's original length x factor when that is longer."""
    if max_position_embeddings is None:
        return None
    factor, original = params.get("factor"), params.get("original_max_position_embeddings")
    if scheme_type(params) in UNSCALED_TYPES or not (factor and original):
        return max_position_embeddings
    return max(max_position_embeddings, int(round(float(factor) * int(original))))


def read_rope(config) -> RopeFacts:
    """Read a config (or a multimodal config's text part) once."""
    config = compat.text_config(config)
    slots = compat.read_slots(config)
    marker = compat.read_marker(config)
    max_pos = getattr(config, "max_position_embeddings", None)
    max_pos = int(max_pos) if max_pos else None
    if marker and isinstance(marker.get("original"), dict):
        pristine = decode_slots(marker["original"]["rope_parameters"])
        pristine_max = int(marker["original"]["max_position_embeddings"])
    else:
        pristine, pristine_max = slots, max_pos
    return RopeFacts(
        config=config,
        model_type=getattr(config, "model_type", "?"),
        slots=slots,
        rotary_dims={key: compat.rotary_dim(config, params, key) for key, params in pristine.items()},
        max_position_embeddings=max_pos,
        marker=marker,
        pristine_slots=pristine,
        pristine_max_position_embeddings=pristine_max,
    )
