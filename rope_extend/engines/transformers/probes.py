"""transformers 4.x and 5.x, the reference engine: the real library, not a port.

The running transformers is probed in-process; the other line runs `hf_probe.py` under the Python named by
ROPE_EXTEND_OTHER_PYTHON (a fresh, isolated process that cannot import rope_extend), one process for many
checkpoints. Both build the model's own rotary module from config.json and call its forward, so dynamic methods
switch exactly as the library does.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import torch

from ..served import NotServed, Served, positions
from . import hf_probe

OTHER_PYTHON_ENV = "ROPE_EXTEND_OTHER_PYTHON"
Results = tuple[str | None, dict[int, Served | NotServed]]


def _results(result: dict, lengths: list[int], version: str | None) -> Results:
    if "error" in result:
        reason = f"transformers {version or ''} refuses the config: {result['error']}"
        return version, {n: NotServed(reason) for n in lengths}
    requests = result["requests"].items()
    return result["version"], {n: Served(inv_freq=None, cos=c.numpy(), sin=s.numpy()) for n, (c, s) in requests}


def _job(folder: Path, lengths: list[int], layer_type: str | None = None) -> dict:
    job = {"folder": str(folder), "requests": [[n, positions(n).tolist()] for n in lengths]}
    if layer_type is not None:  # the layers of that type (Gemma 3's sliding layers); default: full attention
        job["layer_type"] = layer_type
    return job


def here_version() -> str:
    import transformers

    return transformers.__version__


def run_here(jobs: list[tuple]) -> list[Results]:
    """The running transformers' served cos/sin for each (config folder, request lengths[, layer type])."""
    raw = hf_probe.probe_many([_job(*job) for job in jobs])
    return [_results(result, job[1], here_version()) for result, job in zip(raw, jobs)]


def run_other(jobs: list[tuple], python: str | None = None) -> list[Results]:
    """The same with another Python (the other transformers line), in one subprocess for all jobs."""
    python = python or os.environ.get(OTHER_PYTHON_ENV)
    if not python:
        reason = f"not run: set {OTHER_PYTHON_ENV} to a Python with the other transformers line"
        return [(None, {n: NotServed(reason) for n in job[1]}) for job in jobs]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    with tempfile.TemporaryDirectory(prefix="rope-extend-probe-") as tmp:
        jobs_file, target = Path(tmp) / "jobs.json", Path(tmp) / "probe.pt"
        jobs_file.write_text(json.dumps([_job(*job) for job in jobs]))
        proc = subprocess.run(
            [python, "-I", str(Path(hf_probe.__file__)), str(jobs_file), str(target)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp,
        )
        if proc.returncode != 0 or "probe-ok" not in proc.stdout:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
            reason = f"not run: {python} failed: {last}"
            return [(None, {n: NotServed(reason) for n in job[1]}) for job in jobs]
        raw = torch.load(target)
    return [_results(result, job[1], None) for result, job in zip(raw, jobs)]
