"""What self-extend, dual-chunk and STRING share: methods that act on attention, on top of the model's own RoPE.

They never change what stock loaders read. The model's RoPE is kept as shipped, scheme included (Llama 3.1's
llama3 x8 over 8192, Qwen2.5's YaRN x4 over 32768, Gemma 3's per-layer-type RoPE): config.json keeps its RoPE slots
and `max_position_embeddings`, so transformers, vLLM and SGLang serve the model WITHOUT the method, up to the window
it claims. The original length L every method counts from is that window (Llama 3.1: 131072, not llama3's 8192;
Qwen2.5 with YaRN x4: 131072, not the 32768 in `max_position_embeddings`): the distances the model's own RoPE serves.
The method's parameters and the length N it reaches in-process live in rope-extend's section of config.json (the
`rope_extend` marker's spec), which `patch_model(model)` re-applies; the attention re-rotates with the model's own
frequencies and attention factor (`PatchPlan.compute`). The one thing a patch raises for stock tools is a length
cap that stood at the old window (tokenizer_config.json's `model_max_length`, generation_config.json's
`max_length`): raised to N, the length the user asked for. Schemes whose frequencies change with the length
(dynamic, longrope) have no one rotation to keep, and are refused. The attention itself lives in
`rope_extend.attention` (each method's position map in `attention/maps/`), imported only by `install_attention`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ..errors import SpecError
from .registry import (
    Advice,
    GgufRules,
    Param,
    RopeContext,
    RopeMethod,
    default_inv_freq,
    gguf_refusal,
)

LOG_N = Param(bool, False, "multiply each query's logits by max(1, ln(p+1)/ln(L)) (Qwen's logn attention)")


UNSUPPORTED_SCHEMES = ("dynamic", "longrope")  # their frequencies change with the length: no one rotation to keep


class AttentionMethod(RopeMethod):
    acts_on_attention = True
    keeps_scheme = True
    hf_rope_type = "default"
    attention = "the model's own (the attention itself is remapped)"

    # -- math -------------------------------------------------------------------------------------------------
    def _compute(self, ctx: RopeContext):
        return default_inv_freq(ctx.rotary_dim, ctx.base, ctx.device), 1.0

    def mapping(self, spec) -> Any:
        """The method's position map (a `rope_extend.attention.maps.PositionMap`) from a spec `fill_params`
        completed."""
        raise NotImplementedError

    def install_attention(self, model, plan) -> list[Any]:
        from ..attention import runtime

        return runtime.install(model, plan, self.mapping(plan.spec), bool(plan.spec.method_params().get("log_n")))

    @staticmethod
    def _error(message: str, field: str, value: Any) -> SpecError:
        return SpecError(message, field=field, value=value)

    def validate(self, spec) -> None:
        if spec.replace_existing:
            raise ValueError(
                f"replace_existing does not apply to {self.name}: it keeps the model's own RoPE scheme and window "
                f"(what stock loaders serve) and remaps attention positions on top, counting from that window; "
                "remove replace_existing"
            )

    # -- config: the model's own scheme and window, unchanged ---------------------------------------------------
    def original_length(self, facts, slot) -> int | None:
        """The window the model claims as shipped (Llama 3.1: 131072, not llama3's 8192; Qwen2.5 with YaRN x4 over
        32768: 131072): the distances its own RoPE serves."""
        return facts.shipped_window or facts.original_length(slot)

    def config_slot(self, spec, base_slot: dict, rotary_dim: int, base_theta: float) -> dict:
        from ..errors import UnsupportedModelError

        kind = base_slot.get("rope_type", base_slot.get("type", "default"))
        if kind in UNSUPPORTED_SCHEMES:
            raise UnsupportedModelError(
                f"{self.name} keeps the model's own RoPE, but this model's {kind} scheme changes its frequencies "
                "with the length, so there is no one rotation to remap; extend it with a frequency method instead "
                "(e.g. --method yarn --set replace_existing=true)"
            )
        return dict(base_slot)

    @property
    def served(self) -> str:
        """What stock loaders serve from such a checkpoint, in the words of the notes and engine warnings below."""
        return f"the model WITHOUT {self.name}"

    served_rope: ClassVar[str] = "its own RoPE"

    @property
    def elsewhere(self) -> str:
        """Where the method is served outside rope-extend, in words every engine's warning ends with."""
        return (f"no stock serving engine has {self.name} for LLaMA-family models; beyond the original window only "
                f"rope_extend.patch_model serves {self.name}")

    def marker_note(self, spec) -> str | None:
        return (
            f"the model as it is (its RoPE and max_position_embeddings unchanged, {spec.original_max_position_embeddings}"
            f" tokens): {self.name} acts on attention and reaches {spec.target_length} tokens; call "
            "rope_extend.patch_model(model) after loading to re-apply it"
        )

    def loader_notes(self, spec) -> list[str]:
        return [
            f"{self.name} acts on attention, which no config key carries: stock transformers, vLLM and SGLang serve "
            f"{self.served} ({self.served_rope}, up to {spec.original_max_position_embeddings} tokens) from this "
            f"checkpoint; call rope_extend.patch_model(model) after loading to re-apply it in-process (up to "
            f"{spec.target_length} tokens)"
        ]

    def summary(self, plan) -> str:
        spec = plan.spec
        return (f"{spec.method} x{spec.factor:g}: {spec.original_max_position_embeddings} -> {spec.target_length} "
                f"tokens in-process (rope_extend.patch_model), on top of {self.own_scheme(plan)} (attention factor "
                f"{plan.attention_factor:.4f}); config.json keeps it: stock loaders serve "
                f"{spec.original_max_position_embeddings} tokens; {self.describe(spec)}")

    @staticmethod
    def own_scheme(plan) -> str:
        """The model's own RoPE in words: 'its own RoPE: llama3 x8 from 8192'."""
        kept = plan.kept_scheme
        return "its own RoPE" + (f": {kept}" if kept and not kept.startswith("default") else "")


class AttentionGguf(GgufRules):
    def rope(self, spec, base, rope_dim, inv_freq, attention_factor):
        raise gguf_refusal(
            self.method.name,
            "it acts on attention at run time and nothing in a GGUF carries it",
            "serve the original GGUF instead (the model card and `rope-extend engines` name llama.cpp's nearest "
            "equivalent)",
        )


class AttentionAdvice(Advice):
    def tune_candidates(self, factor: float):
        return []  # not a closed-form frequency curve
