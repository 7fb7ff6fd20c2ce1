"""`rope-extend train` with each window sharded over the processes but WITHOUT Ulysses attention: the negative
control of the sequence-parallel test (tests/test_train.py).

Run under a launcher in place of `-m rope_extend` (`torchrun --nproc_per_node 2 tests/sharded_without_ulysses.py
train ... --sequence-parallel 2`). Everything runs as in a real sequence-parallel run (DeepSpeed's process groups,
the data adapter that splits each window, the loss combined over the group), except that right after DeepSpeed
registers its Ulysses attention the model's own attention function is put back: each process then attends only
within its own shard of the window. The file named by SHARDED_WITHOUT_ULYSSES_MARKER is written when that happened,
so the test can assert that this path ran.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

_register = UlyssesSPAttentionHF.register_with_transformers


def _register_then_remove(*args, **kwargs):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = kwargs["core_attn_implementation"]
    local = ALL_ATTENTION_FUNCTIONS._local_mapping
    had, before = name in local, local.get(name)
    groups = _register(*args, **kwargs)  # the process groups the data adapter and the loss use
    if had:
        local[name] = before
    else:
        local.pop(name)
    Path(os.environ["SHARDED_WITHOUT_ULYSSES_MARKER"]).with_suffix(f".{os.environ['RANK']}").write_text(name)
    return groups


UlyssesSPAttentionHF.register_with_transformers = staticmethod(_register_then_remove)

if __name__ == "__main__":
    from rope_extend.cli import run

    sys.exit(run(sys.argv[1:]))
