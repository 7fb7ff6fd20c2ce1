"""rope-extend: extend the context window of Hugging Face LLaMA-family models by rescaling RoPE.

    from rope_extend import patch_model
    report = patch_model(model, method="yarn", factor=4)   # in place; returns a PatchReport
"""

__version__ = "0.1.0"

from .errors import (
    AlreadyScaledError,
    CheckpointError,
    RopeExtendError,
    SpecError,
    UnsupportedModelError,
    VerificationError,
)
from .methods import RopeContext, compute, get_method, method_names
from .patch import PatchPlan, PatchReport, find_rotary_modules, patch_model, plan_patch, unpatch_model
from .spec import RopeSpec, load_spec

__all__ = [
    "AlreadyScaledError",
    "CheckpointError",
    "PatchPlan",
    "PatchReport",
    "RopeContext",
    "RopeExtendError",
    "RopeSpec",
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
