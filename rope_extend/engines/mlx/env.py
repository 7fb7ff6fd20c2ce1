"""A real mlx-lm for the engines report, the tests and `eval --engine mlx`: its own virtualenv, built once per machine.

mlx-lm is what Mac users serve with (`mlx_lm.generate`, `mlx_lm.server`); on Linux it runs on the CPU through the
`mlx-cpu` wheel. It needs no torch, but it pins its own transformers (for its tokenizers) and numpy, so it gets its own
environment; rope-extend talks to it through a subprocess (`worker.py`, JSON lines). `ensure_mlx()`
(`python -m rope_extend.engines.mlx.env`, `make mlx`) builds it into `$ROPE_EXTEND_CACHE/mlx-lm-<version>/` (default
`~/.cache/rope-extend/`) from PyPI, in one pip step, every distribution pinned (what pip resolved on 2026-12-07 for
`pip install 'mlx[cpu]' mlx-lm` on this 2-core x86_64 machine, Python 3.11):

- `REQUIREMENTS`: `mlx[cpu]==0.32.4` (the array library; its `cpu` extra is `mlx-cpu==0.32.4`, the Linux CPU backend:
  libmlx with a bundled reference BLAS, netlib 3.10.0, which is slow: see below), `mlx-lm==0.32.2` (the engine; its
  metadata asks for `mlx` on macOS only, so on Linux a plain `pip install mlx-lm` installs no mlx at all and
  `import mlx_lm` fails: `mlx[cpu]` is what a Linux user must add) and `transformers==5.25.0` (mlx-lm >= 0.32 asks for
  transformers >= 5.7 for its tokenizers; 5.25.0 is what pip took, the version rope-extend's own environment runs).
- `PULLED`: what those pull, each pinned to the version pip resolved: numpy, sentencepiece, protobuf, pyyaml and jinja2
  (mlx-lm's own requirements), then transformers' (huggingface-hub, tokenizers, safetensors, regex, typer, kernels...)
  and theirs. No torch.

Then `import mlx_lm` and `import mlx.core` are checked, and `versions.json` records every installed distribution
(as `pip freeze` lists them) with the build's date and duration; it is written last, so a build without it is
incomplete and is redone from scratch. Concurrent callers serialise on a lock file (`engine_env.locked`).

Measured here (2026-12-07, load ~2): the build takes ~30 s from the machine's PyPI mirror; the environment is ~370 MB.
The mlx-cpu wheel's reference BLAS makes mlx-lm slow on this CPU (the demo model's 30 layers: minutes per thousand
tokens), so the suite serves the 2-layer model (`short_window`) and the demo model's runs are evidence runs
(`tools/run_engines.py --runs mlx`).

`ROPE_EXTEND_MLX_PYTHON` names another Python with mlx-lm instead (a Mac's, with the Metal backend): nothing is built
then, and the versions are read from that interpreter.

A faster BLAS, for the long evidence runs and the suite's MLX tests (a named, swappable piece, off by default): `ROPE_EXTEND_MLX_BLAS` names
a BLAS library (`libblas.so.3` with the CBLAS interface) that the MLX worker preloads (`LD_PRELOAD`), so that mlx's
matrix products (`cblas_sgemm`, an undefined symbol of libmlx.so) run in it instead of the wheel's reference BLAS;
every row and record names it (`MlxEnv.label`). `python -m rope_extend.engines.mlx.env --openblas` unpacks Debian's
OpenBLAS (`libopenblas0-pthread` 0.3.21 and the `libgfortran5` it links, fetched with `apt-get download`, unpacked
with `dpkg -x`: nothing is installed on the system) into the environment's `openblas/` and prints the variable to
set. Measured here: a 2048 x 576 x 49152 float32 product (the demo model's output layer on a prefill chunk) 0.9
GFLOPS in the reference BLAS, 15.9 in OpenBLAS on one thread (load ~10). The engine's code is unchanged: the BLAS
rounds differently, the RoPE is mlx-lm's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ...demo_model import cache_root
from ..engine_env import (
    VERSIONS_FILE,
    EngineEnvError,
    create_venv,
    installed_versions,
    locked,
    pip,
    read_stamp,
    write_stamp,
)

MLX_VERSION = "0.32.4"
MLX_LM_VERSION = "0.32.2"
# The engine, its array library with the CPU backend, and the transformers mlx-lm imports for its tokenizers.
REQUIREMENTS = (f"mlx[cpu]=={MLX_VERSION}", f"mlx-cpu=={MLX_VERSION}", f"mlx-lm=={MLX_LM_VERSION}", "transformers==5.25.0")
# What they pull (pip's resolution on 2026-12-07), pinned so that a rebuild installs the same files.
PULLED = (
    "numpy==2.4.6", "sentencepiece==0.2.3", "protobuf==7.36.2", "PyYAML==6.0.4", "Jinja2==3.1.6", "MarkupSafe==3.0.4",
    "huggingface_hub==2.4.0", "tokenizers==0.23.3", "safetensors==0.8.0", "regex==2026.12.2", "packaging==26.4",
    "tqdm==4.70.1", "typer==0.29.2", "kernels==0.19.1", "filelock==4.3.2", "fsspec==2026.9.0", "hf-xet==1.8.0",
    "httpx2==2.17.0", "httpcore2==2.17.0", "h11==0.16.0", "anyio==4.16.0", "idna==3.21", "truststore==0.10.5",
    "click==8.5.1", "rich==15.0.0", "Pygments==2.21.0", "markdown-it-py==4.3.0", "mdurl==0.1.2",
    "shellingham==1.5.4", "annotated-doc==0.0.7", "pydantic==2.14.4", "pydantic_core==2.50.5",
    "annotated-types==0.8.0", "typing-inspection==0.4.5", "typing_extensions==4.16.0", "tomlkit==0.15.3",
)
PYTHON_ENV = "ROPE_EXTEND_MLX_PYTHON"
KEY_PACKAGES = ("mlx-lm", "mlx", "mlx-cpu", "transformers")


BLAS_ENV = "ROPE_EXTEND_MLX_BLAS"
OPENBLAS_DEBS = ("libopenblas0-pthread", "libgfortran5")  # Debian's OpenBLAS (pthreads) and the runtime it links
OPENBLAS_LIB = "usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"  # inside the unpacked packages


class MlxEnvError(EngineEnvError):
    """The MLX environment could not be built or does not work; the message ends with pip's or Python's output."""


@dataclass(frozen=True)
class MlxEnv:
    """A Python with a working mlx-lm, and what it holds (`versions`: distribution -> version, and `mlx_lm`)."""

    python: Path
    versions: dict

    @property
    def mlx_lm_version(self) -> str:
        return str(self.versions.get("mlx_lm", self.versions.get("mlx-lm", "?")))

    @property
    def blas(self) -> Path | None:
        """The BLAS library the worker preloads ($ROPE_EXTEND_MLX_BLAS), None for the wheel's own."""
        named = os.environ.get(BLAS_ENV)
        return Path(named) if named else None

    @property
    def label(self) -> str:
        """The engine as rows name it: 'mlx-lm 0.32.2 (mlx 0.32.4, mlx-cpu)', with the preloaded BLAS if any
        ('..., mlx-cpu, BLAS openblas-pthread/libblas.so.3)': the library's folder and name)."""
        backend = ", mlx-cpu" if "mlx-cpu" in self.versions else ""
        blas = f", BLAS {self.blas.parent.name}/{self.blas.name}" if self.blas is not None else ""
        return f"mlx-lm {self.mlx_lm_version} (mlx {self.versions.get('mlx', '?')}{backend}{blas})"

    def worker_environ(self) -> dict:
        """The variables the worker needs on top of the caller's: the preloaded BLAS and where its libraries are."""
        if self.blas is None:
            return {}
        if not self.blas.is_file():
            raise MlxEnvError(f"{BLAS_ENV}={self.blas}: no such file (python -m rope_extend.engines.mlx.env "
                              "--openblas unpacks Debian's OpenBLAS and prints the path)")
        folders = [str(self.blas.parent), str(self.blas.parent.parent)]  # libopenblas.so.0, then libgfortran.so.5
        if os.environ.get("LD_LIBRARY_PATH"):
            folders.append(os.environ["LD_LIBRARY_PATH"])
        return {"LD_PRELOAD": str(self.blas), "LD_LIBRARY_PATH": ":".join(folders)}


def default_root() -> Path:
    return cache_root() / f"mlx-lm-{MLX_LM_VERSION}"


def _versions(python: Path) -> dict:
    """Every distribution of `python`'s environment and mlx-lm's version; imports mlx-lm and mlx's core."""
    return installed_versions(python, "mlx_lm", MlxEnvError, also=("mlx.core",))


def find_mlx(root: Path | None = None) -> MlxEnv | None:
    """The mlx-lm named by $ROPE_EXTEND_MLX_PYTHON, else a complete build under `root`; None when there is none."""
    named = os.environ.get(PYTHON_ENV)
    if named:
        return MlxEnv(Path(named), _versions(Path(named)))
    root = root or default_root()
    record = read_stamp(root)
    return None if record is None else MlxEnv(root / "bin" / "python", record["versions"])


def ensure_mlx(root: Path | None = None, log: Callable[[str], None] | None = None) -> MlxEnv:
    """A working mlx-lm: $ROPE_EXTEND_MLX_PYTHON, the cached build, or a new build (about 30 s here)."""
    log = log or (lambda line: print(f"rope-extend: {line}", file=sys.stderr, flush=True))
    if os.environ.get(PYTHON_ENV):
        return find_mlx(root)  # the caller's own mlx-lm: nothing is installed into it
    root = root or default_root()
    with locked(root):  # one builder at a time; a caller that waited finds the build done
        found = find_mlx(root)
        if found is None:
            _build(root, log)
            found = find_mlx(root)
        return found


def _build(root: Path, log: Callable[[str], None]) -> None:
    started = time.perf_counter()
    if root.exists():
        log(f"MLX: removing the incomplete build at {root}")
    log(f"MLX: [1/3] creating the virtualenv {root}")
    create_venv(root, MlxEnvError)
    log(f"MLX: [2/3] pip install {' '.join(REQUIREMENTS)} and {len(PULLED)} pinned dependencies (~370 MB, no torch)")
    pip(root, "install", *REQUIREMENTS, *PULLED, error=MlxEnvError)
    log("MLX: [3/3] checking `import mlx_lm` and `import mlx.core`")
    versions = _versions(root / "bin" / "python")
    seconds = round(time.perf_counter() - started, 1)
    write_stamp(root, {
        "requirements": list(REQUIREMENTS),
        "pulled": list(PULLED),
        "built": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seconds": seconds,
        "versions": versions,
    })
    key = ", ".join(f"{k} {versions[k]}" for k in KEY_PACKAGES if k in versions)
    log(f"MLX: built in {seconds:.0f} s: {key} ({root / VERSIONS_FILE})")


def ensure_openblas(root: Path | None = None, log: Callable[[str], None] | None = None) -> Path:
    """Debian's OpenBLAS unpacked into the environment's `openblas/` (see the module docstring); returns the
    library to name in $ROPE_EXTEND_MLX_BLAS. Needs `apt-get` and `dpkg` (Debian, Ubuntu); installs nothing."""
    log = log or (lambda line: print(f"rope-extend: {line}", file=sys.stderr, flush=True))
    folder = (root or default_root()) / "openblas"
    library = folder / OPENBLAS_LIB
    with locked(folder):
        if library.is_file():
            return library
        if not shutil.which("apt-get") or not shutil.which("dpkg"):
            raise MlxEnvError("--openblas unpacks Debian's libopenblas0-pthread: it needs apt-get and dpkg; on another "
                              f"system set {BLAS_ENV} to a libblas.so.3 with the CBLAS interface")
        debs = folder / "debs"
        debs.mkdir(parents=True, exist_ok=True)
        log(f"MLX: apt-get download {' '.join(OPENBLAS_DEBS)} into {debs}")
        proc = subprocess.run(["apt-get", "download", *OPENBLAS_DEBS], cwd=debs, capture_output=True, text=True)
        if proc.returncode != 0:
            raise MlxEnvError(f"apt-get download {' '.join(OPENBLAS_DEBS)} failed:\n{proc.stderr[-2000:]}")
        for deb in sorted(debs.glob("*.deb")):
            log(f"MLX: dpkg -x {deb.name}")
            subprocess.run(["dpkg", "-x", str(deb), str(folder)], check=True, capture_output=True)
        if not library.is_file():
            raise MlxEnvError(f"the unpacked packages hold no {OPENBLAS_LIB} (another architecture or release?)")
        return library


def main(argv: list[str]) -> int:
    """`python -m rope_extend.engines.mlx.env [--print-python] [--openblas]`: build (or find) the environment;
    `--openblas` also unpacks Debian's OpenBLAS beside it and prints the variable that makes the worker use it."""
    started = time.perf_counter()
    env = ensure_mlx()
    if "--openblas" in argv:
        library = ensure_openblas()
        print(f"export {BLAS_ENV}={library}")
        return 0
    if "--print-python" in argv:
        print(env.python)
    else:
        key = ", ".join(f"{k} {env.versions[k]}" for k in KEY_PACKAGES if k in env.versions)
        print(f"MLX environment: {env.python} ({key}; {time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
