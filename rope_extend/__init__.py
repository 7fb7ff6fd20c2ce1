"""rope-extend: extend the context window of Hugging Face LLaMA-family models by rescaling RoPE.

    from rope_extend import patch_model
    report = patch_model(model, method="yarn", factor=4)   # in place; returns a PatchReport

The public names are loaded on first use (module `__getattr__`), so `import rope_extend` and the CLI's help,
`--version`, `methods` and `validate` never import torch or transformers. Errors and the version are plain.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .errors import (
    AlreadyScaledError,
    CheckpointError,
    ModelConfigError,
    NoExtensionError,
    RopeExtendError,
    ShorterWindowError,
    SpecError,
    UnsupportedModelError,
    VerificationError,
)
from .version import __version__

# public name -> the module that defines it (imported on first access)
_LAZY = {
    "RopeContext": ".methods",
    "compute": ".methods",
    "get_method": ".methods",
    "method_names": ".methods",
    "PatchReport": ".patch",
    "find_rotary_modules": ".patch",
    "patch_model": ".patch",
    "unpatch_model": ".patch",
    "PatchPlan": ".plan",
    "plan_patch": ".plan",
    "RopeSpec": ".spec",
    "load_spec": ".spec",
}

if TYPE_CHECKING:  # static analysers and IDEs see the real names
    from .methods import RopeContext, compute, get_method, method_names
    from .patch import PatchReport, find_rotary_modules, patch_model, unpatch_model
    from .plan import PatchPlan, plan_patch
    from .spec import RopeSpec, load_spec


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rope_extend' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AlreadyScaledError",
    "CheckpointError",
    "ModelConfigError",
    "NoExtensionError",
    "PatchPlan",
    "PatchReport",
    "RopeContext",
    "RopeExtendError",
    "RopeSpec",
    "ShorterWindowError",
    "SpecError",
    "UnsupportedModelError",
    "VerificationError",
    "__version__",
    "compute",
    "find_rotary_modules",
    "get_method",
    "load_spec",
    "method_names",
    "patch_model",
    "plan_patch",
    "unpatch_model",
]
