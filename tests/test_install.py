"""The README's install block works as written on a fresh clone.

Its commands (but PyTorch's CPU wheel, whose index the tests cannot reach: that line is checked as written) are run
literally, with `<repository URL>` pointing at this repository (`file://`, so only what is
committed is seen, as on a user's machine) and pip in `--dry-run --no-deps` mode (nothing is installed or
downloaded): `git clone` must give a folder pip can build, each `pip install` must name this project and extras
that pyproject.toml defines, and the `git+` URL form must resolve to the same project.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- INSTALL"
PLACEHOLDER = "<repository URL>"


def install_block() -> list[str]:
    """The command lines of the README's install block (comments stripped)."""
    text = (ROOT / "README.md").read_text()
    assert MARKER in text, "the README's install block lost its marker"
    block = text.split(MARKER, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def _pip_dry_run(requirement: str, cwd: Path, tmp_path: Path) -> dict:
    report = tmp_path / f"report-{abs(hash(requirement))}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "--quiet", "--report", str(report), requirement],
        cwd=cwd, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"`pip install {requirement}` failed in {cwd}:\n{proc.stderr[-3000:]}"
    (item,) = json.loads(report.read_text())["install"]
    return item


def test_readme_install_block_works_on_a_fresh_clone(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.fail(f"{ROOT} is not a git checkout; the install test clones it")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = set(project["optional-dependencies"])
    # with a host: pip 23's requirement parser refuses `git+file:///path` (no netloc) but not a real forge URL
    url = "file://localhost" + quote(str(ROOT))
    lines = install_block()
    clones = [line for line in lines if line.startswith("git clone ")]
    pips = [line for line in lines if line.startswith("pip install ")]
    assert len(clones) == 1 and len(pips) >= 3 and len(clones) + len(pips) == len(lines), lines
    assert not any(line.split() == ["pip", "install", "rope-extend"] for line in pips), "not on PyPI"

    # git clone <repository URL> DIR && cd DIR
    clone, _, cd = clones[0].partition("&&")
    args = shlex.split(clone.replace(PLACEHOLDER, url))
    folder = args[-1]
    assert shlex.split(cd) == ["cd", folder], clones[0]
    subprocess.run([*args[:-1], "--quiet", str(tmp_path / folder)], check=True, capture_output=True, timeout=120)
    checkout = tmp_path / folder

    # without an NVIDIA GPU, PyTorch's CPU wheel first (issue 66 item 8: pip's default Linux torch pulled 6.4 GB of
    # CUDA); its index is not reachable from the tests, so the line is checked as written, before the project's
    torches = [line for line in pips if "--index-url" in line]
    assert [shlex.split(line) for line in torches] == [
        ["pip", "install", "torch", "--index-url", "https://download.pytorch.org/whl/cpu"]], torches
    assert lines.index(torches[0]) < min(lines.index(line) for line in pips if line not in torches)
    pips = [line for line in pips if line not in torches]

    seen_git_form = False
    for line in pips:
        (requirement,) = shlex.split(line.replace(PLACEHOLDER, url))[2:]  # one requirement per line
        seen_git_form |= "@ git+" in requirement
        item = _pip_dry_run(requirement, checkout, tmp_path)
        metadata = item["metadata"]
        assert metadata["name"] == project["name"] and metadata["version"] == project["version"], (line, metadata)
        requested = set(item.get("requested_extras") or [])
        assert requested <= extras and requested <= set(metadata.get("provides_extra", [])), (line, requested)
    assert seen_git_form, "the README names no git URL form"
