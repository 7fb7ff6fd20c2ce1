"""tools/venv_cache.py (the Makefile's `install` / `install4`): each clone's virtualenv is its own, over dependencies
built once per machine. A real shared environment is built here from the machine's package index with one small
step (setuptools, which the editable install of this checkout needs), then linked into two clones."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("venv_cache", ROOT / "tools" / "venv_cache.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def _python(venv: Path, code: str) -> str:
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True,
                          cwd="/").stdout.strip()


def test_the_key_follows_the_steps_the_requirements_and_the_constraints_files(tmp_path, monkeypatch):
    tool = _tool()
    steps = tool.resolved_steps(["torch==2.13.0", "-c .ci/constraints-transformers5.txt @project"], ["dev"])
    project = steps[1][2:]
    assert "torch>=2.6" in project and "pytest-xdist>=3.5" in project and "peft>=0.21" not in project  # train: no
    assert len(project) == len(set(project)) and steps[0] == ["torch==2.13.0"]
    key = tool.cache_key(steps)
    assert key == tool.cache_key(tool.resolved_steps(["torch==2.13.0", "-c .ci/constraints-transformers5.txt @project"],
                                                     ["dev"]))
    assert key != tool.cache_key(tool.resolved_steps(["torch==2.14.1", "-c .ci/constraints-transformers5.txt @project"],
                                                     ["dev"]))
    with pytest.raises(SystemExit, match="no extra 'gpu'.*dev"):
        tool.project_requirements(["gpu"])
    # a constraints file counts by its content
    (tmp_path / ".ci").mkdir()
    constraints = tmp_path / ".ci" / "c.txt"
    constraints.write_text("transformers==5.2.0\n")
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    pinned = tool.cache_key([["-c", ".ci/c.txt", "transformers"]])
    constraints.write_text("transformers==5.3.0\n")
    assert tool.cache_key([["-c", ".ci/c.txt", "transformers"]]) != pinned


def test_a_second_clone_builds_nothing_and_runs_its_own_checkout(tmp_path):
    cache = tmp_path / "cache"
    command = [sys.executable, str(ROOT / "tools" / "venv_cache.py"), "--cache", str(cache), "--step=setuptools>=77"]
    first = subprocess.run([*command, str(tmp_path / "a" / ".venv")], capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "building the shared environment" in first.stderr
    (shared,) = [p for p in cache.iterdir() if p.is_dir()]
    assert shared.name.startswith("venv-") and json.loads((shared / ".complete").read_text())["steps"] == [
        ["setuptools>=77"]]
    built = (shared / ".complete").stat().st_mtime_ns
    # what the shared environment holds is seen from each clone: a package and a console script placed in it
    site = next(shared.glob("lib/python*/site-packages"))
    (site / "shared_probe.py").write_text("VALUE = 41\n")
    (shared / "bin" / "probe").write_text(f"#!{shared}/bin/python\nimport shared_probe; print(shared_probe.VALUE + 1)\n")
    (shared / "bin" / "probe").chmod(0o755)

    second = subprocess.run([*command, str(tmp_path / "b" / ".venv")], capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "building" not in second.stderr and (shared / ".complete").stat().st_mtime_ns == built
    venv = tmp_path / "b" / ".venv"
    assert (venv / "bin" / "python").exists() and not (venv / "bin" / "pip").exists()  # its own interpreter
    got = json.loads(_python(venv, "import json, sys, importlib.metadata as m, rope_extend, shared_probe; print(json.dumps("
                                   "[sys.prefix, rope_extend.__file__, m.version('rope-extend'), shared_probe.VALUE]))"))
    assert got == [str(venv), str(ROOT / "rope_extend" / "__init__.py"), "0.1.0", 41]
    # the shared console script runs with the clone's interpreter; rope-extend's own is installed in the clone
    assert (venv / "bin" / "probe").read_text().startswith(f"#!{venv}/bin/python\n")
    assert subprocess.run([str(venv / "bin" / "probe")], capture_output=True, text=True).stdout == "42\n"
    assert (venv / "bin" / "rope-extend").read_text().startswith(f"#!{venv}/bin/python")


def test_an_interrupted_build_is_built_again_and_a_failed_one_never_marked(tmp_path, monkeypatch):
    """A shared environment without its completion mark (a build that was interrupted) is built again from nothing,
    not used; a step that fails leaves it unmarked."""
    tool = _tool()
    calls = []

    def fake_run(command, check, cwd=None):
        calls.append([str(c) for c in command])
        if "fail" in command:
            raise subprocess.CalledProcessError(1, command)
        if command[1:3] == ["-m", "venv"]:
            Path(command[3], "bin").mkdir(parents=True)

    monkeypatch.setattr(tool.subprocess, "run", fake_run)
    cache = tmp_path / "venv-abc"
    (cache / "lib").mkdir(parents=True)
    (cache / "lib" / "left-over").write_text("half-built")
    tool.build_cache(cache, [["setuptools>=77"]])
    assert not (cache / "lib" / "left-over").exists() and (cache / tool.COMPLETE).is_file()
    assert [c[1:3] for c in calls] == [["-m", "venv"], ["-m", "pip"]] and calls[1][-1] == "setuptools>=77"
    calls.clear()
    tool.build_cache(cache, [["setuptools>=77"]])  # complete: nothing runs
    assert calls == []
    broken = tmp_path / "venv-def"
    with pytest.raises(subprocess.CalledProcessError):
        tool.build_cache(broken, [["fail"]])
    assert not (broken / tool.COMPLETE).exists()
