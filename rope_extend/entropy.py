"""Attention entropy per layer vs context length, for an unpatched and patched model.

The entropy of one query's attention row p (over the keys it may see) is H = -Σ_j p_j ln p_j (nats): 0 when the
query looks at one key, ln n when it spreads evenly over n keys. As a model reads past its pretraining length, or
after interpolation packs more positions into the same angles, the rows spread out and the mean entropy grows;
YaRN's temperature multiplies cos/sin by t = 0.1 ln s + 1, so the logits grow by t² and the entropy drops back.
`compare_entropy` shows it: yarn and ntk-by-parts have the same frequencies and differ only in that factor.

The weights come from eager attention (the only implementation that materialises them). Each attention module is
hooked, and its row entropies are reduced to one number per layer at once, so memory stays O(heads · n²) for one
layer instead of all layers (what `output_attentions=True` would keep).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["attention_entropy", "compare_entropy", "plot_entropy", "row_entropy"]


def row_entropy(weights: torch.Tensor) -> torch.Tensor:
    """-Σ p ln p over the last dimension (0 ln 0 = 0), in float64."""
    p = weights.double()
    return -torch.special.xlogy(p, p).sum(dim=-1)


def _attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The self-attention module of each decoder layer, in order."""
    found = []
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("self_attn", "attention", "attn") and type(module).__name__.endswith("Attention"):
            found.append((name, module))
    if not found:
        found = [(n, m) for n, m in model.named_modules() if type(m).__name__.endswith("Attention")]
    return found


def _set_eager(model: nn.Module) -> str | None:
    """Switch to eager attention if needed; return the implementation to restore (None: nothing changed)."""
    current = getattr(model.config, "_attn_implementation", None)
    if current in (None, "eager"):
        return None
    setter = getattr(model, "set_attn_implementation", None)
    if not callable(setter):
        raise ValueError(
            f"attention entropy needs eager attention, the model uses {current!r}; load it with "
            "attn_implementation='eager'"
        )
    setter("eager")
    return current


@torch.no_grad()
def attention_entropy(
    model: nn.Module,
    input_ids: torch.Tensor,
    lengths: Iterable[int],
    *,
    queries: int | None = None,
) -> dict[int, list[float]]:
    """{length: [mean attention entropy (nats) of each layer]} for the first `length` tokens of `input_ids`.

    The mean runs over the batch, the heads and the query positions (all of them, or the last `queries` only:
    those see about `length` keys, which is what "entropy at length n" usually means). The model runs with eager
    attention (switched temporarily if it was loaded with another implementation) and no cache.
    """
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    lengths = [int(n) for n in lengths]
    if not lengths:
        raise ValueError("give at least one context length")
    bad = [n for n in lengths if n < 1 or n > input_ids.shape[-1]]
    if bad:
        raise ValueError(
            f"length {bad[0]} is outside 1..{input_ids.shape[-1]} (the number of input tokens); give a longer text "
            "or shorter lengths"
        )
    if queries is not None and queries < 1:
        raise ValueError(f"queries must be a positive number of query positions, got {queries}")
    modules = _attention_modules(model)
    if not modules:
        raise ValueError(f"no attention modules found in {type(model).__name__}")
    restore = _set_eager(model)
    sums: list[float | None] = [None] * len(modules)
    device = next(model.parameters()).device

    def hook_for(index: int):
        def hook(module, args, output):
            weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if not isinstance(weights, torch.Tensor) or weights.dim() != 4:
                raise ValueError(
                    f"{type(module).__name__} returned no attention weights; load the model with "
                    "attn_implementation='eager'"
                )
            if queries is not None:
                weights = weights[..., -queries:, :]
            sums[index] = float(row_entropy(weights).mean())  # rows: [batch, heads, queries]

        return hook

    handles = [module.register_forward_hook(hook_for(i)) for i, (_, module) in enumerate(modules)]
    was_training = model.training
    model.eval()
    try:
        result: dict[int, list[float]] = {}
        for n in lengths:
            sums[:] = [None] * len(modules)
            model(input_ids=input_ids[:, :n].to(device), use_cache=False)
            if any(value is None for value in sums):
                raise ValueError("some attention layers did not run; is this a decoder-only model?")
            result[n] = [float(v) for v in sums]
        return result
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
        if restore is not None:
            model.set_attn_implementation(restore)


def compare_entropy(
    model: nn.Module,
    input_ids: torch.Tensor,
    lengths: Iterable[int],
    variants: Mapping[str, Any],
    *,
    queries: int | None = None,
) -> dict[str, dict[int, list[float]]]:
    """Entropy for several RoPE variants of the same model: {label: {length: [per layer]}}.

    `variants` maps a label to a spec (`RopeSpec`, dict, YAML path, or None for the unpatched model), e.g.
    {"original": None, "ntk-by-parts": {"method": "ntk-by-parts", "factor": 4}, "yarn": {"method": "yarn",
    "factor": 4}}. Each variant is patched in place with `patch_model` and undone afterwards.
    """
    from .patch import patch_model, unpatch_model

    lengths = list(lengths)
    results: dict[str, dict[int, list[float]]] = {}
    for label, spec in variants.items():
        unpatch_model(model)
        try:
            if spec is not None:
                patch_model(model, spec)
            results[label] = attention_entropy(model, input_ids, lengths, queries=queries)
        finally:
            unpatch_model(model)
    return results


def mean_entropy(per_length: Mapping[int, list[float]]) -> dict[int, float]:
    """{length: entropy averaged over layers}."""
    return {n: sum(v) / len(v) for n, v in per_length.items()}


def plot_entropy(
    results: Mapping[str, Mapping[int, list[float]]] | Mapping[int, list[float]],
    path: str | Path,
    original_length: int | None = None,
    title: str | None = None,
) -> Path:
    """PNG: mean entropy (over layers) vs length per variant, and entropy per layer at the longest length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if results and all(isinstance(k, int) for k in results):
        results = {"model": results}  # a single attention_entropy() result
    from .plotstyle import styles_for

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    styles = styles_for(results)  # colour-blind-safe colour, marker and dash per variant
    for label, per_length in results.items():
        lengths = sorted(per_length)
        means = mean_entropy(per_length)
        look = {"color": styles[label]["color"], "marker": styles[label]["marker"], "ls": styles[label]["ls"]}
        left.plot(lengths, [means[n] for n in lengths], label=label, **look)
        longest = per_length[lengths[-1]]
        right.plot(range(len(longest)), longest, label=f"{label} @ {lengths[-1]}", **look)
    if original_length:
        left.axvline(original_length, color="grey", linewidth=1, linestyle="--")
        left.text(original_length, left.get_ylim()[0], f" L = {original_length}", color="grey", va="bottom")
    ticks = sorted({n for per_length in results.values() for n in per_length} | ({original_length} - {None}))
    left.set_xscale("log", base=2)
    left.set_xticks(ticks, [str(n) for n in ticks])
    left.minorticks_off()
    left.set(xlabel="context length (tokens)", ylabel="mean attention entropy (nats)",
             title="entropy vs length (mean over layers)")
    right.set(xlabel="layer", ylabel="attention entropy (nats)", title="entropy per layer at the longest length")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
    return path
