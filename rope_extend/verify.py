"""What "verified" promises, in one function used by `patch_model` and by the checkpoint writer.

A patch is verified when (1) stock transformers, given the rewritten config, builds exactly the inverse frequencies
and attention factor rope-extend computed, AND (2) a real forward pass runs beyond the original length and agrees:
rope-extend's patched model and the stock-loaded model give the same outputs on a few tokens placed at positions
up to the target length. The forward runs on a small model of the same config with random weights, or, on the full
checkpoint path, on the real saved model against the real patched one (the small model: `small_model.py`). A
checkpoint that would not run is never called verified. The tokenizer and chat templates OUT ships are checked by
`tokenizer.py`.

It depends on planning (`plan`) and the module layer (`rotary`), not on `patch`, which calls it. The `verify`
command runs this check again on a folder already written: `reverify.py`.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import torch

from . import compat
from .errors import ModelRunError, VerificationError
from .plan import PatchPlan, verify_stock_config
from .rotary import apply_plan, find_rotary_modules
from .small_model import LEVELS, PROBE_VOCAB, has_attention, small_config, small_model

# Forward-check tolerance, relative to the largest output (|logit|) of the probe, by the dtype both models ran in.
# Verification compares like with like: the saved model reloaded by stock transformers in the dtype it was saved in,
# against the in-memory model in that same dtype, with no autocast on either side; on one device the two forwards
# are then bit-identical (measured on SmolLM2-135M on the CPU in float32, bfloat16 and float16: max abs diff 0.0).
# The tolerance is for what may legitimately differ: the reduction order of another kernel or device (a model
# trained on a GPU, reloaded on the CPU). float32: 1e-4 (~840 of its units of rounding, eps 1.2e-7); float64 1e-6;
# bfloat16 and float16: HALF_EPS_UNITS units of their rounding (torch.finfo(dtype).eps: 2**-7 for bfloat16, so
# 3.1e-2 x the output scale, 0.9 at SmolLM2's ~29; 2**-10 for float16, 3.9e-3). A real RoPE mismatch moves the
# logits at the far positions by the output scale itself (46 at scale 33.8 for issue 36's autocast probe).
RTOL = {torch.float32: 1e-4, torch.float64: 1e-6}
HALF_EPS_UNITS = 4


def output_rtol(dtype: torch.dtype) -> float:
    """The forward check's tolerance relative to the output scale for models run in `dtype` (see RTOL)."""
    if dtype in RTOL:
        return RTOL[dtype]
    return HALF_EPS_UNITS * torch.finfo(dtype).eps


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
def probe_outputs(model, plan: PatchPlan, *, original_only: bool = False) -> torch.Tensor:
    """The model's outputs (logits, or last hidden states for a base model) on the probe, as float32 on CPU.
    `original_only`: only the probe's positions inside the original window (an unpatched model's own range)."""
    vocab = int(getattr(compat.text_config(model.config), "vocab_size", None) or PROBE_VOCAB)
    ids, positions = probe_inputs(plan, vocab)
    if original_only:
        inside = positions[0] < plan.spec.original_max_position_embeddings
        ids, positions = ids[:, inside], positions[:, inside]
    device = next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))
    try:
        output = model(input_ids=ids.to(device), position_ids=positions.to(device), use_cache=True)
    except Exception as exc:  # whatever the modeling code raises: the model cannot run
        which = "the unpatched" if original_only else "the patched"
        raise ModelRunError(_cannot_run(model.config, exc, which)) from None
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


def _cannot_run(config, exc: Exception, which: str = "the patched") -> str:
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
    return f"{which} model cannot run a forward pass ({type(exc).__name__}: {reason}){hint}"


def small_run(source_config, stock_config, plan: PatchPlan):
    """(rope-extend's patched small model's outputs, the stock-built small model, its outputs), same weights."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # config advice about the small copies is noise here
    try:
        for number, (narrow, per_signature) in enumerate(LEVELS):
            last = number == len(LEVELS) - 1
            try:
                patched, stock = _build_pair(small_config(source_config, narrow, per_signature),
                                             small_config(stock_config, narrow, per_signature), plan)
                _check_modules(stock, plan)
                if not last and not has_attention(stock):
                    continue
                return probe_outputs(patched, plan), stock, probe_outputs(stock, plan)
            except VerificationError:
                if last:
                    raise
            except Exception as exc:  # a shrunk config the modeling code rejects: try a wider one
                if last:
                    raise ModelRunError(_cannot_run(source_config, exc)) from None
        raise AssertionError("unreachable")
    finally:
        hf_logging.set_verbosity(verbosity)


def run_unpatched(config, plan: PatchPlan) -> torch.Tensor:
    """What "the model runs before patching" means: a small random-weight model of `config` exactly as it is (its
    RoPE untouched, built as verification builds the patched one, seed 0) runs the probe's positions inside the
    original window; its outputs, or ModelRunError. The model the installed transformers builds is what is asked,
    not a rule about which fields its modeling code applies."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        for number, (narrow, per_signature) in enumerate(LEVELS):
            last = number == len(LEVELS) - 1
            state = torch.random.get_rng_state()
            try:
                torch.manual_seed(0)
                model = small_model(small_config(config, narrow, per_signature))
                if not last and not has_attention(model):
                    continue
                return probe_outputs(model, plan, original_only=True)
            except Exception as exc:  # a shrunk config the modeling code rejects: try a wider one
                if last and isinstance(exc, ModelRunError):
                    raise
                if last:
                    raise ModelRunError(_cannot_run(config, exc, "the unpatched")) from None
            finally:
                torch.random.set_rng_state(state)
        raise AssertionError("unreachable")
    finally:
        hf_logging.set_verbosity(verbosity)


def _build_pair(small_source, small_stock, plan: PatchPlan):
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(0)
        patched = small_model(small_source)
    finally:
        torch.random.set_rng_state(state)
    weights = patched.state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        apply_plan(patched, plan)
    stock = small_model(small_stock)
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


def _compare(patched: torch.Tensor, stock: torch.Tensor, plan: PatchPlan, dtype: torch.dtype, what: str) -> None:
    if patched.shape != stock.shape:
        raise VerificationError(f"{what}: output shapes differ ({tuple(patched.shape)} vs {tuple(stock.shape)})")
    scale = max(float(patched.abs().max()), 1e-6)
    diff = float((patched - stock).abs().max())
    rtol = output_rtol(dtype)
    if diff > rtol * scale:
        raise VerificationError(
            f"{what}: stock transformers and rope-extend's patched model disagree beyond the original length "
            f"(max abs diff {diff:.3g} at positions up to {plan.spec.target_length - 1}, output scale {scale:.3g}; "
            f"{str(dtype).removeprefix('torch.')} allows {rtol:.2g} x the scale = {rtol * scale:.3g})"
        )


def model_dtype(model) -> torch.dtype:
    """The dtype a model's forward runs in: its floating-point parameters' (the first one's)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def verify_plan(
    plan: PatchPlan,
    *,
    source_config,
    stock_config=None,
    patched_outputs: torch.Tensor | None = None,
    stock_model=None,
    patched_dtype: torch.dtype | None = None,
) -> None:
    """Raise VerificationError unless the plan is verified (see the module docstring).

    `source_config`: the (unpatched) config the plan was made from. `stock_config`: what stock transformers loads
    from the written config.json (default: rebuilt in memory from the plan). With `stock_model` (the saved model
    loaded by stock transformers) and `patched_outputs` (`probe_outputs` of rope-extend's patched real model), the
    forward check runs on the real models; otherwise on a small random-weight model of the same config.
    `patched_dtype`: the dtype `patched_outputs` were computed in (default: the stock model's); the two must be the
    same, since the check compares like with like at that dtype's tolerance (`output_rtol`).
    """
    if stock_config is None:
        stock_config = compat.stock_config(compat.text_config(source_config), plan.slots,
                                           plan.max_position_embeddings, plan.marker)
    verify_stock_config(compat.text_config(stock_config), plan)
    if stock_model is not None:
        _check_modules(stock_model, plan)
        if patched_outputs is not None:
            dtype = model_dtype(stock_model)
            if patched_dtype is not None and patched_dtype != dtype:
                raise VerificationError(
                    f"saved model: stock transformers reloads it in {str(dtype).removeprefix('torch.')} but the "
                    f"model it was saved from ran in {str(patched_dtype).removeprefix('torch.')}, so their outputs "
                    "cannot be compared like with like; save and reload in one dtype (config.json's dtype)"
                )
            _compare(patched_outputs, probe_outputs(stock_model, plan), plan, dtype, "saved model")
            return
    patched_small, stock, stock_small = small_run(source_config, stock_config, plan)
    _compare(patched_small, stock_small, plan, torch.float32, "small model of this config")
