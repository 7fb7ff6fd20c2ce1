"""rope-extend: extend the context window of Hugging Face LLaMA-family models by rescaling RoPE.

    from rope_extend import patch_model
    report = patch_model(model, method="yarn", factor=4)   # in place; returns a PatchReport
"""

from .errors import (
    AlreadyScaledError,
    CheckpointError,
    RopeExtendError,
    SpecError,
    UnsupportedModelError,
    VerificationError,
)
from .methods import RopeContext, compute, get_method, method_names
from .patch import PatchReport, find_rotary_modules, patch_model, unpatch_model
from .plan import PatchPlan, plan_patch
from .spec import RopeSpec, load_spec
from .version import __version__

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
