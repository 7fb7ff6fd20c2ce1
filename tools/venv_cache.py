"""A clone's virtualenv in seconds: its dependencies built once per machine, shared by every clone (issue 65).

    python3 tools/venv_cache.py .venv --cache ~/.cache/rope-extend/venvs --extras dev,eval,train \\
        --step "torch==2.13.0" --step "-c .ci/constraints-transformers5.txt @project transformers>=5,<6 torch==2.13.0"

The dependencies live in CACHE/<name>-<key>/, a virtualenv built by running each `--step` as `pip install STEP` in
order (`@project` stands for the requirements pyproject.toml declares for the project and `--extras`, so the cache
holds no clone's path), keyed by what decides its contents: the Python version, the steps, those requirements and
every constraints file a step names. It is built under a lock, and only marked complete when every step passed; a
half-built one is rebuilt.

The clone's VENV is then a virtualenv of its own (`python -m venv --without-pip`, its own prefix and bin/python),
whose site-packages reads the cache's through a .pth file (`site.addsitedir`, so the cache's own .pth files run too),
with this checkout installed editable into it (`pip --python VENV install --no-deps -e .`: rope-extend's metadata and
its console script in VENV) and the cache's console scripts copied into VENV/bin with VENV's interpreter, so that
`VENV/bin/pytest`, `accelerate` or `ruff` run with this checkout. A second clone builds nothing: 2-3 s here, where
building the environment took 100-200 s (docs/development.md, "Timings").
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
PIP_FLAGS = ["-q", "--disable-pip-version-check"]
PROJECT = "@project"
COMPLETE = ".complete"


def project_requirements(extras: list[str]) -> list[str]:
    """pyproject.toml's dependencies and those of `extras`, without duplicates, in their order."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        if extra not in project["optional-dependencies"]:
            raise SystemExit(f"venv_cache: no extra {extra!r} in pyproject.toml (it has: "
                             f"{', '.join(project['optional-dependencies'])})")
        requirements += project["optional-dependencies"][extra]
    return list(dict.fromkeys(requirements))


def resolved_steps(steps: list[str], extras: list[str]) -> list[list[str]]:
    """Each step's pip arguments, `@project` replaced by the project's requirements."""
    out = []
    for step in steps:
        args = []
        for arg in shlex.split(step):
            args += project_requirements(extras) if arg == PROJECT else [arg]
        out.append(args)
    return out


def cache_key(steps: list[list[str]]) -> str:
    """What decides the environment's contents: the interpreter's version, the pip steps and each constraints or
    requirements file they name (by content)."""
    h = hashlib.sha256(json.dumps([sys.version.split()[0], sysconfig.get_platform(), steps]).encode())
    for args in steps:
        for flag, value in zip(args, args[1:]):
            if flag in ("-c", "--constraint", "-r", "--requirement"):
                h.update((ROOT / value).read_bytes())
    return h.hexdigest()[:12]


def site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def build_cache(cache: Path, steps: list[list[str]], rebuild: bool = False) -> None:
    """The shared environment at `cache`, built once: under a lock (two clones at once build it once), marked
    complete only after every step; a folder without the mark is a failed or interrupted build, rebuilt."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.parent / f"{cache.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (cache / COMPLETE).is_file() and not rebuild:
            return
        started = time.monotonic()
        print(f"venv_cache: building the shared environment {cache} ({len(steps)} pip steps; once per machine)",
              file=sys.stderr, flush=True)
        shutil.rmtree(cache, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(cache)], check=True)
        for args in steps:
            subprocess.run([str(cache / "bin" / "python"), "-m", "pip", "install", *PIP_FLAGS, *args], check=True,
                           cwd=ROOT)
        (cache / COMPLETE).write_text(json.dumps({"steps": steps, "seconds": round(time.monotonic() - started)}) + "\n")


def link_clone(venv: Path, cache: Path) -> None:
    """`venv`: a virtualenv of this checkout over the shared `cache` (see the module's docstring)."""
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    own = site_packages(venv)
    (own / "_rope_extend_shared_venv.pth").write_text(
        f"import site; site.addsitedir({str(site_packages(cache))!r})\n")
    subprocess.run([str(cache / "bin" / "python"), "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                    *PIP_FLAGS, "--no-deps", "--no-build-isolation", "-e", str(ROOT)], check=True, cwd=ROOT)
    shebang = re.compile(rb"^#!" + re.escape(str(cache / "bin" / "python").encode()) + rb"[0-9.]*\n")
    for script in sorted((cache / "bin").iterdir()):
        target = venv / "bin" / script.name
        if target.exists() or target.is_symlink() or script.name.startswith(("python", "pip", "activate", "Activate")):
            continue
        head = script.read_bytes()
        if shebang.match(head):  # a console script: run it with the clone's interpreter
            target.write_bytes(shebang.sub(f"#!{venv.resolve() / 'bin' / 'python'}\n".encode(), head, count=1))
            target.chmod(0o755)
        else:  # a native program (ruff) or another interpreter's script
            target.symlink_to(script)
    (venv / "shared-venv").symlink_to(cache)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("venv", type=Path, help="the clone's virtualenv to (re)create")
    ap.add_argument("--cache", type=Path, required=True, help="the folder of shared environments")
    ap.add_argument("--extras", default="", help="the project's extras that @project includes (comma-separated)")
    ap.add_argument("--step", action="append", required=True, help="one `pip install` step's arguments")
    ap.add_argument("--rebuild", action="store_true", help="build the shared environment again (`make test-latest`: "
                    "unpinned steps resolve to the newest releases)")
    args = ap.parse_args(argv)
    steps = resolved_steps(args.step, [e for e in args.extras.split(",") if e])
    cache = args.cache.expanduser().resolve() / f"{args.venv.name.lstrip('.')}-{cache_key(steps)}"
    started = time.monotonic()
    build_cache(cache, steps, args.rebuild)
    link_clone(args.venv, cache)
    print(f"venv_cache: {args.venv} = this checkout over {cache} ({time.monotonic() - started:.0f} s)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
