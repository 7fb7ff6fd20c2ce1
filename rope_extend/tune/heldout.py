"""Held-out comparison of the tuned specs against the closed forms at their defaults, with bootstrap intervals.

Every variant is evaluated on one held-out sequence of the target length (never the calibration text):
perplexity of the positions beyond the original window, of the whole sequence, and inside the window at shorter
lengths (2k and L by default). Forwards are shared where that is exact: for a static method the RoPE of a position
does not depend on the sequence length, so the first w positions of the target-length forward *are* a w-token
evaluation; dynamic methods (dynamic NTK, LongRoPE's short/long switch) get their own forward per length.

Uncertainty: the loss is summed over blocks of `block` tokens and blocks are resampled with replacement (the same
indices for every variant, so differences between variants are paired).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..eval.perplexity import token_losses
from ..eval.stats import Estimate
from ..eval.texts import LICENSES_DIR, license_files
from ..formatting import fmt_clock
from ..methods import closed_forms, get_method
from ..patch import patch_model, unpatch_model
from ..plan import PatchPlan
from .log import SearchLog

# Held-out corpus ("licenses"): distinct licence texts shipped with Debian/Ubuntu, in this order and unstripped (the
# order and bytes the shipped tune evidence was measured on; eval's `debian_licenses` text orders them differently).
# GPL = GPL-3 and LGPL = LGPL-3 are links, and the older GFDL/LGPL versions nearly repeat the newer ones.
LICENSE_FILES = ["GPL-3", "Apache-2.0", "MPL-2.0", "GFDL-1.3", "CC0-1.0", "Artistic", "GPL-2", "BSD", "MPL-1.1"]


def license_text(directory: str | Path = LICENSES_DIR) -> str:
    """The held-out corpus: the licence texts above that exist, joined by blank lines (about 30k SmolLM2 tokens)."""
    text, missing = license_files(LICENSE_FILES, directory, strip=False)
    if len(missing) == len(LICENSE_FILES):
        raise FileNotFoundError(
            f"no licence texts in {directory}; pass a held-out text file with --heldout instead"
        )
    return text


@dataclass(frozen=True)
class HeldoutVariant:
    """One model the held-out comparison scores: a name and its spec (not eval's `eval.variants.Variant`, a
    parsed spec evaluated by the suite)."""

    name: str
    spec: dict[str, Any] | None  # None = the unpatched model

    @property
    def key(self) -> str:
        text = json.dumps(self.spec, sort_keys=True, default=float)
        return hashlib.sha256(f"{self.name}|{text}".encode()).hexdigest()[:16]

    def same_model(self, other: HeldoutVariant, original_length: int) -> bool:
        """Same spec once the original length written out equals the model's (a tuned closed form that is a
        default, e.g. YaRN x2, is not evaluated twice)."""

        def norm(spec):
            if spec is None:
                return None
            spec = dict(spec)
            if spec.get("original_max_position_embeddings") == original_length:
                spec.pop("original_max_position_embeddings")
            return {k: float(v) if isinstance(v, int) and not isinstance(v, bool) else v for k, v in spec.items()}

        return norm(self.spec) == norm(other.spec)


def default_variants(factor: float) -> list[HeldoutVariant]:
    """The closed forms at their default parameters (the issue's comparison set: the registry's `closed_forms()`)."""
    return [HeldoutVariant("unpatched", None)] + [HeldoutVariant(f"{m} x{factor:g}", {"method": m, "factor": factor})
                                           for m in closed_forms()]


def _is_static(spec: dict[str, Any] | None) -> bool:
    return spec is None or not get_method(spec["method"]).depends_on_length(spec)


def original_inside(plan: PatchPlan | None, length: int) -> bool:
    """True when `plan` (None: the unpatched model) gives the model exactly its original RoPE for a sequence of
    `length` tokens (dynamic NTK below the window, for example), so an unpatched evaluation at that length is this
    variant's too."""
    if plan is None:
        return True
    from ..methods import default_inv_freq

    for slot in plan.targets:
        inv_freq, attention = plan.method.compute(plan.context(slot, seq_len=length))
        original = default_inv_freq(plan.rotary_dims[slot], plan.base_theta)
        if float(attention) != 1.0 or not torch.equal(inv_freq.float(), original.float()):
            return False
    return True


def _blocks(losses: torch.Tensor, block: int) -> dict[str, list[float]]:
    losses = losses.double()
    sums = [float(losses[i : i + block].sum()) for i in range(0, losses.numel(), block)]
    counts = [int(losses[i : i + block].numel()) for i in range(0, losses.numel(), block)]
    return {"sums": sums, "counts": counts}


def evaluate_variant(
    model,
    token_ids: torch.Tensor,
    variant: HeldoutVariant,
    original_length: int,
    target_length: int,
    windows: tuple[int, ...] = (2048,),
    block: int = 128,
    tokenizer=None,
    passkey_samples: int = 0,
    seed: int = 0,
    unpatched: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Loss blocks of one variant: beyond the window, whole sequence, and inside-window lengths.

    `unpatched`: the unpatched model's record, reused for the inside-window lengths at which a dynamic variant
    is exactly the original model (see `original_inside`)."""
    ids = token_ids.reshape(-1)
    if ids.numel() < target_length:
        raise ValueError(
            f"the held-out text has {ids.numel()} tokens but the comparison needs {target_length}; use a longer text"
        )
    start = time.perf_counter()
    windows = tuple(sorted({w for w in windows if w < original_length} | {original_length}))
    plan = patch_model(model, variant.spec).plan if variant.spec is not None else None
    try:
        reuse = {w: unpatched is not None and not _is_static(variant.spec) and original_inside(plan, w)
                 for w in windows}
        full = token_losses(model, ids[:target_length])
        out: dict[str, Any] = {
            "beyond": _blocks(full[original_length - 1 :], block),
            "whole": _blocks(full, block),
        }
        shared = _is_static(variant.spec)
        out["reused_unpatched"] = []
        for w in windows:
            if reuse[w]:
                out[f"inside_{w}"] = unpatched[f"inside_{w}"]
                out["reused_unpatched"].append(w)
                continue
            losses = full[: w - 1] if shared else token_losses(model, ids[:w])
            out[f"inside_{w}"] = _blocks(losses, block)
        out["shared_forward"] = shared
        if passkey_samples:
            out["passkey"] = passkey(model, tokenizer, target_length, passkey_samples, seed)
    finally:
        if variant.spec is not None:
            unpatch_model(model)
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def passkey(model, tokenizer, length: int, samples: int, seed: int = 0) -> dict[str, Any]:
    """Greedy passkey retrieval with the eval library's probes: `samples` prompts of `length` tokens (the 8
    generated tokens included), depths spread evenly over the context.

    The prompts share instructions and filler up to their key, so each reuses the KV cache of the previous one
    (`eval.probes.run_probes_sharing_prefix`). Exact for every method: all prompts have the same length, and a
    patched dynamic method holds one scale per `generate` request of that length."""
    from ..eval.probes import make_passkey, run_probes_sharing_prefix

    if tokenizer is None:
        raise ValueError("passkey needs the tokenizer; pass tokenizer=...")
    prompts = [make_passkey(tokenizer, length - 8, depth=(i + 0.5) / samples, index=i, seed=seed)
               for i in range(samples)]
    results = run_probes_sharing_prefix(model, tokenizer, prompts)
    scores = [r["score"] for r in results]
    return {"accuracy": sum(scores) / len(scores), "scores": scores, "outputs": [r["output"] for r in results]}


def compare(
    model,
    token_ids: torch.Tensor,
    variants: list[HeldoutVariant],
    original_length: int,
    target_length: int,
    *,
    windows: tuple[int, ...] = (2048,),
    block: int = 128,
    tokenizer=None,
    passkey_samples: int = 0,
    log_path=None,
    resume: bool = True,
    header: dict[str, Any] | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Evaluate every variant (resumable: one fsynced line per variant in `log_path`)."""
    settings = {
        "original_length": original_length,
        "target_length": target_length,
        "windows": list(windows),
        "block": block,
        "passkey_samples": passkey_samples,
        "text_sha": hashlib.sha256(token_ids.reshape(-1)[:target_length].numpy().tobytes()).hexdigest()[:16],
        **(header or {}),
    }
    log = SearchLog(log_path, settings, resume=resume)
    records = []
    started, fresh_seconds, fresh = time.perf_counter(), 0.0, 0
    for n, variant in enumerate(variants, 1):
        rec = log.get(variant.key, target_length)
        twin = next((r for r in records if HeldoutVariant(r["name"], r["spec"]).same_model(variant, original_length)), None)
        if rec is None and twin is not None:
            rec = {**twin, "key": variant.key, "name": variant.name, "spec": variant.spec, "same_as": twin["name"]}
        elif rec is None:
            unpatched = next((r for r in records if r["spec"] is None), None)
            res = evaluate_variant(model, token_ids, variant, original_length, target_length, windows, block,
                                   tokenizer, passkey_samples, unpatched=unpatched)
            rec = {"key": variant.key, "length": target_length, "name": variant.name, "spec": variant.spec, **res}
            log.add(rec)
            fresh, fresh_seconds = fresh + 1, fresh_seconds + rec["seconds"]
        records.append(rec)
        if progress:
            ppl = math.exp(sum(rec["beyond"]["sums"]) / sum(rec["beyond"]["counts"]))
            # ETA: the mean time of the variants evaluated in this run, for each one still to go (an upper bound:
            # variants that share a model with an earlier one cost nothing)
            eta = fmt_clock(fresh_seconds / fresh * (len(variants) - n)) if fresh else "?"
            print(f"[heldout {n}/{len(variants)}] {variant.name}: ppl beyond {ppl:.3f} ({rec['seconds']:.0f}s) | "
                  f"{fmt_clock(time.perf_counter() - started)} elapsed, ETA {eta}", file=sys.stderr, flush=True)
    return records


# --- statistics -------------------------------------------------------------------------------------------------------
def bootstrap_indices(n_blocks: int, n_boot: int = 2000, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_blocks, (n_boot, n_blocks), generator=gen)


def ppl_interval(blocks: dict[str, list[float]], n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> Estimate:
    """(perplexity, low, high) with a percentile bootstrap over token blocks."""
    sums = torch.tensor(blocks["sums"], dtype=torch.float64)
    counts = torch.tensor(blocks["counts"], dtype=torch.float64)
    idx = bootstrap_indices(sums.numel(), n_boot, seed)
    boot = torch.exp(sums[idx].sum(1) / counts[idx].sum(1))
    lo, hi = torch.quantile(boot, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)).tolist()
    return Estimate(math.exp(float(sums.sum() / counts.sum())), lo, hi)


def relative_interval(blocks, ref_blocks, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> Estimate:
    """Paired bootstrap of ppl(variant) / ppl(reference) - 1 (same blocks resampled for both)."""
    a, ca = torch.tensor(blocks["sums"], dtype=torch.float64), torch.tensor(blocks["counts"], dtype=torch.float64)
    b, cb = torch.tensor(ref_blocks["sums"], dtype=torch.float64), torch.tensor(ref_blocks["counts"], dtype=torch.float64)
    if a.numel() != b.numel():
        raise ValueError("paired bootstrap needs the same blocks for both variants")
    idx = bootstrap_indices(a.numel(), n_boot, seed)
    boot = torch.exp(a[idx].sum(1) / ca[idx].sum(1) - b[idx].sum(1) / cb[idx].sum(1)) - 1
    lo, hi = torch.quantile(boot, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)).tolist()
    point = math.exp(float(a.sum() / ca.sum() - b.sum() / cb.sum())) - 1
    return Estimate(point, lo, hi)
