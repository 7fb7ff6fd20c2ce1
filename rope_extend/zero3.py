"""DeepSpeed ZeRO-3 and the models one process builds alone: verification's small copies, the checkpoint writer's
stock reload, the main process's copy of the gathered weights."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def without_zero3_init():
    """Within the block, transformers builds and loads models whole even while a DeepSpeed ZeRO-3 run is set up
    (`is_deepspeed_zero3_enabled()` false): for models that one process builds alone (verification copies, the
    checkpoint writer's stock reload, the main process's copy of the gathered weights). Both lines keep the run's
    config behind the same module-level weak reference."""
    from transformers.integrations import deepspeed

    saved = deepspeed._hf_deepspeed_config_weak_ref
    deepspeed._hf_deepspeed_config_weak_ref = None
    try:
        yield
    finally:
        deepspeed._hf_deepspeed_config_weak_ref = saved
