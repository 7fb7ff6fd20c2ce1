"""Apply a plan to an already-loaded model in place, and undo it.

Editing a loaded model's config changes nothing: rotary modules compute `inv_freq` once at construction. So
`patch_model` (1) plans the new RoPE from the config and the spec (`plan.plan_patch`, pure), (2) recomputes every
rotary module's frequencies and attention scaling with the method object on the module's device and dtype,
(3) rewrites the config so that the model's own `save_pretrained` / `push_to_hub` write the portable config
(`compat.enable_portable_saves`), loaded identically by stock transformers 4.x and 5.x. Dynamic methods get a
forward pre-hook (`dynamic.DynamicRopeHook`) that recomputes the frequencies from the current length.

Everything `patch_model` changes is recorded in a `PatchState` on the model, which knows how to restore it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from . import compat, dynamic
from .errors import SpecError, UnsupportedModelError
from .plan import PatchPlan, check_rope_model, plan_patch
from .spec import RopeSpec, load_spec

_STATE_ATTR = "_rope_extend_state"


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

    @classmethod
    def of(cls, plan: PatchPlan, modules: list[str], changed: bool) -> PatchReport:
        return cls(
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

    def __str__(self) -> str:
        what = "patched" if self.changed else "unchanged (already patched with this spec)"
        return (
            f"{self.method} x{self.factor:g}: {what}; max length {self.old_max_position_embeddings} -> "
            f"{self.new_max_position_embeddings} (original {self.original_max_position_embeddings}); "
            f"attention factor {self.attention_factor:.4f}; modules: {', '.join(self.modules)}"
        )


# --- rotary modules --------------------------------------------------------------------------------------------------
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


def _target_device(model: nn.Module, buffer: torch.Tensor | None) -> torch.device:
    if buffer is not None and buffer.device.type != "meta":
        return buffer.device
    for param in model.parameters():
        if param.device.type != "meta":
            return param.device
    return torch.device("cpu")


def _set_tensor(module: nn.Module, name: str, value: torch.Tensor) -> None:
    """Replace a tensor whether it is a buffer (5.x) or a plain attribute (4.x keeps `original_inv_freq` so)."""
    if name in module._buffers or not hasattr(module, name):
        module.register_buffer(name, value, persistent=False)
    else:
        setattr(module, name, value)


def _get_rope_type(module: nn.Module, slot: str | None):
    current = getattr(module, "rope_type", None)
    return current.get(slot) if isinstance(current, dict) else current


_SAVED_TENSORS = ("inv_freq", "original_inv_freq", "long_inv_freq")


@dataclass
class ModuleChange:
    """One rotary module slot as it was before the patch."""

    name: str
    prefix: str
    slot: str | None
    tensors: dict[str, Any]  # attribute -> original value (tensor clone, float, or None when absent)
    rope_type: str | None

    @classmethod
    def record(cls, name: str, module: nn.Module, prefix: str, slot: str | None) -> ModuleChange:
        tensors: dict[str, Any] = {}
        for suffix in _SAVED_TENSORS:
            value = getattr(module, f"{prefix}{suffix}", None)
            tensors[f"{prefix}{suffix}"] = value.detach().clone() if isinstance(value, torch.Tensor) else value
        tensors[f"{prefix}attention_scaling"] = getattr(module, f"{prefix}attention_scaling", None)
        return cls(name, prefix, slot, tensors, _get_rope_type(module, slot))

    def restore(self, module: nn.Module) -> None:
        for attr, value in self.tensors.items():
            if isinstance(value, torch.Tensor):
                _set_tensor(module, attr, value.clone())
            elif value is None and attr.endswith("long_inv_freq"):
                if hasattr(module, attr):
                    delattr(module, attr)
            elif value is not None:
                setattr(module, attr, value)
        if self.rope_type is not None:
            compat.set_module_rope_type(module, self.prefix, self.slot, self.rope_type)


@dataclass
class PatchState:
    """Everything `patch_model` changed on a model, and how to put it back."""

    plan: PatchPlan
    config_snapshot: dict  # the RoPE config attributes before the first patch
    modules: dict[str, ModuleChange] = field(default_factory=dict)  # "name|prefix" -> original state
    hooks: list[Any] = field(default_factory=list)  # removable handles of dynamic hooks
    touched: list[str] = field(default_factory=list)

    def restore_modules(self, model: nn.Module) -> None:
        for handle in self.hooks:
            handle.remove()
        self.hooks = []
        dynamic.unwrap_generate(model)
        named = dict(model.named_modules())
        for change in self.modules.values():
            change.restore(named[change.name])
        self.modules = {}

    def restore(self, model: nn.Module) -> None:
        self.restore_modules(model)
        compat.restore_rope_config(compat.text_config(model.config), self.config_snapshot)


def _state(model: nn.Module) -> PatchState | None:
    state = getattr(model, _STATE_ATTR, None)
    return state if isinstance(state, PatchState) else None


# --- patch / unpatch -------------------------------------------------------------------------------------------------
def patch_model(
    model: nn.Module,
    spec: RopeSpec | dict | str | None = None,
    *,
    dynamic_mode: str = "consistent",
    **kwargs: Any,
) -> PatchReport:
    """Rescale an already-loaded model's RoPE in place and rewrite its config. Returns a `PatchReport`.

    `spec` is a `RopeSpec`, a dict, a YAML path, or keywords (`method="yarn", factor=4`). With no spec at all,
    the rope-extend marker of a checkpoint written by rope-extend is re-applied (restores dynamic methods that
    stock loaders load as static). Applying the same spec twice changes nothing; `unpatch_model` undoes it.
    After patching, `model.save_pretrained` / `push_to_hub` write a config.json that stock transformers 4.x and
    5.x both load to the patched RoPE.

    `dynamic_mode` (dynamic, dynamic-yarn, longrope): "consistent" fixes the scale per `generate` request so the
    KV cache stays valid; "stock" reproduces transformers' behaviour exactly (see `rope_extend.dynamic`).
    """
    if dynamic_mode not in dynamic.MODES:
        raise SpecError(f"dynamic_mode {dynamic_mode!r} is not one of {', '.join(dynamic.MODES)}", field="dynamic_mode")
    config = compat.text_config(model.config)
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
    state = _state(model)
    if state is not None:
        if not plan.changed:  # the same spec again: nothing to do
            return PatchReport.of(plan, state.touched, changed=False)
        # re-patching: start from the true original so unpatch restores it
        state.restore(model)
        plan = plan_patch(config, spec)
        state = PatchState(plan, state.config_snapshot)
    else:
        state = PatchState(plan, compat.snapshot_rope_config(config))

    changed = _apply(model, modules, plan, state, dynamic_mode)
    compat.write_slots(config, plan.slots, plan.max_position_embeddings, plan.marker)
    if config is not model.config and hasattr(model.config, "max_position_embeddings"):
        model.config.max_position_embeddings = plan.max_position_embeddings
    compat.enable_portable_saves()
    setattr(model, _STATE_ATTR, state)
    if plan.method.dynamic and dynamic_mode == "consistent" and hasattr(model, "generate"):
        dynamic.wrap_generate(model)
    for note in plan.warnings:
        warnings.warn(note, UserWarning, stacklevel=2)
    return PatchReport.of(plan, state.touched, changed or plan.changed)


def _apply(model: nn.Module, modules, plan: PatchPlan, state: PatchState, dynamic_mode: str) -> bool:
    """Recompute every target slot's buffers (recording the originals in `state`); True if any buffer changed."""
    method = plan.method
    # Stock dynamic machinery must stay inert: our hook owns dynamic behaviour.
    stock_type = "default" if method.dynamic else method.hf_rope_type
    changed = False
    for name, module, prefixes in modules:
        for slot, prefix in compat.module_slots(name, module, plan.slots):
            if slot not in plan.targets or prefix not in prefixes:
                continue
            state.modules.setdefault(f"{name}|{prefix}", ModuleChange.record(name, module, prefix, slot))
            buffer = getattr(module, f"{prefix}inv_freq")
            device = _target_device(model, buffer)
            dtype = buffer.dtype if buffer.device.type != "meta" and buffer.is_floating_point() else torch.float32
            inv_freq, attention = plan.compute(slot, device=device)
            inv_freq = inv_freq.to(device=device, dtype=dtype)
            if buffer.device.type == "meta" or buffer.shape != inv_freq.shape or not torch.equal(buffer, inv_freq):
                changed = True
            _set_tensor(module, f"{prefix}inv_freq", inv_freq)
            if isinstance(getattr(module, f"{prefix}original_inv_freq", None), torch.Tensor):
                _set_tensor(module, f"{prefix}original_inv_freq", inv_freq.clone())
            if hasattr(module, f"{prefix}long_inv_freq"):
                delattr(module, f"{prefix}long_inv_freq")
            setattr(module, f"{prefix}attention_scaling", float(attention))
            compat.set_module_rope_type(module, prefix, slot, stock_type)
            if method.dynamic:
                hook = dynamic.DynamicRopeHook(
                    compute=lambda n, device, slot=slot: plan.compute(slot, seq_len=n, device=device),
                    original=plan.spec.original_max_position_embeddings,
                    slot=slot,
                    prefix=prefix,
                    per_layer_type=bool(prefix),
                    mode=dynamic_mode,
                    two_state=method.switches_at_original,
                )
                state.hooks.append(module.register_forward_pre_hook(hook, with_kwargs=True))
            state.touched.append(f"{name}[{slot}]" if slot else name)
    if not state.touched:
        raise UnsupportedModelError(
            f"found rotary modules {[m[0] for m in modules]} but none serves layer types {list(plan.targets)}"
        )
    return changed


def unpatch_model(model: nn.Module) -> bool:
    """Restore the modules and config `patch_model` changed. Returns False if the model was not patched."""
    state = _state(model)
    if state is None:
        return False
    state.restore(model)
    delattr(model, _STATE_ATTR)
    return True
