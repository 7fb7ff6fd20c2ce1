"""A real SGLang for the engines report, the tests and `eval --engine sglang`: its own virtualenv, built once per machine.

SGLang pins its own torch and transformers (0.5.15: torch 2.11.0, transformers 5.12.1), so it cannot share
rope-extend's environment; rope-extend starts SGLang's own server (`python -m sglang.launch_server`) under this
Python and talks to it over HTTP (`sglang/run.py`). `ensure_sglang()` (`python -m rope_extend.engines.sglang.env`,
`make sglang`) builds it into `$ROPE_EXTEND_CACHE/sglang-<version>/` (default `~/.cache/rope-extend/`) from PyPI,
in three pip steps, each pinned here with its reason (measured on this 2-core x86_64 CPU machine, 2026-12-06):

1. `torch==2.14.1` and `torchvision==0.29.1`: PyPI's CUDA build, which runs CPU-only on a machine without a GPU.
   SGLang imports torchvision, and PyPI's torchvision does not load beside the `+cpu` torch ("operator
   torchvision::nms does not exist"). SGLang 0.5.15 asks for torch 2.11.0; 2.14.1 is what pip takes from this
   machine's disk (no multi-GB download) and serves the torch-native path bit-identically to transformers.
2. `sglang==0.5.15` without its dependencies (`--no-deps`): its metadata pins torch 2.11.0 and GPU-only kernels
   (flashinfer, flash-attn-4, sglang-kernel, nvidia-cutlass-dsl, tilelang, deep-gemm...) that its CPU engine's
   torch-native path never imports. 0.5.15 is the last release that runs on a CPU from PyPI alone: 0.5.16 and later
   import `sgl_kernel` on the CPU engine, whose CPU build is not published.
3. `RUNTIME`: what the server imports on that path (HTTP server, tokenizer, grammar backends...), each pinned to
   what pip resolved on 2026-12-06, transformers at the 5.12.1 SGLang pins.

Then `import sglang` and its HTTP server module are checked, and `versions.json` records every installed
distribution with the build's date and duration; it is written last, so a build without it is incomplete and is
redone. The environment is ~6.2 GB, 3.2 GB of it NVIDIA libraries that are never loaded on a CPU.

`ROPE_EXTEND_SGLANG_PYTHON` names another Python with SGLang instead (e.g. a CUDA build on a GPU machine): nothing is
built then, and the versions are read from that interpreter.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ...demo_model import cache_root
from ..engine_env import EngineEnvError, create_venv, installed_versions, locked, pip, read_stamp, write_stamp

SGLANG_VERSION = "0.5.15"
TORCH = ("torch==2.14.1", "torchvision==0.29.1")
# What the CPU engine's torch-native path imports (pinned to what pip resolved on 2026-12-06).
RUNTIME = (
    "transformers==5.12.1", "aiohttp==3.14.5", "fastapi==0.165.0", "uvicorn==0.55.0", "uvloop==0.23.0",
    "orjson==3.13.0", "pyzmq==27.3.0", "psutil==7.2.2", "requests==2.34.2", "numpy==2.3.5", "pydantic==2.14.4",
    "python-multipart==0.0.34", "setproctitle==1.3.8", "msgspec==0.23.0", "pybase64==1.5.1",
    "sentencepiece==0.2.3", "tiktoken==0.14.0", "interegular==0.3.3", "partial-json-parser==0.2.1.1.post7",
    "prometheus-client==0.26.0", "einops==0.8.2", "packaging==26.4", "pillow==13.0.0", "scipy==1.17.1",
    "tqdm==4.70.1", "xgrammar==0.2.1", "llguidance==0.7.30", "openai==2.6.1", "openai-harmony==0.0.4",
    "blobfile==3.0.0", "gguf==0.19.0", "watchfiles==1.3.0", "distro==1.9.0", "easydict==1.14",
    "compressed-tensors==0.20.1", "soundfile==0.13.1", "mistral-common==1.13.1", "ipython==9.19.1", "dill==0.4.1",
)
PYTHON_ENV = "ROPE_EXTEND_SGLANG_PYTHON"
KEY_PACKAGES = ("sglang", "torch", "transformers")
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1"}  # SGLang's CPU engine (its torch-native path where no CPU kernel is built)


class SglangEnvError(EngineEnvError):
    """The SGLang environment could not be built or does not work; the message ends with pip's or Python's output."""


@dataclass(frozen=True)
class SglangEnv:
    """A Python with a working SGLang, and what it holds (`versions`: distribution -> version)."""

    python: Path
    versions: dict

    @property
    def sglang_version(self) -> str:
        return str(self.versions.get("sglang", "?"))

    @property
    def label(self) -> str:
        """The engine as rows name it: 'SGLang 0.5.15'."""
        return f"SGLang {self.sglang_version}"


def default_root() -> Path:
    return cache_root() / f"sglang-{SGLANG_VERSION}"


def _versions(python: Path) -> dict:
    """Every distribution of `python`'s environment and SGLang's version; imports SGLang and its HTTP server."""
    return installed_versions(python, "sglang", SglangEnvError, env=CPU_ENV, also=("sglang.srt.entrypoints.http_server",))


def find_sglang(root: Path | None = None) -> SglangEnv | None:
    """The SGLang named by $ROPE_EXTEND_SGLANG_PYTHON, else a complete build under `root`; None when there is none."""
    named = os.environ.get(PYTHON_ENV)
    if named:
        return SglangEnv(Path(named), _versions(Path(named)))
    root = root or default_root()
    record = read_stamp(root)
    return None if record is None else SglangEnv(root / "bin" / "python", record["versions"])


def ensure_sglang(root: Path | None = None, log: Callable[[str], None] | None = None) -> SglangEnv:
    """A working SGLang: $ROPE_EXTEND_SGLANG_PYTHON, the cached build, or a new build (136-547 s measured: the
    module)."""
    log = log or (lambda line: print(f"rope-extend: {line}", file=sys.stderr, flush=True))
    if os.environ.get(PYTHON_ENV):
        return find_sglang(root)  # the caller's own SGLang: nothing is installed into it
    root = root or default_root()
    with locked(root):  # one builder at a time; a caller that waited finds the build done
        found = find_sglang(root)
        if found is None:
            _build(root, log)
            found = find_sglang(root)
        return found


def _build(root: Path, log: Callable[[str], None]) -> None:
    started = time.perf_counter()
    if root.exists():
        log(f"SGLang: removing the incomplete build at {root}")
    log(f"SGLang: [1/4] creating the virtualenv {root}")
    create_venv(root, SglangEnvError)
    log(f"SGLang: [2/4] pip install {' '.join(TORCH)} (PyPI's build: SGLang's torchvision needs it; the whole "
        "build, 6.3 GB, took 547 s on this project's 2-core machine on 2026-12-07 at load 8-12, 136 s with pip's "
        "cache warm)")
    pip(root, "install", *TORCH, error=SglangEnvError)
    log(f"SGLang: [3/4] pip install --no-deps sglang=={SGLANG_VERSION}, then what its CPU path imports")
    pip(root, "install", "--no-deps", f"sglang=={SGLANG_VERSION}", error=SglangEnvError)
    pip(root, "install", *RUNTIME, *TORCH, error=SglangEnvError)
    log("SGLang: [4/4] checking `import sglang` and its HTTP server")
    versions = _versions(root / "bin" / "python")
    seconds = round(time.perf_counter() - started, 1)
    write_stamp(root, {
        "requirements": [*TORCH, f"sglang=={SGLANG_VERSION} (--no-deps)", *RUNTIME],
        "built": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seconds": seconds,
        "versions": versions,
    })
    key = ", ".join(f"{k} {versions[k]}" for k in KEY_PACKAGES if k in versions)
    log(f"SGLang: built in {seconds:.0f} s: {key} ({root / 'versions.json'})")


def main(argv: list[str]) -> int:
    """`python -m rope_extend.engines.sglang.env [--print-python]`: build (or find) the environment."""
    env = ensure_sglang()
    if "--print-python" in argv:
        print(env.python)
    else:
        key = ", ".join(f"{k} {env.versions[k]}" for k in KEY_PACKAGES if k in env.versions)
        print(f"SGLang environment: {env.python} ({key})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
