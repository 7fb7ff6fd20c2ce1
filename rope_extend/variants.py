"""RoPE variants a model ships: transformers rope_types that are the model's own RoPE, not a scaling of it, and
which rope-extend methods can be written in them.

`proportional` (Gemma 4's and LFM3's full-attention layers; transformers 5.25
`modeling_rope_utils._compute_proportional_rope_parameters`) is the default RoPE over the whole head_dim with its
lowest frequencies set to zero: `rope_angles = int(p * head_dim // 2)` frequencies `rope_theta^(-2i/head_dim)`
rotate (p = the slot's `partial_rotary_factor`), the other `head_dim/2 - rope_angles` are 0, and every frequency is
divided by the slot's `factor`. It reads nothing else. So a method rescales it exactly when what the method writes
is a new `rope_theta` and/or a `factor` dividing every frequency (a static `default` or `linear` slot: ntk, linear),
computed over the whole head_dim and then cut to the rotating frequencies: proportional(method) = the method applied
to the full-head RoPE, truncated. The slot keeps `rope_type: proportional` and its `partial_rotary_factor`.
Every other method writes what proportional RoPE does not read (yarn's ramp, llama3's bands, longrope's lists,
dynamic recomputation) and is refused, naming the methods that work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import compat
from .errors import SpecError
from .methods import RopeMethod, all_methods

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Proportional:
    """transformers' `proportional` RoPE slot."""

    rope_type: str = "proportional"
    # what transformers' proportional RoPE reads from its slot, and the written slot types whose frequencies it
    # reproduces with those keys alone (`default`: rope_theta; `linear`: rope_theta and a factor dividing them all)
    reads: frozenset = frozenset({"rope_type", "rope_theta", "factor", "partial_rotary_factor"})
    carried_types: tuple[str, ...] = ("default", "linear")

    def describe(self, params: dict) -> str:
        share = float(params.get("partial_rotary_factor", 1.0))
        return (f"proportional RoPE (only the first {share:g} of each head rotates, at frequencies spread over the "
                "whole head_dim)")

    def carries(self, method: RopeMethod) -> bool:
        """Whether `method` writes only what this variant reads, with the same meaning."""
        return (not method.dynamic and not method.acts_on_attention and not method.slot_keys
                and method.hf_rope_type in self.carried_types)

    def check(self, method: RopeMethod, model_type: str, where: str, params: dict) -> None:
        """Raise SpecError (one line: the method, why, the methods that work) unless the variant carries `method`."""
        if self.carries(method):
            return
        if method.switches_at_original:
            why = "it switches between per-frequency factor lists at the original length"
        elif method.dynamic:
            why = "it recomputes the frequencies as the sequence grows"
        elif method.acts_on_attention:
            why = "it remaps attention on top of the model's RoPE, which rope-extend has not checked on this variant"
        else:
            why = f"it writes a {method.hf_rope_type} slot, which has no proportional form"
        carried = [m.name for m in all_methods() if self.carries(m)]
        fixes = " or ".join(f"--method {name}" for name in carried)
        raise SpecError(
            f"model type {model_type!r}: {where} use {self.describe(params)}, which transformers rescales only by a "
            f"new rope_theta or a factor dividing every frequency; {method.name} cannot be written there ({why}): "
            f"use {fixes}",
            field="method",
            value=method.name,
        )

    def rotary_dim(self, config, slot: str | None) -> int:
        """The dimension the frequencies are spread over: the layer type's head_dim (not head_dim x p)."""
        return compat.rotary_dim(config, {"partial_rotary_factor": 1.0}, slot)

    def rotating(self, params: dict, head_dim: int) -> int:
        """How many frequencies rotate (transformers: `int(partial_rotary_factor * head_dim // 2)`)."""
        return int(params.get("partial_rotary_factor", 1.0) * head_dim // 2)

    def slot(self, written: dict, base_slot: dict) -> dict:
        """A method's written slot in this variant's form: rope_type proportional, the pristine share kept."""
        extra = set(written) - self.reads
        if written.get("rope_type") not in self.carried_types or extra:
            raise ValueError(f"a {written.get('rope_type')} slot with {sorted(extra)} has no proportional form")
        slot = {**written, "rope_type": self.rope_type}
        if "partial_rotary_factor" in base_slot:
            slot["partial_rotary_factor"] = base_slot["partial_rotary_factor"]
        return slot

    @staticmethod
    def cut(inv_freq: torch.Tensor, rotating: int) -> torch.Tensor:
        """The full-head frequencies with all but the first `rotating` set to zero (they do not rotate)."""
        out = inv_freq.clone()
        out[rotating:] = 0
        return out


VARIANTS = {variant.rope_type: variant for variant in (Proportional(),)}


def variant_of(params: dict) -> Proportional | None:
    """The variant a pristine slot ships, or None for a plain (or scaled) RoPE slot."""
    return VARIANTS.get(params.get("rope_type"))
