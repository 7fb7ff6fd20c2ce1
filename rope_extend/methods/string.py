"""STRING (An et al. 2025, "Why Does the Effective Context Length of LLMs Fall Short?", ShifTed Rotray position
embeddING): the well-trained small distances overwrite the rarely trained large ones, inside the window.

For a query at position i and a key at j (distance d = i - j): d < S (`shifted_offset`) keeps d; d >= S uses
d - S + W (`local_value`). Two passes merged exactly by log-sum-exp (`rope_extend.attention`): a neighbour pass
(original positions, d < S) and a shifted pass (queries rotated at i - S + W, original keys, d >= S). The keys are
never moved, so the KV cache holds the model's own rotated keys and a decoding step rotates no key.

It keeps the model's RoPE as shipped (Llama 3.1's llama3 x8, Qwen2.5's YaRN, Gemma 3's per-layer-type RoPE): the
rotations use the model's own inverse frequencies and attention factor, and the config is left unchanged.

Decisions (docs/attention-methods.md, "STRING"; each pinned by a test in tests/test_string.py):
- d = S is shifted (the paper's rule, and the authors' decoding step). The authors' prefill
  (`string_for_llama.py`) counts d = S in both passes (a flash-attn window of [S, 0] includes it), so their
  decoding differs from their prefill; here a prefill, a prefill in pieces and token-by-token decoding agree.
- `attention_factor` multiplies cos and sin of every query and key (every logit by its square), on top of the
  model's own attention factor; bounded to [0.5, 1.5] (a temperature correction of YaRN's size). The authors' Llama
  code sets 0.1·ln 2 + 1 (YaRN's at s = 2); the paper's method has none, so the default is 1: the original model
  for every distance below S. attention_factor=1.0693 is the authors' Llama setting; on Qwen2 they replace the
  model's YaRN (and its attention factor) with their own, which this method does not (docs/attention-methods.md,
  "Per family").
- Beyond the window L (a target N > L): S is raised to N - L + W when needed, so the largest distance used,
  N - 1 - S + W, stays below L; S may not exceed L, so N <= 2L - W. Longer targets are refused, naming
  self-extend, dual-chunk and yarn. Without a target, N = L.
"""

from __future__ import annotations

import math

from .attention_level import AttentionAdvice, AttentionGguf, AttentionMethod
from .registry import Param, register

SHIFTED_SHARE = 0.33  # the authors' default shifted_offset, as a share of the window (they suggest 0.25-0.4)
AUTHORS_ATTENTION_FACTOR = 1.0693147180559945  # 0.1·ln 2 + 1, what the authors' string_for_llama.py sets
ATTENTION_FACTOR_RANGE = (0.5, 1.5)  # logits times 0.25 .. 2.25: a temperature correction, not another softmax


def largest_distance(n: int, shifted_offset: int, local_value: int) -> int:
    """The largest distance a prompt of n tokens uses (query n - 1, key 0)."""
    return n - 1 if n - 1 < shifted_offset else n - 1 - shifted_offset + local_value


def minimum_offset(target: int, window: int, local_value: int) -> int:
    """The smallest S whose largest distance N - 1 - S + W stays below L (0 inside the window)."""
    return max(0, target - window + local_value)


class String(AttentionMethod):
    name = "string"
    aliases = ()
    needs_factor = False
    works_inside_window = True
    params = {
        "shifted_offset": Param(int, None, "S: distances d >= S become d - S + W (the authors: 0.25-0.4 of the "
                                "window); default 0.33·L, raised to N - L + W for a target N beyond L",
                                positive=True, derived="0.33·L"),
        "local_value": Param(int, 128, "W: the distance the key at d = S takes (the authors: 128; 256 or 512 when "
                             "results disappoint)", positive=True),
        "attention_factor": Param(float, 1.0, "multiplies cos and sin of every query and key, on top of the model's "
                                  "own factor, so every logit by its square; 0.5 to 1.5 (the authors' Llama code: "
                                  "0.1·ln 2 + 1 = 1.0693)", positive=True),
    }
    formula = "the model's own θ_i (its scheme kept); distance d if d < S else d − S + W"
    attention = "the model's own × attention_factor (default 1; the authors' Llama code 0.1·ln 2 + 1)"
    use_when = ("Inside the window a model already claims, when it misses distant keys there (the authors: Llama "
                "3.1 and Qwen2 at 128k); keeps a shipped scheme; in-process with rope_extend.patch_model (stock "
                "engines serve the model without it); targets up to 2L − W")
    paper = "https://arxiv.org/abs/2410.18745"
    def validate(self, spec) -> None:
        super().validate(spec)
        offset, local, factor = spec.shifted_offset, spec.local_value, spec.attention_factor
        if offset is not None and local is not None and local >= offset:
            raise ValueError(
                f"local_value {local} must be below shifted_offset {offset} (the key at distance S moves to W, so "
                f"W >= S would move distances up, not down); lower local_value or raise shifted_offset"
            )
        if factor is not None and not ATTENTION_FACTOR_RANGE[0] <= factor <= ATTENTION_FACTOR_RANGE[1]:
            low, high = ATTENTION_FACTOR_RANGE
            raise ValueError(
                f"attention_factor {factor:g} must lie in [{low:g}, {high:g}]: it multiplies cos and sin of every "
                f"query and key, so every logit by its square ({factor * factor:.3g}x here), a temperature "
                f"correction of the size of YaRN's (0.1·ln s + 1: {AUTHORS_ATTENTION_FACTOR:.4f} at s = 2, the "
                f"authors' value; {0.1 * math.log(64) + 1:.3f} at s = 64); beyond that range the softmax is another "
                "model's, and far beyond it the logits overflow; 1 (the default) leaves the logits as they are"
            )

    def fill_params(self, spec):
        L, N = spec.original_max_position_embeddings, spec.target_length
        local = spec.local_value if spec.local_value is not None else self.params["local_value"].default
        default_offset = int(SHIFTED_SHARE * L)
        if local >= L:
            raise self._error(
                f"local_value {local} must be below the window L = {L}: the key at distance S moves to W, and S is at "
                f"most L; the authors use 128 (256 or 512 when results disappoint)", "local_value", local)
        target = f"the target length {N}" if N != L else f"the window's own length L = {L}"
        need = minimum_offset(N, L, local)
        if N > 2 * L - local:
            raise self._error(
                f"string keeps every distance inside the window L = {L} by shifting, which reaches at most "
                f"2L - W = {2 * L - local} tokens (local_value W = {local}), below {target}; lower the target or "
                "local_value, or for longer inputs use self-extend, dual-chunk or yarn", "target_length", N)
        given = spec.shifted_offset
        offset = given if given is not None else max(default_offset, need)
        if offset > L:
            raise self._error(
                f"shifted_offset {offset} is beyond the window L = {L}: the neighbour pass would use distances the "
                f"model never saw; choose at most {L} (default {default_offset})", "shifted_offset", offset)
        if offset < need:
            raise self._error(
                f"shifted_offset {offset} lets {target} use distance {N - 1 - offset + local}, beyond the window "
                f"L = {L}: raise it to at least N - L + W = {need}, or lower the target", "shifted_offset", offset)
        if local >= offset:
            if given is not None:
                raise self._error(f"local_value {local} must be below shifted_offset {offset}; lower local_value",
                                  "local_value", local)
            raised = (f"its default 0.33·L = {default_offset} was raised to N - L + W = {need}, so that {target} "
                      f"keeps every distance below L" if need > default_offset else
                      f"its default is 0.33·L = {default_offset}")
            raise self._error(
                f"local_value {local} must be below shifted_offset S, which you did not set: {raised}; lower "
                f"local_value (the authors use 128; 256 or 512 when results disappoint) or set shifted_offset above "
                f"{local}", "local_value", local)
        factor = spec.attention_factor if spec.attention_factor is not None else 1.0
        return spec.model_copy(update={"shifted_offset": int(offset), "local_value": int(local),
                                       "attention_factor": float(factor)})

    def describe(self, spec) -> str:
        """The resolved parameters in words (the patch report)."""
        return (f"shifted_offset S {spec.shifted_offset}, local_value W {spec.local_value}, attention_factor "
                f"{spec.attention_factor:.4f}: distances d >= S use d - S + W, the largest "
                f"{largest_distance(spec.target_length, spec.shifted_offset, spec.local_value)} at target length "
                f"{spec.target_length}")

    def summary(self, plan) -> str:
        return (f"{self.name}: window {plan.spec.original_max_position_embeddings} (kept), on top of the model's own RoPE "
                f"({plan.kept_scheme}, its attention factor {plan.attention_factor:.4f}); "
                f"{self.describe(plan.spec)}")

    @property
    def elsewhere(self) -> str:
        return ("no stock engine has STRING (the authors' fork of vLLM 0.5 is not stock vLLM); only "
                "rope_extend.patch_model serves it")

    def mapping(self, spec):
        from ..attention.maps import StringMap

        return StringMap(int(spec.shifted_offset), int(spec.local_value), float(spec.attention_factor) ** 2)


class StringAdvice(AttentionAdvice):
    def inside_window(self) -> str | None:
        return ("if the model misses distant keys inside the window it already has: STRING, in-process "
                "(rope_extend.patch_model), keeps its RoPE and remaps the rarely trained large distances onto small "
                "ones (docs/attention-methods.md, 'STRING')")


STRING = register(String(), gguf=AttentionGguf, advice=StringAdvice)
