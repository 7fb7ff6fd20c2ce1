"""What every run engine's own virtualenv shares: built once per machine under `$ROPE_EXTEND_CACHE` (default
`~/.cache/rope-extend/`), one builder at a time, stamped with `versions.json` last.

A serving engine pins its own torch and transformers, so it cannot share rope-extend's environment; each engine's
room's environment module (`vllm/env.py`, `sglang/env.py`) says what it installs and why, and uses these pieces to build it: `locked(root)`
(concurrent callers wait; the one that waited finds the build done), `create_venv`, `pip`, `installed_versions`
(every distribution, as `pip freeze` lists them, and the version the engine's module reports on import: the import
is the check) and `write_stamp` (atomic: a build without its stamp is incomplete and is redone from scratch).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

VERSIONS_FILE = "versions.json"


class EngineEnvError(RuntimeError):
    """An engine's environment could not be built or does not work; the message ends with pip's or Python's output."""


@contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold the build lock of `root` (a file beside it)."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def create_venv(root: Path, error: type[EngineEnvError] = EngineEnvError) -> Path:
    """A new virtualenv at `root` (an incomplete earlier one removed first); returns its Python."""
    if root.exists():
        shutil.rmtree(root)
    base = getattr(sys, "_base_executable", sys.executable)
    proc = subprocess.run([base, "-m", "venv", str(root)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise error(f"{base} -m venv {root} failed:\n{proc.stderr[-3000:]}")
    return root / "bin" / "python"


def pip(root: Path, *args: str, error: type[EngineEnvError] = EngineEnvError) -> None:
    """`pip ARGS` in the virtualenv at `root`; `error` with pip's output when it fails."""
    cmd = [str(root / "bin" / "python"), "-m", "pip", *args, "-q", "--disable-pip-version-check"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise error(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")


def installed_versions(python: Path, module: str, error: type[EngineEnvError] = EngineEnvError,
                       env: dict | None = None, also: tuple[str, ...] = ()) -> dict:
    """Every distribution of `python`'s environment, and `module`'s own `__version__` under its name (importing it,
    and the modules `also`, is the check that the environment works)."""
    code = (
        f"import json, importlib.metadata as m, {', '.join((module, *also))}\n"
        "d = {x.metadata['Name'].lower(): x.version for x in m.distributions()}\n"
        f"d[{module!r}] = {module}.__version__\n"
        "print(json.dumps(d))\n"
    )
    proc = subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", **(env or {})))
    if proc.returncode != 0:
        raise error(f"`{python} -c 'import {module}'` failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def read_stamp(root: Path) -> dict | None:
    """The finished build's record at `root`, or None when there is none (no build, or an incomplete one)."""
    stamp = root / VERSIONS_FILE
    return json.loads(stamp.read_text()) if stamp.is_file() else None


def write_stamp(root: Path, record: dict) -> None:
    """Write `root`'s `versions.json` atomically (the last step of a build)."""
    tmp = root / f".{VERSIONS_FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, root / VERSIONS_FILE)
