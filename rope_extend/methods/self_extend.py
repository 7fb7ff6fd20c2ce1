"""SelfExtend (Jin et al. 2024, "LLM Maybe LongLM"): grouped positions for distant keys, neighbour window exact.

For a query at position i and a key at j (distance d = i - j): d < W keeps the original distance; otherwise the
distance is (i // G + W - W // G) - j // G, so every distance stays below the original length L as long as the
reach rule N <= (L - W)·G + W holds for the target length N. One softmax over both maps (`rope_extend.attention`).

Defaults from the target length N: W = L / 8, and the smallest G >= 2 (dividing W where possible) whose largest
distance W + (N - W) / G is at most 5/8 of L (the authors' rule of thumb: 1/2 to 2/3 of L).
"""

from __future__ import annotations

import math

from .attention_level import LOG_N, AttentionAdvice, AttentionGguf, AttentionMethod
from .registry import Param, register

LARGEST_SHARE = 0.625  # the largest distance the defaults aim for, as a share of L


def largest_distance(n: int, group: int, window: int) -> int:
    """The largest mapped distance of a prompt of n tokens (query n - 1, key 0)."""
    if n - 1 < window:
        return n - 1
    return (n - 1) // group + window - window // group


def default_group(n: int, original: int, window: int) -> int:
    """The smallest G >= 2 whose largest distance is <= 5/8 L (G dividing W preferred), else the reach rule's."""
    goal = int(LARGEST_SHARE * original)
    reach = max(2, math.ceil((n - window) / max(1, original - window)))
    if window < goal:
        need = max(2, math.ceil((n - window) / (goal - window)))
        dividing = [g for g in range(need, min(window, 4 * need) + 1) if window % g == 0]
        return dividing[0] if dividing else need
    return reach


class SelfExtend(AttentionMethod):
    name = "self-extend"
    aliases = ("selfextend", "self_extend", "longlm")
    params = {
        "group_size": Param(int, None, "G: distant keys share positions in groups of G (default: from the target "
                            "length)", positive=True, derived="smallest G ≥ 2 with W + (N−W)/G ≤ 5L/8"),
        "neighbor_window": Param(int, None, "W: keys closer than W keep their exact distance (default L/8)",
                                 positive=True, derived="L/8"),
        "log_n": LOG_N,
    }
    formula = "original θ_i; distance d if d < W else i//G − j//G + W − W//G"
    use_when = ("Retrieval beyond L without training, served in-process with rope_extend.patch_model "
                "(stock engines serve the model without it, its own RoPE and window); measured ahead of frequency scaling at 2x, behind it "
                "at 4x with its defaults (docs/results-retrieval.md)")
    paper = "https://arxiv.org/abs/2401.01325"

    def validate(self, spec) -> None:
        super().validate(spec)
        original = spec.original_max_position_embeddings
        window = spec.neighbor_window
        if window is not None and original is not None and window >= original:
            raise ValueError(
                f"neighbor_window {window} must be below the original length {original} (keys closer than W keep "
                f"their exact distance); choose e.g. {original // 8}"
            )

    def fill_params(self, spec):
        L, N = spec.original_max_position_embeddings, spec.target_length
        window = spec.neighbor_window if spec.neighbor_window is not None else max(1, L // 8)
        if window >= L:
            raise self._error(
                f"neighbor_window {window} must be below the original length {L}; choose e.g. {L // 8}",
                "neighbor_window", window)
        group = spec.group_size if spec.group_size is not None else default_group(N, L, window)
        if N > (L - window) * group + window:
            raise self._error(
                f"self-extend with group_size {group} and neighbor_window {window} reaches "
                f"{(L - window) * group + window} tokens, below the target length {N}: the reach rule is "
                f"N <= (L - W)·G + W with L = {L}; raise group_size to at least "
                f"{math.ceil((N - window) / (L - window))} or lower the target",
                "group_size", group)
        return spec.model_copy(update={"group_size": int(group), "neighbor_window": int(window)})

    def mapping(self, spec):
        from ..attention.maps import SelfExtendMap

        return SelfExtendMap(int(spec.group_size), int(spec.neighbor_window))


class SelfExtendAdvice(AttentionAdvice):
    def alternative(self, factor: float, recommended: str) -> str | None:
        return (
            "for retrieval and perplexity beyond L without training, in-process (rope_extend.patch_model; it remaps "
            "attention positions and keeps the model's own RoPE), best at 2x on SmolLM2-135M"
            + ("; beyond 2x add --set log_n=true (measured at 4x: it then ties dynamic on retrieval, with lower "
               "perplexity than any frequency method)" if factor > 2 else "; at 4x add --set log_n=true")
            + ". Measured fast on CPU, not yet on a GPU (use a frequency method there); engines serve the model "
            "without it (serve yarn there)"
        )


SELF_EXTEND = register(SelfExtend(), gguf=AttentionGguf, advice=SelfExtendAdvice)
