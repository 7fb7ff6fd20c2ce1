"""Rotary-embedding modules of a loaded model: find them, and set their buffers to a plan's RoPE.

The lowest layer of patching, shared by `patch.patch_model` (which records what it changed in a `PatchState` and
rewrites the config) and `verify` (which applies a plan to a small random-weight model to run it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from . import compat, dynamic
from .errors import UnsupportedModelError
from .plan import PatchPlan


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


def no_rotary_modules_error(model: nn.Module) -> UnsupportedModelError:
    """The one-line refusal for a model without a rotary module rope-extend can patch in place."""
    return UnsupportedModelError(
        f"no rotary-embedding module with an `inv_freq` buffer in {type(model).__name__}: rope-extend patches RoPE "
        "modules that keep their frequencies in that buffer (transformers >= 4.45 builds them for most models); one "
        "that recomputes them from the config in every forward (transformers 4.x's Phi-MoE) has nothing to "
        "patch: use transformers >= 5, whose RoPE modules keep the buffer"
    )


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
class Applied:
    """What `apply_plan` did: the modules' original state, the dynamic hooks installed, and whether any buffer
    changed."""

    changes: dict[str, ModuleChange] = field(default_factory=dict)  # "name|prefix" -> original state
    hooks: list[Any] = field(default_factory=list)
    touched: list[str] = field(default_factory=list)
    changed: bool = False


def apply_plan(model: nn.Module, plan: PatchPlan, dynamic_mode: str = "consistent") -> Applied:
    """Recompute every target slot's buffers on the module's device and dtype (recording the originals)."""
    modules = find_rotary_modules(model)
    if not modules:
        raise no_rotary_modules_error(model)
    method = plan.method
    applied = Applied()
    for name, module, prefixes in modules:
        for slot, prefix in compat.module_slots(name, module, plan.slots):
            if slot not in plan.targets or prefix not in prefixes:
                continue
            applied.changes.setdefault(f"{name}|{prefix}", ModuleChange.record(name, module, prefix, slot))
            buffer = getattr(module, f"{prefix}inv_freq")
            device = _target_device(model, buffer)
            dtype = buffer.dtype if buffer.device.type != "meta" and buffer.is_floating_point() else torch.float32
            inv_freq, attention = plan.compute(slot, device=device)
            inv_freq = inv_freq.to(device=device, dtype=dtype)
            if buffer.device.type == "meta" or buffer.shape != inv_freq.shape or not torch.equal(buffer, inv_freq):
                applied.changed = True
            _set_tensor(module, f"{prefix}inv_freq", inv_freq)
            if isinstance(getattr(module, f"{prefix}original_inv_freq", None), torch.Tensor):
                _set_tensor(module, f"{prefix}original_inv_freq", inv_freq.clone())
            if hasattr(module, f"{prefix}long_inv_freq"):
                delattr(module, f"{prefix}long_inv_freq")
            setattr(module, f"{prefix}attention_scaling", float(attention))
            # stock dynamic machinery must stay inert: our hook owns dynamic behaviour (`PatchPlan.stock_rope_type`)
            compat.set_module_rope_type(module, prefix, slot, plan.stock_rope_type(slot))
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
                applied.hooks.append(module.register_forward_pre_hook(hook, with_kwargs=True))
            applied.touched.append(f"{name}[{slot}]" if slot else name)
    if not applied.touched:
        raise UnsupportedModelError(
            f"found rotary modules {[m[0] for m in modules]} but none serves layer types {list(plan.targets)}"
        )
    return applied
