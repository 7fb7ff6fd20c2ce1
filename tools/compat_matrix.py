"""The compatibility matrix: rope-extend's core checks (tools/compat_checks.py) in one virtualenv per transformers
release, printed as a Markdown table. `make compat-matrix` runs every release below; `make compat-check` (part of
`make test`) the oldest supported 5.x only; `make compat-torch-floor` the floor torch pyproject.toml declares
(TORCH_FLOOR) with the transformers a plain install resolves beside it.

    python tools/compat_matrix.py [--releases 5.0.0 5.25.0] [--checks yarn probes] [--venvs DIR] [--torch torch==2.6.0]

Virtualenvs are built once under --venvs (default ~/.cache/rope-extend/compat-venvs) and reused while their
install line is unchanged: `base` holds the CPU torch wheel (installed first, so pip never pulls a CUDA build) and
rope-extend's other dependencies and `train` extra from pyproject.toml; each `<release>` holds that transformers
(and the versions of its dependencies it asks for) over the base. The checks import this checkout's rope_extend
(PYTHONPATH), not an installed copy. Exit status 1 when a check fails. Another `--torch` gets its own base
(`base-torch==2.6.0`) and release virtualenvs: PyPI has only the CUDA build of older torch releases for Linux, which
pip installs with its nvidia-* wheels (~3 GB; 766 MB of it torch 2.6.0) and which runs on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
TORCH = "torch==2.13.0"  # the CPU wheel the Makefile pins for CI
# The oldest torch a plain `pip install rope-extend` honours: pyproject.toml's floor. transformers 5.x (what pip
# resolves) disables torch < 2.6 ("Disabling PyTorch because PyTorch >= 2.6 is required", transformers 5.25).
TORCH_FLOOR = "torch==2.6.0"
# Releases and why each is here: the floor, the middle and the newest of each line, and every 5.x minor that
# changed what rope-extend calls (the KV-cache keyword, the attention-function registry, the RoPE init functions).
RELEASES = {
    "4.51.0": "floor: the first 4.x whose YaRN reads original_max_position_embeddings from rope_scaling",
    "4.54.1": "middle of 4.x: KV caches hold per-layer objects (cache.layers)",
    "4.57.6": "newest 4.x",
    "5.0.0": "oldest 5.x: rope_parameters; eager attention still called directly",
    "5.1.0": "eager attention looked up in the registry (get_interface)",
    "5.5.4": "RoPE validation reworked (5.4), proportional RoPE added (5.5)",
    "5.10.4": "middle of 5.x",
    "5.17.0": "issue 42's report: cache= swallowed by the forward's **kwargs",
    "5.21.1": "RoPE init functions take the config as a required argument",
    "5.23.0": "the last with past_key_values only",
    "5.24.0": "cache= in the modeling signatures, past_key_values deprecated",
    "5.25.0": "newest 5.x (CI's pin)",
}


def requirements() -> list[str]:
    """rope-extend's dependencies and `train` extra from pyproject.toml, without torch and transformers."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["train"]
    return [dep for dep in deps if re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0] not in ("torch", "transformers")]


def _pip(python: Path, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args], check=True)


def _venv(folder: Path, line: str, build, say) -> Path:
    """A virtualenv built once by `build(python)` and reused while its install line is unchanged."""
    python, marker = folder / "bin" / "python", folder / ".installed"
    if marker.is_file() and marker.read_text() == line and python.is_file():
        return python
    say(f"building {folder} (once; reused while its requirements are unchanged)")
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(folder)], check=True)
    build(python)
    marker.write_text(line)
    say(f"built {folder.name} in {time.perf_counter() - started:.0f} s")
    return python


def ensure_venv(venvs: Path, release: str, say, torch: str = TORCH) -> Path:
    """The release's virtualenv: transformers (and the versions of the other dependencies it needs) over a shared
    base virtualenv that holds the CPU torch and every other dependency (a .pth file puts the base's site-packages
    after the release's own, so the release's packages win and the base's torch is installed once)."""
    base_line = json.dumps({"python": sys.version.split()[0], "torch": torch, "requirements": requirements()})
    suffix = "" if torch == TORCH else f"-{torch}"

    def build_base(python: Path) -> None:
        _pip(python, torch)  # first: CI's CPU wheel, so nothing later pulls a CUDA torch
        deps = requirements()
        _pip(python, *[dep for dep in deps if not dep.startswith("peft")], torch)
        _pip(python, "--no-deps", *[dep for dep in deps if dep.startswith("peft")])  # peft would pull transformers

    base = _venv(venvs / f"base{suffix}", base_line, build_base, say)
    base_site = subprocess.run([str(base), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip()

    def build_release(python: Path) -> None:
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                              check=True, capture_output=True, text=True).stdout.strip()
        Path(site, "rope_extend_compat_base.pth").write_text(base_site + "\n")
        # with the other requirements, so pip installs here what this release needs instead of the base's (4.x's
        # huggingface_hub < 1 and the datasets that accepts it)
        _pip(python, f"transformers=={release}", *requirements(), torch)

    line = json.dumps({"base": base_line, "transformers": release, "with": requirements()})
    return _venv(venvs / f"{release}{suffix}", line, build_release, say)


def run_checks(python: Path, release: str, work: Path, checks: list[str], timeout: int, label: str | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    log = work / f"{release}.log"
    try:
        with open(log, "w") as stderr:
            result = subprocess.run([str(python), str(ROOT / "tools" / "compat_checks.py"), str(work / release),
                                     *checks], env=env, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                    timeout=timeout)
        row = json.loads(result.stdout.strip().splitlines()[-1])
        return {**row, "transformers": label or row["transformers"]}
    except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError) as exc:
        reason = f"timed out after {timeout} s" if isinstance(exc, subprocess.TimeoutExpired) else "no result"
        return {"transformers": label or release, "checks": {name: f"FAIL: {reason} (see {log})" for name in checks}}


def header(checks: list[str]) -> str:
    return "| transformers | " + " | ".join(checks) + " | seconds |\n" + "|---" * (len(checks) + 2) + "|"


def row_line(row: dict, checks: list[str]) -> str:
    cells = [row["checks"].get(name, "-") for name in checks]
    return f"| {row['transformers']} | " + " | ".join(cells) + f" | {sum(row.get('seconds', {}).values()):.0f} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--releases", nargs="+", default=list(RELEASES))
    parser.add_argument("--checks", nargs="+", default=None, help="default: all of tools/compat_checks.py")
    parser.add_argument("--venvs", type=Path, default=Path.home() / ".cache" / "rope-extend" / "compat-venvs")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a fresh one in /tmp)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per release's checks")
    parser.add_argument("--build-only", action="store_true", help="build the virtualenvs, run nothing")
    parser.add_argument("--torch", default=TORCH, help=f"the torch requirement (default {TORCH}, CI's CPU wheel; "
                        f"the floor row: {TORCH_FLOOR})")
    args = parser.parse_args(argv)
    checks = args.checks or ["yarn", "reload", "cli-patch", "cached-decode", "probes", "train"]
    work = args.work or Path(__import__("tempfile").mkdtemp(prefix="rope-extend-compat-"))
    work.mkdir(parents=True, exist_ok=True)

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    rows = []
    for release in args.releases:
        python = ensure_venv(args.venvs, release, say, args.torch)
        if args.build_only:
            continue
        if not rows:
            print(header(checks), flush=True)
        started = time.perf_counter()
        label = release if args.torch == TORCH else f"{release} on {args.torch}"
        row = run_checks(python, release, work, checks, args.timeout, label)
        say(f"{release}: {sum(v == 'ok' for v in row['checks'].values())}/{len(checks)} ok in "
            f"{time.perf_counter() - started:.0f} s")
        print(row_line(row, checks), flush=True)  # row by row: a long run shows its results as it goes
        rows.append(row)
    failed = [f"{row['transformers']} {name}" for row in rows for name, v in row["checks"].items() if v != "ok"]
    if failed:
        say(f"failed: {', '.join(failed)}; tracebacks in {work}/<release>.log")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
