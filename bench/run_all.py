"""Run every benchmark in sequence (see each script's docstring; numbers are recorded in docs/results.md)."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
for script in ("cli_startup.py", "patch_speed.py", "forward_overhead.py", "decode_step.py", "ppl_memory.py",
               "eval_sharing.py", "eval_case_cost.py", "real_checkpoints.py", "attention_methods.py"):
    print(f"== {script}", flush=True)
    subprocess.run([sys.executable, str(HERE / script)], check=True, cwd=HERE)
