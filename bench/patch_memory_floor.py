"""Where the config-only `rope-extend patch` command's peak RSS goes: each import stage in a fresh child, side by side.

    python bench/patch_memory_floor.py

Each row is a fresh `python -c ...` child (peak RSS from os.wait4, modules counted by top-level package) that
imports one more stage of what the patch command needs: torch; transformers' config class (which already imports
torch.distributed.tensor -> sympy and accelerate, through transformers.activations -> hub_kernels ->
core_model_loading); the modeling module the verification builds its small model from (modeling_utils -> loss ->
scipy; generation -> masking_utils -> torch._dynamo); rope-extend's own CLI and patch modules on top. The last row is
the whole command on the demo model (SmolLM2-135M, cached under ~/.cache/rope-extend), offline. The difference
between the last two rows is what the command's work (config read, write, verification, model card) adds to its
imports.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, demo_model

COUNT = ("import collections, json, sys; "
         "print(json.dumps(collections.Counter(m.split('.')[0] for m in list(sys.modules))))")
STAGES = [
    ("python", "pass"),
    ("import torch", "import torch"),
    ("+ transformers.LlamaConfig", "import torch; from transformers import LlamaConfig"),
    ("+ modeling_llama (the model code)", "import torch; from transformers import LlamaConfig; "
                                          "from transformers.models.llama import modeling_llama"),
    ("+ rope-extend CLI and patch modules", "import torch; from transformers.models.llama import modeling_llama; "
                                            "import rope_extend.cli.main, rope_extend.checkpoint, rope_extend.verify, "
                                            "typer._adapters"),
]
WATCH = ("torch", "sympy", "scipy", "transformers", "numpy", "accelerate", "PIL", "jinja2", "pydantic", "rope_extend")


def child(argv: list[str], env: dict) -> tuple[float, str]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                            cwd=str(ROOT))
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv[-1][:80]}: exit {os.waitstatus_to_exitcode(status)}")
    return usage.ru_maxrss * 1024 / 1e6, out


def main() -> None:
    smol = demo_model()
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    # nothing heavy in this process: a forked child's peak RSS starts at its parent's
    _, versions = child([sys.executable, "-c", "import torch, transformers; "
                         "print(torch.__version__, transformers.__version__)"], env)
    torch_version, transformers_version = versions.split()
    print(f"torch {torch_version}, transformers {transformers_version}, demo model at {smol}")
    print(f"{'stage (fresh process)':<40}{'peak RSS MB':>12}{'modules':>9}  " + " ".join(f"{w:>6}" for w in WATCH))
    child([sys.executable, "-c", STAGES[-1][1]], env)  # page cache warm for all rows alike
    for name, code in STAGES:
        rss, out = child([sys.executable, "-c", f"{code}\n{COUNT}"], env)
        counts = json.loads(out.strip().splitlines()[-1])
        print(f"{name:<40}{rss:>12.0f}{sum(counts.values()):>9}  "
              + " ".join(f"{counts.get(w, 0):>6}" for w in WATCH))
    work = Path(tempfile.mkdtemp(prefix="rope-bench-floor-"))
    try:
        rss, _ = child([sys.executable, "-m", "rope_extend", "patch", "smollm2", "--method", "yarn", "--factor", "4",
                        "-o", str(work / "out")], env)
        print(f"{'whole patch command (135M demo)':<40}{rss:>12.0f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
