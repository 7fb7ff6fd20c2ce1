"""Patch an already-loaded model's RoPE in place, and undo it.

Editing a loaded model's config changes nothing: rotary modules compute `inv_freq` once at construction. So
`patch_model` (1) plans the new RoPE from the config and the spec (`plan_patch`, pure, also used by the
config-only checkpoint writer), (2) recomputes every rotary module's frequencies and attention scaling with our own
method functions on the module's device and dtype, (3) rewrites the config so that `save_pretrained` produces a
checkpoint stock transformers rebuilds identically. Dynamic methods get a forward pre-hook that recomputes the
frequencies from the current length (stock semantics: grow with the longest length seen, reset below L).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from . import compat, dynamic
from .errors import AlreadyScaledError, SpecError, UnsupportedModelError, VerificationError
from .methods import RopeContext, get_method
from .methods.ntk import ntk_base
from .spec import RopeSpec, load_spec

_STATE_ATTR = "_rope_extend_state"
FLAT_KEY = "_all"  # JSON name of the flat slot in the marker

# Models without RoPE, with what would work instead.
NO_ROPE_MODELS = {
    "gpt2": "it uses learned absolute position embeddings (wpe) limited to n_positions; RoPE scaling cannot extend "
    "them. Fine-tune with a longer wpe, or use a RoPE model (llama, mistral, qwen2...)",
    "bloom": "it uses ALiBi attention biases, which need no rescaling: ALiBi extrapolates by itself; just raise the "
    "length you serve",
    "mpt": "it uses ALiBi attention biases, which need no rescaling",
    "opt": "it uses learned absolute position embeddings; RoPE scaling does not apply",
    "bert": "it uses learned absolute position embeddings; RoPE scaling does not apply",
    "gpt_bigcode": "it uses learned absolute position embeddings; RoPE scaling does not apply",
}


@dataclass
class PatchPlan:
    """What a spec does to a config: new slot parameters, new max length, the marker, and whether it changes."""

    spec: RopeSpec  # resolved
    slots: dict[str | None, dict]  # all slots after the patch
    targets: list[str | None]  # slots the spec rescales
    old_slots: dict[str | None, dict]
    old_max_position_embeddings: int
    max_position_embeddings: int
    marker: dict
    changed: bool
    base_theta: float
    rotary_dims: dict[str | None, int]
    attention_factor: float
    warnings: list[str] = field(default_factory=list)

    def context(self, slot: str | None, seq_len: int | None = None, device=None) -> RopeContext:
        spec = self.spec
        params = dict(spec.method_params())
        if spec.method == "longrope":
            params.setdefault("short_factor", self.slots[slot].get("short_factor"))
            params.setdefault("long_factor", self.slots[slot].get("long_factor"))
        return RopeContext(
            rotary_dim=self.rotary_dims[slot],
            base=self.base_theta,
            original_max_position_embeddings=spec.original_max_position_embeddings,
            factor=spec.factor,
            params=params,
            seq_len=seq_len,
            device=device,
        )


@dataclass
class PatchReport:
    """What `patch_model` did."""

    method: str
    factor: float
    original_max_position_embeddings: int
    old_max_position_embeddings: int
    new_max_position_embeddings: int
    attention_factor: float
    modules: list[str]
    changed: bool
    spec: RopeSpec
    warnings: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        what = "patched" if self.changed else "unchanged (already patched with this spec)"
        return (
            f"{self.method} x{self.factor:g}: {what}; max length {self.old_max_position_embeddings} -> "
            f"{self.new_max_position_embeddings} (original {self.original_max_position_embeddings}); "
            f"attention factor {self.attention_factor:.4f}; modules: {', '.join(self.modules)}"
        )


# --- planning (config only) ----------------------------------------------------------------------------------------
def _encode_slots(slots: dict[str | None, dict]) -> dict[str, dict]:
    return {FLAT_KEY if key is None else key: dict(value) for key, value in slots.items()}


def _decode_slots(slots: dict[str, dict]) -> dict[str | None, dict]:
    return {None if key == FLAT_KEY else key: dict(value) for key, value in slots.items()}


def _original_length(params: dict, max_position_embeddings: int) -> int:
    """The pretraining length behind a slot's scheme (for re-deriving a model that already carries one)."""
    rope_type = params.get("rope_type", "default")
    if params.get("original_max_position_embeddings"):
        return int(params["original_max_position_embeddings"])
    if rope_type == "linear" and params.get("factor"):
        return int(round(max_position_embeddings / float(params["factor"])))
    return int(max_position_embeddings)


def check_rope_model(config) -> None:
    model_type = getattr(config, "model_type", "?")
    if model_type in NO_ROPE_MODELS:
        raise UnsupportedModelError(
            f"model type {model_type!r} has no rotary position embedding: {NO_ROPE_MODELS[model_type]}"
        )
    if not (getattr(config, "rope_parameters", None) or getattr(config, "rope_theta", None)) and not hasattr(
        config, "rope_scaling"
    ):
        raise UnsupportedModelError(
            f"model type {model_type!r} declares no RoPE (no rope_theta / rope_parameters in its config); "
            "rope-extend only rescales rotary position embeddings (llama, mistral, qwen2/3, gemma, phi3, gpt_neox...)"
        )


def plan_patch(config, spec: RopeSpec | dict | str | None = None, **kwargs: Any) -> PatchPlan:
    """Plan a patch from a (text) config and a spec without touching any module."""
    check_rope_model(config)
    spec = load_spec(spec, **kwargs)
    slots = compat.read_slots(config)
    marker = compat.read_marker(config)
    max_pos = getattr(config, "max_position_embeddings", None)
    if max_pos is None:
        raise SpecError(
            "the model config has no max_position_embeddings; set original_max_position_embeddings in the spec",
            field="original_max_position_embeddings",
        )

    if compat.FLAT in slots:
        if "full_attention" not in spec.layer_types:
            raise SpecError(
                f"layer_types {spec.layer_types}: this model uses one RoPE for all its layers, so it can only be "
                "scaled as a whole; remove layer_types (default [full_attention])",
                field="layer_types",
                value=spec.layer_types,
            )
        targets: list[str | None] = [compat.FLAT]
    else:
        targets = [lt for lt in spec.layer_types if lt in slots]
        if not targets:
            raise SpecError(
                f"layer_types {spec.layer_types} match none of the model's RoPE layer types {sorted(slots)}; "
                f"use e.g. layer_types: [{sorted(slots)[0]}]",
                field="layer_types",
                value=spec.layer_types,
            )

    # The pristine RoPE to derive from: ours (from the marker) if rope-extend patched this config before.
    if marker and "original" in marker:
        pristine = _decode_slots(marker["original"]["rope_parameters"])
        pristine_max = int(marker["original"]["max_position_embeddings"])
    else:
        pristine, pristine_max = slots, int(max_pos)
    first = pristine[targets[0]]
    existing = marker is not None or any(slots[t].get("rope_type", "default") != "default" for t in targets)

    original = spec.original_max_position_embeddings or _original_length(first, pristine_max)
    resolved = spec.resolve(original)
    base_theta = float(resolved.rope_theta or first["rope_theta"])

    new_slots = {key: dict(value) for key, value in pristine.items()}
    rotary_dims = {}
    attention_factor = 1.0
    for target in targets:
        dim = compat.rotary_dim(config, pristine[target])
        if dim < 4 or dim % 2:
            raise UnsupportedModelError(f"rotary dimension {dim} (slot {target}) must be even and >= 4")
        rotary_dims[target] = dim
        new = _scaled_slot(resolved, pristine[target], slots[target], dim, base_theta)
        # longrope lists may come from the model: the resolved spec carries what was used
        resolved = resolved.model_copy(update={k: new[k] for k in ("short_factor", "long_factor") if k in new})
        ctx = RopeContext(dim, base_theta, resolved.original_max_position_embeddings, resolved.factor,
                          resolved.method_params())
        # dynamic-yarn is written (and reported) as static YaRN at the full factor
        _, attention_factor = get_method("yarn" if resolved.method == "dynamic-yarn" else resolved.method).compute(ctx)
        if resolved.method in ("yarn", "dynamic-yarn", "ntk-by-parts", "longrope"):
            new["attention_factor"] = float(attention_factor)  # always explicit: engines differ in defaults
        new_slots[target] = new

    new_max = resolved.original_max_position_embeddings if resolved.method == "dynamic" else resolved.target_length
    new_marker = {
        "version": _version(),
        "method": resolved.method,
        "spec": resolved.to_dict(),
        "original": {"rope_parameters": _encode_slots(pristine), "max_position_embeddings": pristine_max},
    }
    notes = []
    if resolved.method == "dynamic-yarn":
        new_marker["stock_loaders"] = (
            f"static yarn x{resolved.factor:g} (equal to dynamic-yarn only at {resolved.target_length} tokens); "
            "call rope_extend.patch_model(model) after loading to restore dynamic YaRN"
        )
        notes.append(
            "dynamic-yarn is not reproduced by stock loaders (transformers, vLLM, llama.cpp): they load the "
            f"checkpoint as static YaRN x{resolved.factor:g}; call rope_extend.patch_model(model) after loading"
        )
    changed = not (
        int(max_pos) == int(new_max)
        and all(compat.params_close(slots[key], new_slots[key]) for key in slots)
        and (marker is None or marker.get("spec") == new_marker["spec"])  # e.g. dynamic-yarn vs yarn
    )
    if changed and existing and not resolved.replace_existing:
        current = _describe(slots, targets, marker)
        raise AlreadyScaledError(
            f"the model already carries RoPE scaling ({current}); applying {resolved.method} on top would "
            f"double-scale. Set replace_existing: true (CLI: --set replace_existing=true) to re-derive "
            f"{resolved.method} from the original length {resolved.original_max_position_embeddings} and base "
            f"{base_theta:g}, or unpatch_model() first"
        )
    plan = PatchPlan(
        spec=resolved,
        slots=new_slots,
        targets=targets,
        old_slots=slots,
        old_max_position_embeddings=int(max_pos),
        max_position_embeddings=int(new_max),
        marker=new_marker,
        changed=changed,
        base_theta=base_theta,
        rotary_dims=rotary_dims,
        attention_factor=float(attention_factor),
        warnings=notes,
    )
    if changed:
        _check_stock_accepts(config, plan)
    return plan


def _scaled_slot(spec: RopeSpec, old: dict, current: dict, dim: int, base_theta: float) -> dict:
    """The transformers-5-style RoPE parameters of one slot after applying a resolved spec."""
    method = get_method(spec.method)
    params = spec.method_params()
    new: dict[str, Any] = {"rope_type": method.hf_rope_type or "default", "rope_theta": base_theta}
    if "partial_rotary_factor" in old:
        new["partial_rotary_factor"] = old["partial_rotary_factor"]
    if spec.method == "ntk":  # a plain base change
        new["rope_theta"] = ntk_base(base_theta, spec.factor, dim)
        return new
    new["factor"] = spec.factor
    if spec.method in ("linear", "dynamic"):  # dynamic: max_position_embeddings is the threshold L
        return new
    new["original_max_position_embeddings"] = spec.original_max_position_embeddings
    if spec.method in ("yarn", "dynamic-yarn", "ntk-by-parts"):
        new["rope_type"] = "yarn"
        new["beta_fast"] = float(params.get("beta_fast", 32.0))
        new["beta_slow"] = float(params.get("beta_slow", 1.0))
        new.update({key: params[key] for key in ("mscale", "mscale_all_dim", "truncate") if key in params})
    elif spec.method == "llama3":
        new["low_freq_factor"] = float(params.get("low_freq_factor", 1.0))
        new["high_freq_factor"] = float(params.get("high_freq_factor", 4.0))
    elif spec.method == "longrope":
        for key in ("short_factor", "long_factor"):
            values = params.get(key) or old.get(key) or current.get(key)
            if not values or len(values) != dim // 2:
                raise SpecError(
                    f"longrope needs {key} with {dim // 2} values (rotary_dim / 2), got "
                    f"{len(values) if values else 'none'}; copy the published lists (e.g. Phi-3's config.json)",
                    field=key,
                    value=values,
                )
            new[key] = [float(v) for v in values]
    return new


def _check_stock_accepts(config, plan: PatchPlan) -> None:
    """Stock transformers must load the rewritten config to the planned RoPE, or we refuse before writing."""
    try:
        rebuilt = compat.stock_config(config, plan.slots, plan.max_position_embeddings, plan.marker)
    except Exception as exc:  # the config class's own validation, whatever it raises
        reason = str(exc).strip().splitlines()[-1].strip()
        raise UnsupportedModelError(
            f"{getattr(config, 'model_type', '?')} configs reject method {plan.spec.method!r} in transformers "
            f"{compat.TRANSFORMERS_VERSION}: {reason}; choose a method this model type accepts (e.g. ntk, which "
            "is a plain rope_theta change)"
        ) from None
    try:
        verify_stock_config(rebuilt, plan)
    except VerificationError as exc:
        raise UnsupportedModelError(
            f"{getattr(config, 'model_type', '?')} cannot carry {plan.spec.method!r} in config.json: {exc}"
        ) from None


def expected_rope(plan: PatchPlan, slot: str | None) -> tuple[torch.Tensor, float]:
    """What stock loaders must build at construction: dynamic-yarn is written as static YaRN at the target length."""
    method = "yarn" if plan.spec.method == "dynamic-yarn" else plan.spec.method
    return get_method(method).compute(plan.context(slot))


def verify_stock_config(stock_config, plan: PatchPlan, rtol: float = 1e-6) -> None:
    """Raise VerificationError unless `stock_config` builds the planned frequencies and attention factor."""
    for slot in plan.slots:
        got_freq, got_attn = compat.stock_rope(stock_config, slot)
        if slot in plan.targets:
            want_freq, want_attn = expected_rope(plan, slot)
        else:
            want_freq, want_attn = compat.stock_rope(stock_config, slot)  # untouched slot: compared below
            old = plan.old_slots.get(slot)
            if old is not None and not compat.params_close(compat.read_slots(stock_config)[slot], old, rel=rtol):
                raise VerificationError(f"layer type {slot!r} was not supposed to change but loads as {old}")
        if got_freq.shape != want_freq.shape or not torch.allclose(got_freq.float(), want_freq.float(), rtol=rtol, atol=0):
            diff = (got_freq.float() - want_freq.float()).abs().max().item() if got_freq.shape == want_freq.shape else None
            raise VerificationError(
                f"stock transformers builds different inv_freq for {slot or 'all layers'} "
                f"(shape {tuple(got_freq.shape)} vs {tuple(want_freq.shape)}, max abs diff {diff})"
            )
        if not math.isclose(float(got_attn), float(want_attn), rel_tol=rtol):
            raise VerificationError(
                f"stock transformers builds attention factor {float(got_attn):.6f} for {slot or 'all layers'}, "
                f"rope-extend computed {float(want_attn):.6f}"
            )


def _describe(slots, targets, marker) -> str:
    if marker:
        spec = marker.get("spec", {})
        return f"rope-extend {spec.get('method')} x{spec.get('factor')} from {spec.get('original_max_position_embeddings')}"
    params = slots[targets[0]]
    parts = [f"{params.get('rope_type')}"]
    if params.get("factor"):
        parts.append(f"x{params['factor']:g}")
    if params.get("original_max_position_embeddings"):
        parts.append(f"from {params['original_max_position_embeddings']}")
    return " ".join(parts)


def _version() -> str:
    from . import __version__

    return __version__


# --- modules ---------------------------------------------------------------------------------------------------------
def find_rotary_modules(model: nn.Module) -> list[tuple[str, nn.Module, list[str]]]:
    """(name, module, inv_freq buffer prefixes) for every rotary-embedding module."""
    found = []
    for name, module in model.named_modules():
        prefixes = [
            buffer_name[: -len("inv_freq")]
            for buffer_name, _ in module.named_buffers(recurse=False)
            if buffer_name.endswith("inv_freq") and not buffer_name.endswith(("original_inv_freq", "long_inv_freq"))
        ]
        if prefixes:
            found.append((name, module, prefixes))
    return found


def _target_device(module: nn.Module, model: nn.Module, buffer: torch.Tensor | None) -> torch.device:
    if buffer is not None and buffer.device.type != "meta":
        return buffer.device
    for param in model.parameters():
        if param.device.type != "meta":
            return param.device
    return torch.device("cpu")


def _module_state(module: nn.Module, prefix: str) -> dict:
    state = {}
    for name in (f"{prefix}inv_freq", f"{prefix}original_inv_freq", f"{prefix}long_inv_freq"):
        value = getattr(module, name, None)
        state[name] = value.detach().clone() if isinstance(value, torch.Tensor) else value
    state[f"{prefix}attention_scaling"] = getattr(module, f"{prefix}attention_scaling", None)
    return state


def patch_model(
    model: nn.Module,
    spec: RopeSpec | dict | str | None = None,
    *,
    dynamic_mode: str = "consistent",
    verify: bool = True,
    **kwargs: Any,
) -> PatchReport:
    """Rescale an already-loaded model's RoPE in place and rewrite its config. Returns a `PatchReport`.

    `spec` is a `RopeSpec`, a dict, a YAML path, or keywords (`method="yarn", factor=4`). With no spec at all,
    the rope-extend marker of a checkpoint written by rope-extend is re-applied (restores dynamic methods that
    stock loaders load as static). Applying the same spec twice changes nothing; `unpatch_model` undoes it.

    `dynamic_mode` (dynamic, dynamic-yarn, longrope): "consistent" fixes the scale per `generate` request so the
    KV cache stays valid; "stock" reproduces transformers' behaviour exactly (see `rope_extend.dynamic`).

    `verify` (default): before touching the model, check the plan with `rope_extend.verify.verify_plan` (stock
    transformers rebuilds the same RoPE from the rewritten config, and a forward beyond the original length runs and
    agrees on a small model of the same config); a plan that fails raises VerificationError and changes nothing.
    """
    if dynamic_mode not in dynamic.MODES:
        raise SpecError(f"dynamic_mode {dynamic_mode!r} is not one of {', '.join(dynamic.MODES)}", field="dynamic_mode")
    config = _text_config(model)
    check_rope_model(config)
    if spec is None and not kwargs:
        marker = compat.read_marker(config)
        if not marker:
            raise SpecError("no spec given and the model carries no rope-extend marker; pass method=... factor=...")
        spec = RopeSpec(**marker["spec"])
    spec = load_spec(spec, **kwargs)

    modules = find_rotary_modules(model)
    if not modules:
        raise UnsupportedModelError(
            f"no rotary-embedding module (an `inv_freq` buffer) found in {type(model).__name__}; "
            "rope-extend patches transformers' RoPE modules (transformers >= 4.45 layout)"
        )
    plan = plan_patch(config, spec)
    if verify and plan.changed:  # before anything is touched (re-patching plans from the marker's pristine RoPE)
        from .verify import verify_plan  # verify imports this module

        verify_plan(plan, source_config=config)
    state = getattr(model, _STATE_ATTR, None)
    if state is not None:
        if not plan.changed:  # the same spec again: nothing to do
            return _report(plan, [e["name"] for e in state["modules"].values()], changed=False)
        # re-patching: start from the true original so unpatch restores it
        _restore_modules(model, state)
        compat.restore_rope_config(config, state["config"])
        plan = plan_patch(config, spec)

    new_state = state or {"config": compat.snapshot_rope_config(config), "modules": {}, "hooks": []}
    new_state["dynamic_hooks"] = []
    method = get_method(plan.spec.method)
    touched, changed = [], plan.changed
    for name, module, prefixes in modules:
        assigned = compat.module_slots(name, module, plan.slots)
        for slot, prefix in assigned:
            if slot not in plan.targets or f"{prefix}inv_freq" not in {p + "inv_freq" for p in prefixes}:
                continue
            key = f"{name}|{prefix}"
            if key not in new_state["modules"]:
                new_state["modules"][key] = {
                    "name": name,
                    "prefix": prefix,
                    "slot": slot,
                    "tensors": _module_state(module, prefix),
                    "rope_type": _get_rope_type(module, slot),
                }
            buffer = getattr(module, f"{prefix}inv_freq")
            device = _target_device(module, model, buffer)
            dtype = buffer.dtype if buffer.device.type != "meta" and buffer.is_floating_point() else torch.float32
            ctx = plan.context(slot, device=device)
            inv_freq, attention = method.compute(ctx)
            inv_freq = inv_freq.to(device=device, dtype=dtype)
            if buffer.device.type == "meta" or buffer.shape != inv_freq.shape or not torch.equal(buffer, inv_freq):
                changed = True
            _set_tensor(module, f"{prefix}inv_freq", inv_freq)
            if isinstance(getattr(module, f"{prefix}original_inv_freq", None), torch.Tensor):
                _set_tensor(module, f"{prefix}original_inv_freq", inv_freq.clone())
            if hasattr(module, f"{prefix}long_inv_freq"):
                delattr(module, f"{prefix}long_inv_freq")
            setattr(module, f"{prefix}attention_scaling", float(attention))
            # Stock dynamic machinery must stay inert: our hook owns dynamic behaviour.
            stock_type = "default" if method.dynamic else (method.hf_rope_type or "default")
            compat.set_module_rope_type(module, prefix, slot, stock_type)
            if method.dynamic:
                hook = dynamic.DynamicRopeHook(plan, slot, prefix, per_layer_type=bool(prefix), mode=dynamic_mode)
                new_state["hooks"].append(module.register_forward_pre_hook(hook, with_kwargs=True))
                new_state["dynamic_hooks"].append(hook)
            touched.append(f"{name}[{slot}]" if slot else name)
    if not touched:
        raise UnsupportedModelError(
            f"found rotary modules {[m[0] for m in modules]} but none serves layer types {plan.targets}"
        )
    compat.write_slots(config, plan.slots, plan.max_position_embeddings, plan.marker)
    if config is not model.config and hasattr(model.config, "max_position_embeddings"):
        model.config.max_position_embeddings = plan.max_position_embeddings
    setattr(model, _STATE_ATTR, new_state)
    if method.dynamic and dynamic_mode == "consistent" and hasattr(model, "generate"):
        dynamic.wrap_generate(model)
    for note in plan.warnings:
        warnings.warn(note, UserWarning, stacklevel=2)
    return _report(plan, touched, changed)


def _report(plan: PatchPlan, modules: list[str], changed: bool) -> PatchReport:
    return PatchReport(
        method=plan.spec.method,
        factor=plan.spec.factor,
        original_max_position_embeddings=plan.spec.original_max_position_embeddings,
        old_max_position_embeddings=plan.old_max_position_embeddings,
        new_max_position_embeddings=plan.max_position_embeddings,
        attention_factor=plan.attention_factor,
        modules=modules,
        changed=changed,
        spec=plan.spec,
        warnings=list(plan.warnings),
    )


def unpatch_model(model: nn.Module) -> bool:
    """Restore the modules and config `patch_model` changed. Returns False if the model was not patched."""
    state = getattr(model, _STATE_ATTR, None)
    if state is None:
        return False
    _restore_modules(model, state)
    compat.restore_rope_config(_text_config(model), state["config"])
    delattr(model, _STATE_ATTR)
    return True


def _restore_modules(model: nn.Module, state: dict) -> None:
    for hook in state["hooks"]:
        hook.remove()
    state["hooks"] = []
    state["dynamic_hooks"] = []
    dynamic.unwrap_generate(model)
    named = dict(model.named_modules())
    for entry in state["modules"].values():
        module, prefix = named[entry["name"]], entry["prefix"]
        for attr, value in entry["tensors"].items():
            if isinstance(value, torch.Tensor):
                _set_tensor(module, attr, value.clone())
            elif value is None and attr.endswith("long_inv_freq"):
                if hasattr(module, attr):
                    delattr(module, attr)
            elif value is not None:
                setattr(module, attr, value)
        if entry["rope_type"] is not None:
            compat.set_module_rope_type(module, prefix, entry["slot"], entry["rope_type"])
    state["modules"] = {}


def _set_tensor(module: nn.Module, name: str, value: torch.Tensor) -> None:
    """Replace a tensor whether it is a buffer (5.x) or a plain attribute (4.x keeps `original_inv_freq` so)."""
    if name in module._buffers or not hasattr(module, name):
        module.register_buffer(name, value, persistent=False)
    else:
        setattr(module, name, value)


def _get_rope_type(module: nn.Module, slot: str | None):
    current = getattr(module, "rope_type", None)
    return current.get(slot) if isinstance(current, dict) else current


def _text_config(model: nn.Module):
    return compat.text_config(model.config)
