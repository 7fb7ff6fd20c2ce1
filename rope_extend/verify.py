"""What "verified" promises, in one function used by `patch_model` and by the checkpoint writer.

A patch is verified when (1) stock transformers, given the rewritten config, builds exactly the inverse frequencies
and attention factor rope-extend computed, AND (2) a real forward pass runs beyond the original length and agrees:
rope-extend's patched model and the stock-loaded model give the same outputs on a few tokens placed at positions
up to the target length. The forward runs on a small model of the same config with random weights (one layer per
layer type, small vocabulary: cheap, and enough because RoPE lives in attention), or, on the full checkpoint path,
on the real saved model against the real patched one. A checkpoint that would not run is never called verified.

It depends on planning (`plan`) and the module layer (`rotary`), not on `patch`, which calls it.
"""

from __future__ import annotations

import contextlib
import copy
import math
import warnings

import torch

from . import compat
from .errors import VerificationError
from .plan import PatchPlan, verify_stock_config
from .rotary import apply_plan, find_rotary_modules

PROBE_VOCAB = 256
SMALL_INTERMEDIATE = 64
RTOL = {torch.float32: 1e-4, torch.float64: 1e-6}  # relative to the output scale; half precision below
HALF_RTOL = 3e-2


def probe_inputs(plan: PatchPlan, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Six tokens at positions 0, 1, L-1, L, N-2 and N-1 (L original, N target length): relative distances from 1 to
    N-1 go through every rotary frequency, the last tokens are beyond the original window, and N-1 makes dynamic
    methods compute their scale at the target length, where stock loaders' static equivalent (dynamic-yarn ->
    yarn) must agree. (The caller keeps the KV cache on: transformers 5 reads position jumps without a cache as
    packed sequences and would mask the tokens from each other.)"""
    original, target = plan.spec.original_max_position_embeddings, plan.spec.target_length
    positions = sorted({0, 1, max(original - 1, 0), min(original, target - 1), max(target - 2, 0), target - 1})
    low = min(3, vocab_size - 1)
    generator = torch.Generator().manual_seed(1234)
    ids = torch.randint(low, vocab_size, (1, len(positions)), generator=generator)
    return ids, torch.tensor([positions], dtype=torch.long)


@torch.no_grad()
def probe_outputs(model, plan: PatchPlan) -> torch.Tensor:
    """The model's outputs (logits, or last hidden states for a base model) on the probe, as float32 on CPU."""
    vocab = int(getattr(compat.text_config(model.config), "vocab_size", None) or PROBE_VOCAB)
    ids, positions = probe_inputs(plan, vocab)
    device = next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))
    try:
        output = model(input_ids=ids.to(device), position_ids=positions.to(device), use_cache=True)
    except Exception as exc:  # whatever the modeling code raises: the model cannot run
        raise VerificationError(_cannot_run(model.config, exc)) from None
    values = getattr(output, "logits", None)
    if values is None:
        values = output.last_hidden_state
    values = values.detach().float().cpu()
    if not torch.isfinite(values).all():
        raise VerificationError(
            f"a forward pass at positions up to {plan.spec.target_length - 1} gives non-finite outputs (NaN or "
            "infinity); the patched RoPE does not run in this model"
        )
    return values


def _cannot_run(config, exc: Exception) -> str:
    reason = " ".join(str(exc).split())[:200] or type(exc).__name__
    hint = ""
    text = compat.text_config(config)
    factor = getattr(text, "partial_rotary_factor", None)
    with contextlib.suppress(Exception):  # best effort: this only words the hint
        for params in compat.read_slots(text).values():  # 5.x moves it into rope_parameters
            factor = params.get("partial_rotary_factor", factor)
    if factor not in (None, 1, 1.0):
        hint = (f"; the config sets partial_rotary_factor {factor}, which {text.model_type}'s attention does not "
                "apply to every head dimension: remove the key from config.json if the model does not use it")
    return f"the patched model cannot run a forward pass ({type(exc).__name__}: {reason}){hint}"


def _small_config(config):
    """The same config with one layer per layer type, a small vocabulary and a small MLP (RoPE is untouched)."""
    small = copy.deepcopy(compat.text_config(config))
    layer_types = getattr(small, "layer_types", None)
    if isinstance(layer_types, list) and layer_types:
        small.layer_types = list(dict.fromkeys(layer_types))
        small.num_hidden_layers = len(small.layer_types)
    else:
        small.num_hidden_layers = 1
    vocab = int(getattr(small, "vocab_size", PROBE_VOCAB) or PROBE_VOCAB)
    small.vocab_size = min(vocab, PROBE_VOCAB)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(small, key, None)
        if isinstance(value, int) and value >= small.vocab_size:
            setattr(small, key, None)
    if isinstance(getattr(small, "intermediate_size", None), int):
        small.intermediate_size = min(small.intermediate_size, SMALL_INTERMEDIATE)
    return small


def _small_model(config):
    from transformers import AutoModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return AutoModel.from_config(config, attn_implementation="eager").float().eval()
        except Exception as exc:
            reason = " ".join(str(exc).split())[:200]
            raise VerificationError(
                f"stock transformers cannot build a {getattr(config, 'model_type', '?')} model from the patched "
                f"config ({type(exc).__name__}: {reason}), so the patch cannot be verified; --no-verify "
                "(patch_model(..., verify=False)) skips the check"
            ) from None


def _small_pair(source_config, stock_config, plan: PatchPlan):
    """rope-extend's patched small model and the stock-built small model, with the same random weights."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # config advice about the small copies is noise here
    try:
        return _build_pair(source_config, stock_config, plan)
    finally:
        hf_logging.set_verbosity(verbosity)


def _build_pair(source_config, stock_config, plan: PatchPlan):
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(0)
        patched = _small_model(_small_config(source_config))
    finally:
        torch.random.set_rng_state(state)
    weights = patched.state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        apply_plan(patched, plan)
    stock = _small_model(_small_config(stock_config))
    missing, unexpected = stock.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise VerificationError(
            f"the stock-loaded config builds a different model (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return patched, stock


def _check_modules(model, plan: PatchPlan) -> None:
    """The rotary modules of a stock-loaded model hold the planned frequencies and attention factor."""
    for name, module, _ in find_rotary_modules(model):
        for slot, prefix in compat.module_slots(name, module, plan.slots):
            if slot not in plan.targets:
                continue
            want, attention = plan.expected_stock(slot)
            got = getattr(module, f"{prefix}inv_freq").float().cpu()
            if got.shape != want.shape or not torch.allclose(got, want.float().cpu(), rtol=1e-6, atol=0):
                raise VerificationError(f"{name}: the saved model rebuilds different inv_freq for {slot or 'all layers'}")
            got_attention = float(getattr(module, f"{prefix}attention_scaling", 1.0))
            if not math.isclose(got_attention, attention, rel_tol=1e-6):
                raise VerificationError(f"{name}: the saved model rebuilds a different attention factor")


def _compare(patched: torch.Tensor, stock: torch.Tensor, plan: PatchPlan, rtol: float, what: str) -> None:
    if patched.shape != stock.shape:
        raise VerificationError(f"{what}: output shapes differ ({tuple(patched.shape)} vs {tuple(stock.shape)})")
    scale = max(float(patched.abs().max()), 1e-6)
    diff = float((patched - stock).abs().max())
    if diff > rtol * scale:
        raise VerificationError(
            f"{what}: stock transformers and rope-extend's patched model disagree beyond the original length "
            f"(max abs diff {diff:.3g} at positions up to {plan.spec.target_length - 1}, output scale {scale:.3g})"
        )


def verify_plan(
    plan: PatchPlan,
    *,
    source_config,
    stock_config=None,
    patched_outputs: torch.Tensor | None = None,
    stock_model=None,
) -> None:
    """Raise VerificationError unless the plan is verified (see the module docstring).

    `source_config`: the (unpatched) config the plan was made from. `stock_config`: what stock transformers loads
    from the written config.json (default: rebuilt in memory from the plan). With `stock_model` (the saved model
    loaded by stock transformers) and `patched_outputs` (`probe_outputs` of rope-extend's patched real model), the
    forward check runs on the real models; otherwise on a small random-weight model of the same config.
    """
    if stock_config is None:
        stock_config = compat.stock_config(compat.text_config(source_config), plan.slots,
                                           plan.max_position_embeddings, plan.marker)
    verify_stock_config(compat.text_config(stock_config), plan)
    if stock_model is not None:
        _check_modules(stock_model, plan)
        if patched_outputs is not None:
            dtype = next(stock_model.parameters()).dtype
            _compare(patched_outputs, probe_outputs(stock_model, plan), plan, RTOL.get(dtype, HALF_RTOL),
                     "saved model")
            return
    patched, stock = _small_pair(source_config, stock_config, plan)
    _check_modules(stock, plan)
    _compare(probe_outputs(patched, plan), probe_outputs(stock, plan), plan, RTOL[torch.float32],
             "small model of this config")
