"""What self-extend, dual-chunk and STRING share: methods that act on attention, on top of the model's RoPE.

The frequencies stay the model's own (`compute` returns the original ones; STRING keeps a shipped scheme), so the
config keeps its RoPE slot and `max_position_embeddings` = L: stock loaders (transformers, vLLM, SGLang) serve the
model without the method from such a checkpoint, and the `rope_extend` marker carries the spec, which
`patch_model(model)` re-applies in-process. The attention itself lives in `rope_extend.attention`, imported only by
`install_attention`. Their engine rules (`AttentionEngines`: every engine serves that model, up to L), GGUF refusal
and advice are the adapters below.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ..errors import SpecError
from .registry import (
    Advice,
    EngineRule,
    EngineRules,
    GgufRules,
    Param,
    RopeContext,
    RopeMethod,
    default_inv_freq,
    engine_rules,
    gguf_refusal,
)

LOG_N = Param(bool, False, "multiply each query's logits by max(1, ln(p+1)/ln(L)) (Qwen's logn attention)")


class AttentionMethod(RopeMethod):
    acts_on_attention = True
    hf_rope_type = "default"
    attention = "1 (the attention itself is remapped)"

    # -- math -------------------------------------------------------------------------------------------------
    def _compute(self, ctx: RopeContext):
        return default_inv_freq(ctx.rotary_dim, ctx.base, ctx.device), 1.0

    def mapping(self, spec) -> Any:
        """The position map `rope_extend.attention.kernels` applies (from a spec `fill_params` completed)."""
        raise NotImplementedError

    def install_attention(self, model, plan) -> list[Any]:
        from ..attention import runtime

        return runtime.install(model, plan, self.mapping(plan.spec), bool(plan.spec.method_params().get("log_n")))

    @staticmethod
    def _error(message: str, field: str, value: Any) -> SpecError:
        return SpecError(message, field=field, value=value)

    # -- config -----------------------------------------------------------------------------------------------
    def max_position_embeddings(self, spec) -> int:
        return int(spec.original_max_position_embeddings)  # stock loaders serve the original model

    # What stock loaders serve from such a checkpoint, in the words of the notes and engine warnings.
    served: ClassVar[str] = "the ORIGINAL model"  # the model they serve
    served_rope: ClassVar[str] = "original RoPE"  # its RoPE

    def marker_note(self, spec) -> str | None:
        return (
            f"the original model (RoPE and max_position_embeddings {spec.original_max_position_embeddings} "
            f"unchanged): {self.name} acts on attention; call rope_extend.patch_model(model) after loading to "
            "re-apply it"
        )

    def loader_notes(self, spec) -> list[str]:
        return [
            f"{self.name} acts on attention, which no config key carries: stock transformers, vLLM and SGLang serve "
            f"{self.served} (up to {spec.original_max_position_embeddings} tokens) from this checkpoint; call "
            "rope_extend.patch_model(model) after loading to re-apply it in-process"
        ]


class AttentionEngines(EngineRules):
    """Every engine serves what stock loaders read from such a checkpoint (`AttentionMethod.served`), up to L."""

    llama_cpp_note: ClassVar[str]  # what llama.cpp offers instead

    def no_stock_engine(self, L: int) -> str:
        """Why vLLM/SGLang cannot serve the method (the end of their warning)."""
        name = self.method.name
        return f"it has no {name} for LLaMA-family models; beyond {L} tokens only rope_extend.patch_model serves {name}"

    def rule(self, engine, plan, version):
        method, L = self.method, plan.spec.original_max_position_embeddings
        if engine == "transformers":
            return EngineRule(max_len=L, warnings=[
                f"stock transformers loads this checkpoint as {method.served} ({method.served_rope}, "
                f"max_position_embeddings {L}): {method.name} acts on attention and no config key carries it; call "
                "rope_extend.patch_model(model) after loading to re-apply it from the rope_extend marker"
            ])
        if engine in ("vllm", "sglang"):
            return EngineRule(max_len=L, warnings=[
                f"{version} serves {method.served} from this checkpoint, so the command serves {L} tokens: "
                f"{self.no_stock_engine(L)}"
            ])
        return self.llama_cpp_rule(plan)

    def llama_cpp_rule(self, plan) -> EngineRule:
        L = plan.spec.original_max_position_embeddings
        return EngineRule(max_len=L, flags=None, convertible=False, warnings=[
            f"llama.cpp serves {self.method.served} from this checkpoint (up to {L} tokens): {self.llama_cpp_note}"
        ])

    def llama_cpp_flags(self, spec) -> str:
        """What to run in llama.cpp instead (the run-time flags, where llama.cpp has an equivalent)."""
        return self.llama_cpp_note

    def not_served(self, plan) -> str | None:
        return (f"serves the ORIGINAL model (its RoPE and attention); {plan.spec.method} acts on attention, which "
                "only rope_extend.patch_model applies")


class AttentionGguf(GgufRules):
    def rope(self, spec, base, rope_dim, inv_freq, attention_factor):
        raise gguf_refusal(
            self.method.name,
            "it acts on attention at run time and nothing in a GGUF carries it",
            f"serve the original GGUF instead; {engine_rules(self.method).llama_cpp_flags(spec)}",
        )


class AttentionAdvice(Advice):
    def tune_candidates(self, factor: float):
        return []  # not a closed-form frequency curve
