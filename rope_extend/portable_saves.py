"""Portable saves: every config that carries rope-extend's marker saves the portable layout
(`compat.portable_checkpoint_config`), whatever saves it (`save_pretrained`, `push_to_hub`, Trainer checkpoints: all go
through transformers' `PretrainedConfig.to_json_file`), so stock transformers 4.x and 5.x reload the same RoPE."""

from __future__ import annotations

import functools
import json
import warnings
from pathlib import Path

from .compat import portable_checkpoint_config, read_marker, read_slots, text_config


def enable_portable_saves() -> None:
    """Make every config that carries the rope-extend marker save (`save_pretrained`, `push_to_hub`, Trainer
    checkpoints: all go through `to_json_file`) the portable layout, so stock 4.x and 5.x reload the same RoPE.

    Installed once by `patch_model`; configs without the marker (e.g. after `unpatch_model`) save as usual.
    """
    from transformers import PretrainedConfig

    original = PretrainedConfig.to_json_file
    if getattr(original, "_rope_extend_portable", False):
        return

    @functools.wraps(original)
    def to_json_file(self, json_file_path, use_diff: bool = True):
        original(self, json_file_path, use_diff=use_diff)
        text = text_config(self)
        marker = read_marker(text)
        if marker is None:
            return
        path = Path(json_file_path)
        data = json.loads(path.read_text(encoding="utf-8"))
        data = portable_checkpoint_config(data, read_slots(text), int(text.max_position_embeddings), marker)
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        if marker.get("stock_loaders"):  # the method's marker_note: saved, this copy is something else to them
            warnings.warn(f"saved {str(path.parent)!r}: stock loaders (transformers, vLLM, SGLang, llama.cpp) load "
                          f"it as {marker['stock_loaders']}", UserWarning, stacklevel=2)

    to_json_file._rope_extend_portable = True
    PretrainedConfig.to_json_file = to_json_file
