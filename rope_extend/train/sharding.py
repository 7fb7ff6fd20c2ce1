"""Sharded training (FSDP, DeepSpeed ZeRO-3) under `accelerate launch`: what rope-extend adds to accelerate's own.

Two pieces, each used by `runner.train_model`:

- `fsdp_on_cpu`: accelerate (1.15-1.16) turns its FSDP plugin on only for accelerator process groups
  (`AcceleratorState` sets `DistributedType.FSDP` from MULTI_GPU/XPU/NPU/..., never from MULTI_CPU), so the shipped
  `configs/accelerate/fsdp.yaml` on CPU processes silently became DDP. torch's FSDP2 (`fully_shard`) runs on the
  CPU over gloo, and accelerate's FSDP2 preparation has nothing device-specific in it, so while the Trainer builds
  its Accelerator this piece completes accelerate's choice for a gloo group: the plugin the launch asked for is
  used, and every process holds only its shard of the weights, gradients and AdamW state. Swappable: delete it
  when accelerate does this itself (then it does nothing: the state is already FSDP).
- `unsharded_model`: after a sharded run no process holds the trained model whole, so every process takes part in
  gathering the full state dict (accelerate's `get_state_dict`: FSDP2's full state dict, ZeRO-3's consolidated
  one) and the main process loads it into a freshly built, unsharded copy of the patched model; the checkpoint
  writer then works on that copy exactly as after a one-process run.
"""

from __future__ import annotations

import contextlib
import os

from ..errors import SpecError


def asked() -> str | None:
    """'FSDP' or 'DeepSpeed' when the accelerate launch asked for one, else None."""
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        return "FSDP"
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        return "DeepSpeed"
    return None


def check_lora(trains_embeddings_and_norms: bool) -> None:
    """LoRA+ (adapters plus trainable embeddings and norms) under FSDP is refused before any work: peft trains the
    embeddings and norms as `modules_to_save` copies, which accelerate's FSDP2 path cannot prepare
    (`tie_weights` on the peft model with fsdp_cpu_ram_efficient_loading: "attribute 'weight' already exists") or
    save (peft looks for 'modules_to_save.default.weight' in FSDP's state dict). LoRA alone runs under FSDP, and
    LoRA+ under DeepSpeed ZeRO-3 (both in the suite on 2 CPU processes)."""
    if trains_embeddings_and_norms and asked() == "FSDP":
        raise SpecError("--lora trains the embeddings and norms too (peft modules_to_save), which accelerate's FSDP "
                        "cannot prepare or save; add --lora-only (LoRA alone runs under FSDP), or "
                        "launch with configs/accelerate/deepspeed-zero3.yaml or plain data-parallel (torchrun)",
                        field="lora", value=True)


@contextlib.contextmanager
def fsdp_on_cpu():
    """While the Trainer builds its Accelerator: a CPU (gloo) process group given an FSDP plugin runs FSDP."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP  # what accelerate does for MULTI_GPU (state.py)
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    AcceleratorState.__init__ = init
    try:
        yield
    finally:
        AcceleratorState.__init__ = original


def is_sharded(trainer) -> bool:
    """True when no process holds the whole model: FSDP, or DeepSpeed ZeRO stage 3."""
    if trainer.is_fsdp_enabled:
        return True
    if trainer.is_deepspeed_enabled:
        return trainer.accelerator.state.deepspeed_plugin.zero_stage == 3
    return False


def note(trainer) -> str | None:
    """A line when the launch asked for FSDP or DeepSpeed and the run is not sharded that way."""
    name = asked()
    active = trainer.is_fsdp_enabled if name == "FSDP" else trainer.is_deepspeed_enabled
    if name is None or active:
        return None
    import accelerate

    return (f"the accelerate config asks for {name}, but accelerate {accelerate.__version__} did not set it up: this "
            f"run is {trainer.accelerator.distributed_type.value} (every process holds the whole model and optimizer "
            "state; the same weights as one process with this global batch)")


def describe(trainer) -> str:
    """The progress line's words for how the model is spread over the processes."""
    world, device = trainer.accelerator.num_processes, trainer.accelerator.device.type
    if trainer.is_fsdp_enabled:
        version = trainer.accelerator.state.fsdp_plugin.fsdp_version
        return (f"FSDP{version} over {world} processes ({device}): each holds 1/{world} of the weights, gradients "
                "and optimizer state")
    if trainer.is_deepspeed_enabled:
        stage = trainer.accelerator.state.deepspeed_plugin.zero_stage
        held = {3: "weights, gradients and optimizer state", 2: "gradients and optimizer state",
                1: "optimizer state"}.get(stage)
        return (f"DeepSpeed ZeRO-{stage} over {world} processes ({device})"
                + (f": each holds 1/{world} of the {held}" if held else ""))
    if world == 1:
        return f"one process ({device})"
    return f"DDP over {world} processes ({device}): each holds the whole model and optimizer state"


def unsharded_model(trainer, rebuild):
    """The trained model whole, in the main process (None in the others), from a sharded run. Every process must
    call this (the gather is collective). `rebuild()` builds the untrained, patched (and LoRA-wrapped) model the
    state dict loads into."""
    import torch

    state = trainer.accelerator.get_state_dict(trainer.model_wrapped)
    if not trainer.accelerator.is_main_process:
        return None
    model = rebuild()
    targets = model.state_dict(keep_vars=True)
    unexpected = sorted(set(state) - set(targets))
    written = set()
    with torch.no_grad():
        for name, tensor in targets.items():
            if name in state:
                tensor.copy_(state[name].to(tensor.dtype))
                written.add(tensor.data_ptr())
    missing = sorted(name for name, tensor in targets.items() if tensor.data_ptr() not in written)
    if unexpected or missing:  # a tied LM head may be left out of the gather: its storage is written by its twin
        raise RuntimeError(f"the gathered state dict does not match the model: missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]}")
    return model
