"""`rope-extend inspect --plot`: several methods' frequencies, wavelengths and RoPE kernels side by side (PNG)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..encodings import rope_kernel, rope_wavelengths
from ..errors import CheckpointError, SpecError
from ..methods import RopeContext, closed_forms, compute, default_inv_freq
from .table import inspect_rope


def method_curves(config, factor: float, methods=None) -> dict[str, tuple[torch.Tensor, float]]:
    """{label: (inv_freq, attention_factor)} for each method at `factor` (plus 'original'); default: the static
    closed forms of the registry (`closed_forms(static=True)`)."""
    base = inspect_rope(config)
    curves = {"original": (default_inv_freq(base.rotary_dim, base.base), 1.0)}
    for name in methods or closed_forms(static=True):
        ctx = RopeContext(
            rotary_dim=base.rotary_dim,
            base=base.base,
            original_max_position_embeddings=base.original_length,
            factor=float(factor),
            params={},
            seq_len=round(factor * base.original_length),
        )
        curves[name] = compute(name, ctx)
    return curves


def plot_methods(config, factor: float, path: str | Path, methods=None) -> Path:
    """PNG: inverse frequency, wavelength (original/target lengths marked) and the RoPE kernel per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..plotstyle import styles_for

    if not factor or factor < 1:
        raise SpecError(f"the plot factor must be >= 1, got {factor}", field="factor", value=factor)
    base = inspect_rope(config)
    original, target = base.original_length, round(factor * base.original_length)
    curves = method_curves(config, factor, methods)
    styles = styles_for(curves, reference="original")  # colour-blind-safe colour, marker and dash per method
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    index = range(base.rotary_dim // 2)
    distances = torch.linspace(0, target, 400)
    every = max(len(curves), 4)  # each method's markers on its own disks: curves drawn over each other all show
    for n, (label, (inv_freq, attention)) in enumerate(curves.items()):
        same = next((k for k in list(curves)[:n] if torch.allclose(curves[k][0].double(), inv_freq.double())), None)
        st = styles[label]
        style = {"color": st["color"], "linestyle": st["ls"], "marker": st["marker"], "markevery": (n % every, every),
                 "markersize": 8 if same else 5, "markerfacecolor": "none" if same else st["color"],
                 "linewidth": 2.2 if label == "original" else 1.6}
        name = label if attention == 1.0 else f"{label} (attn x{attention:.3f})"
        name += f" (= {same}'s frequencies)" if same else ""
        axes[0].plot(index, inv_freq.double().numpy(), label=name, **style)
        axes[1].plot(index, rope_wavelengths(inv_freq).numpy(), label=name, **style)
        axes[2].plot(distances.numpy(), rope_kernel(inv_freq, distances).numpy(), label=name,
                     **{**style, "markevery": ((n % every) * 100 // every, 100)})  # 4 of 400 points
    axes[0].set(yscale="log", xlabel="disk i", ylabel="θ_i (rad / token)", title="inverse frequency")
    axes[1].set(yscale="log", xlabel="disk i", ylabel="λ_i = 2π/θ_i (tokens)", title="wavelength")
    axes[1].axhline(original, color="grey", linewidth=1)
    axes[1].axhline(target, color="black", linewidth=1)
    axes[1].text(0, original, f" L = {original}", va="bottom", color="grey")
    axes[1].text(0, target, f" target = {target}", va="bottom")
    axes[2].set(xlabel="relative distance k (tokens)", ylabel="mean_i cos(θ_i k)", title="RoPE kernel")
    axes[2].axvline(original, color="grey", linewidth=1)
    axes[2].axvline(target, color="black", linewidth=1)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{base.model_type}: rotary dim {base.rotary_dim}, base {base.base:g}, factor {factor:g}")
    fig.tight_layout()
    path = Path(path)
    if path.parent and not path.parent.exists():
        raise CheckpointError(f"cannot write the plot: folder {str(path.parent)!r} does not exist")
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
    return path
