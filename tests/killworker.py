"""Worker run in a forkserver child by the kill-during-write test (importable, so the child can find it)."""

import os
import warnings


def write(source: str, out: str, mode: str) -> None:
    warnings.simplefilter("ignore")
    from rope_extend.checkpoint import patch_checkpoint

    patch_checkpoint(source, {"method": "yarn", "factor": 4}, out, mode=mode)
    os._exit(0)
