"""Everything a bare GPU machine lacks to run `bench/gpu_check.py`, gathered here (on a CPU machine) in one folder.

    python tools/gpu_bundle.py                       # gpu-bundle/ for the GPU image: Python 3.12, torch 2.11, transformers 5.17
    python tools/gpu_bundle.py --model               # also the demo model's GGUF, in parts of at most 45 MB
    python tools/gpu_bundle.py --python 3.11 --torch 2.13.0 --out /tmp/b   # for this machine's Python (the CPU test)

    # then on the GPU machine, in a checkout of this repository with gpu-bundle/ copied into its root (no index,
    # no network needed), from that root:
    bash gpu-bundle/run.sh --out gpu-check.json      # arguments go to bench/gpu_check.py; PYTHON=, SITE= optional

The folder:
- `wheels/`: the project as a wheel, and the wheels of what it needs at run time (its dependencies, and pytest,
  which runs the `gpu` tests) that an environment holding only torch and transformers lacks, for the target Python
  on manylinux x86-64. Which ones is pip's answer, not a list kept here: pip resolves the project, pytest and
  `transformers==X` for the target, with torch standing in as a wheel that holds only its metadata (torch's CUDA
  wheels are GBs, and their CUDA pins need not resolve on an index); left out is what such an environment has for
  certain (`image_has`: torch and all it requires, transformers and its direct requirements), and the walk from the
  project does not go below those.
- `requirements.txt`: what run.sh installs (the project at its version, pytest; gguf with --model).
- `run.sh`: `pip install --no-index --find-links wheels --prefix $SITE -r requirements.txt`: pip keeps what the
  environment already has at a version the project accepts and installs the rest into $SITE (default
  /tmp/rope-extend-site; the image's own site-packages is not written), which goes on PYTHONPATH; then it joins
  the model's parts into rope-extend's cache if they are there, and runs `bench/gpu_check.py "$@"`.
- `model/` (with `--model`): `SmolLM2-135M-Instruct.Q4_1.gguf.part-NN`, each at most 45 MB, and `SHA256SUMS`, for
  `gpu_check.py --train` (the demo model is converted from it there; the `gguf` wheel comes along).
- `manifest.json`: the target, each wheel with its size and sha256, what was assumed present, the sizes.

Replaces only what it writes: the folder's `wheels/`, `model/`, `run.sh`, `requirements.txt` and `manifest.json`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# the GPU image (/work/.library/device/KINDS.md, read 2026-11): Python 3.12.3, torch 2.11.0+cu130, transformers 5.17.0
IMAGE = {"python": "3.12", "torch": "2.11.0", "transformers": "5.17.0"}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
CHECK_NEEDS = ("pytest",)  # bench/gpu_check.py runs the `gpu` tests with pytest
MODEL_NEEDS = ("gguf",)  # transformers reads the GGUF with it when the demo model is converted
PART_BYTES = 45_000_000  # large transfers to such machines are limited
MAX_WHEELS_MIB = 48  # the wheels travel in one transfer, capped at 64 MiB with the working tree
STUB_LABEL = "image"  # torch's metadata-only stand-in is torch==<version>+image
OWN = ("wheels", "model", "run.sh", "requirements.txt", "manifest.json")


class BundleError(RuntimeError):
    """A step of the bundle failed (pip's own message is in the text)."""


def pip(*args: str, quiet: bool = True) -> str:
    command = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check"] + (["--quiet"] if quiet else [])
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise BundleError(f"{' '.join(command[2:4])} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def target_options(python: str) -> list[str]:
    return ["--only-binary=:all:", "--python-version", python, "--implementation", "cp",
            *[arg for platform in PLATFORMS for arg in ("--platform", platform)]]


# What the project's wheel is built from (pyproject.toml's package, its package data and readme).
WHEEL_SOURCES = ("pyproject.toml", "README.md", "rope_extend")


def project_wheel(folder: Path, work: Path) -> Path:
    """The project built as a wheel (pure Python: one wheel for every target), from a copy of its sources in `work`:
    setuptools builds in the source tree (`build/`, `rope_extend.egg-info/`), and the checkout is left as it was."""
    source = work / "source"
    source.mkdir()
    for name in WHEEL_SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, source / name)
    pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(folder), str(source))
    return next(folder.glob("rope_extend-*.whl"))


def torch_stub(folder: Path, version: str) -> str:
    """A wheel holding only torch's metadata at `version`+image (its requirements as the torch installed here states
    them, which are the CPU build's: no CUDA pins); returns the requirement that pins it."""
    from importlib.metadata import requires

    local = f"{version}+{STUB_LABEL}"
    info = f"torch-{local}.dist-info"
    metadata = "".join(["Metadata-Version: 2.1\nName: torch\n", f"Version: {local}\n",
                        *[f"Requires-Dist: {r}\n" for r in requires("torch") or [] if "extra ==" not in r]])
    files = {f"{info}/METADATA": metadata, f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: rope-extend\n"
             "Root-Is-Purelib: true\nTag: py3-none-any\n", f"{info}/RECORD": ""}
    with zipfile.ZipFile(folder / f"torch-{local}-py3-none-any.whl", "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return f"torch=={local}"


def resolve(python: str, roots: list[str], stub_folder: Path, work: Path) -> dict[str, dict]:
    """pip's resolution of `roots` for the target Python: {canonical name: {name, version, requires_dist}}."""
    report = work / "report.json"
    pip("install", "--dry-run", "--ignore-installed", "--report", str(report), "--target", str(work / "unused"),
        "--find-links", str(stub_folder), *target_options(python), *roots)
    resolved = {}
    for item in json.loads(report.read_text())["install"]:
        meta = item["metadata"]
        resolved[canonical(meta["name"])] = {"name": meta["name"], "version": meta["version"],
                                             "requires_dist": meta.get("requires_dist") or []}
    return resolved


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def requirements_of(name: str, resolved: dict[str, dict], python: str) -> list[str]:
    """The names `name` requires (no extras; markers read for the target Python on Linux x86-64)."""
    from packaging.requirements import Requirement

    environment = {"python_version": python, "python_full_version": f"{python}.0", "extra": "",
                   "implementation_name": "cpython", "platform_python_implementation": "CPython",
                   "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
                   "os_name": "posix"}
    names = []
    for text in resolved[name]["requires_dist"]:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate(environment):
            names.append(canonical(requirement.name))
    return names


def closure(names, resolved: dict[str, dict], python: str, stop: set[str] = frozenset()) -> set[str]:
    """`names` and what they require, all the way down, among the resolved names; not below a name in `stop`."""
    seen, todo = set(), [canonical(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen or name not in resolved:
            continue
        seen.add(name)
        if name not in stop:
            todo.extend(requirements_of(name, resolved, python))
    return seen


def image_has(resolved: dict[str, dict], python: str) -> set[str]:
    """What an environment holding torch and transformers has for certain: torch and all it requires (at any
    version torch runs with), transformers and what it requires directly. Not what those require in turn: that
    depends on the versions the image holds (typer 0.29 requires pydantic, the GPU image's typer does not, and the
    image has no pydantic)."""
    return closure(["torch"], resolved, python) | {"transformers", *requirements_of("transformers", resolved, python)}


def split_model(gguf: Path, folder: Path, part_bytes: int = PART_BYTES) -> list[dict]:
    """`gguf` cut into `folder/<name>.part-NN` of at most `part_bytes`, and `folder/SHA256SUMS` of the whole file."""
    folder.mkdir(parents=True)
    parts, whole = [], hashlib.sha256()
    with open(gguf, "rb") as source:
        while chunk := source.read(part_bytes):
            whole.update(chunk)
            part = folder / f"{gguf.name}.part-{len(parts):02d}"
            part.write_bytes(chunk)
            parts.append({"file": part.name, "bytes": len(chunk)})
    (folder / "SHA256SUMS").write_text(f"{whole.hexdigest()}  {gguf.name}\n")
    return parts


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def build(out: Path, python: str, torch_version: str, transformers_version: str, model: bool) -> dict:
    for name in OWN:  # only what this tool writes
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    wheels = out / "wheels"
    wheels.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="gpu-bundle-") as tmp:
        work = Path(tmp)
        (work / "stub").mkdir()
        project = project_wheel(wheels, work)
        torch_pin = torch_stub(work / "stub", torch_version)
        needs = [*CHECK_NEEDS, *(MODEL_NEEDS if model else ())]
        resolved = resolve(python, [str(project), torch_pin, f"transformers=={transformers_version}", *needs],
                           work / "stub", work)
        present = image_has(resolved, python)
        wanted = closure(["rope-extend", *needs], resolved, python, stop=present) - present - {"rope-extend"}
        pins = sorted(f"{resolved[n]['name']}=={resolved[n]['version']}" for n in wanted)
        if pins:
            pip("download", "--no-deps", "--dest", str(wheels), *target_options(python), *pins)
    version = project.name.split("-")[1]
    requirements = [f"rope-extend=={version}", *needs]
    (out / "requirements.txt").write_text("\n".join(requirements) + "\n")
    shutil.copy(ROOT / "tools" / "gpu_bundle_run.sh", out / "run.sh")
    (out / "run.sh").chmod(0o755)
    parts = []
    if model:
        from rope_extend.demo_model import demo_gguf_path

        parts = split_model(demo_gguf_path(), out / "model")
    files = [{"file": p.name, "bytes": p.stat().st_size, "sha256": sha256(p)} for p in sorted(wheels.iterdir())]
    wheel_bytes = sum(f["bytes"] for f in files)
    if wheel_bytes > MAX_WHEELS_MIB * 2**20:
        largest = sorted(files, key=lambda f: -f["bytes"])[:3]
        raise BundleError(f"the wheels take {wheel_bytes / 2**20:.1f} MiB, over {MAX_WHEELS_MIB} MiB (largest: "
                          f"{', '.join(f['file'] for f in largest)}), and they travel in one transfer capped at 64 MiB: "
                          "find which requirement pulled the largest in, or raise MAX_WHEELS_MIB knowingly")
    manifest = {
        "target": {"python": python, "platforms": list(PLATFORMS), "torch": torch_version,
                   "transformers": transformers_version},
        "requirements": requirements,
        "assumed_present": sorted(resolved[n]["name"] for n in present),  # names: the image's versions may differ
        "wheels": files,
        "model_parts": parts,
        "wheels_mib": round(wheel_bytes / 2**20, 2),
        "model_mib": round(sum(p["bytes"] for p in parts) / 2**20, 2),
        "built_with": {"python": sys.version.split()[0], "pip": pip("--version", quiet=False).split()[1]},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main() -> int:
    usage = __doc__.split("\n\nThe folder:")[0].split("\n", 2)[2]  # the commands: here, then on the GPU machine
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="how to build and run it:\n" + usage,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "gpu-bundle"), help="the folder (default: gpu-bundle/)")
    parser.add_argument("--python", default=IMAGE["python"], help="the target Python, X.Y (default: the image's)")
    parser.add_argument("--torch", default=IMAGE["torch"], help="the torch version the target already has")
    parser.add_argument("--transformers", default=IMAGE["transformers"],
                        help="the transformers version the target already has")
    parser.add_argument("--model", action="store_true", help="also the demo model's GGUF, in parts of <= 45 MB")
    args = parser.parse_args()
    try:
        manifest = build(Path(args.out), args.python, args.torch, args.transformers, args.model)
    except BundleError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    names = ", ".join(f["file"].split("-")[0] for f in manifest["wheels"])
    print(f"{args.out}: {len(manifest['wheels'])} wheels, {manifest['wheels_mib']} MiB ({names}) for Python "
          f"{args.python} beside torch {args.torch} + transformers {args.transformers}"
          + (f"; model: {len(manifest['model_parts'])} parts, {manifest['model_mib']} MiB" if args.model else ""))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PIP_NO_INPUT", "1")
    raise SystemExit(main())
