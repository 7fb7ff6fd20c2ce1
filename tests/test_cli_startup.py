"""The CLI answers at once: `rope-extend --help`, `--version`, `methods` and `validate` never import torch,
transformers or numpy (seconds of imports for a help text). How fast that is: `python bench/cli_startup.py`."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "numpy", "accelerate", "safetensors", "huggingface_hub", "matplotlib", "lm_eval",
         "scipy", "gguf")  # not pydantic: typer itself coerces every command's arguments with it
LIGHT_COMMANDS = (["--help"], ["--version"], ["methods"], ["validate", "configs/yarn-x8.yaml"], ["patch", "--help"],
                  ["eval", "--help"])

# Runs each command line in this one fresh interpreter, as the console script would, and reports what each one
# imported that the previous ones had not (so a command that imports torch is named even if a later one would too).
PROBE = """
import json, sys
from rope_extend.cli import main
heavy, report = {heavy!r}, {{}}
for argv in {commands!r}:
    before = set(sys.modules)
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    report[" ".join(argv)] = {{"code": code, "heavy": sorted(m for m in set(sys.modules) - before
                                                         if m.split(".")[0] in heavy and "." not in m)}}
import rope_extend
report["import rope_extend"] = {{"code": 0, "heavy": [m for m in heavy if m in sys.modules]}}
# the public names still work (loaded on first use), torch included
from rope_extend import RopeSpec, SpecError, __version__, patch_model
assert "torch" in sys.modules and callable(patch_model) and RopeSpec(method="yarn", factor=2).factor == 2
assert set(rope_extend.__all__) <= set(dir(rope_extend)), set(rope_extend.__all__) - set(dir(rope_extend))
try:
    rope_extend.no_such_name
except AttributeError as exc:
    report["missing name"] = str(exc)
print(json.dumps(report))
"""


def test_light_commands_import_no_heavy_module():
    """Each light command in a fresh interpreter: exit code 0 and none of torch, transformers, numpy... imported;
    `import rope_extend` neither, while `from rope_extend import patch_model` still works afterwards."""
    code = PROBE.format(heavy=HEAVY, commands=LIGHT_COMMANDS)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "COLUMNS": "100"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "has no attribute 'no_such_name'" in report.pop("missing name")
    assert set(report) == {" ".join(argv) for argv in LIGHT_COMMANDS} | {"import rope_extend"}
    assert all(entry["code"] == 0 for entry in report.values()), report
    offenders = {cmd: entry["heavy"] for cmd, entry in report.items()}
    assert not any(offenders.values()), (
        f"these commands import heavy modules at startup: {offenders}; import them inside the command that "
        "needs them (docs/development.md, 'Adding a command')"
    )


def test_methods_and_commands_have_no_heavy_import_at_module_top():
    """The rule that keeps the light commands light, with the file and line to fix: in rope_extend/methods/*.py and
    rope_extend/cli/*.py, heavy modules are imported inside functions (or under `if TYPE_CHECKING:`)."""
    offenders = []
    for folder in ("methods", "cli"):
        for path in sorted((ROOT / "rope_extend" / folder).glob("*.py")):
            for node in ast.parse(path.read_text()).body:  # module level only
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                offenders += [f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names
                              if n.split(".")[0] in HEAVY]
    assert not offenders, offenders



def test_the_engine_environment_builders_run_as_modules_without_runpy_warning():
    """Issue 66 item 8: `python -m rope_extend.engines.vllm_env` warned "found in sys.modules after import of package
    'rope_extend.engines', but prior to execution" (runpy) because the package imported it through the run engines'
    registry. Importing the package (every room registered) leaves the builders and the run adapters unimported,
    which is what runpy needs; the builders' own runs (which build the environments) are `make vllm` and `make
    sglang`."""
    probe = ("import sys, warnings\n"
             "from rope_extend.engines import registry\n"
             "builders = [m for m in sys.modules if m.startswith('rope_extend.engines.') and "
             "m.rsplit('.', 1)[-1] in ('env', 'run', 'worker')]\n"
             "print(builders, sorted(engine.name for engine in registry.serving_engines() if engine.ported))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "[] ['llama.cpp', 'mlx', 'sglang', 'vllm']"


# Each command line in one fresh interpreter: its exit code, its stderr's last line and the heavy modules imported
# by the time it answered.
REFUSAL_PROBE = """
import contextlib, io, json, sys
from rope_extend.cli import main
report = []
for argv in {commands!r}:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code
    report.append({{"code": code, "error": err.getvalue().strip().splitlines()[-1:],
                   "heavy": sorted(m for m in {heavy!r} if m in sys.modules)}})
print(json.dumps(report))
"""


def test_a_bad_eval_argument_and_an_existing_patch_out_are_refused_before_torch_loads(tmp_path):
    """issue 66 item 7: a bad argument to `eval` took 19-31 s to refuse on a loaded 2-core machine, `patch` refusing
    an existing OUT 10 s: both imported torch and transformers first (`patch` through rope_extend.checkpoint's imports,
    before its check of OUT). Each is now one line, exit 2, with none of them imported; `patch`'s early words are
    check_output_path's own."""
    from rope_extend.checkpoint import check_output_path
    from rope_extend.errors import CheckpointError

    eval_out, user = tmp_path / "eval-out", tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("mine\n")
    checkpoint = tmp_path / "earlier-patch"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (checkpoint / "model.safetensors").write_bytes(b"")
    bad_suite = tmp_path / "suite.yaml"
    bad_suite.write_text("perplexity:\n  lenghts: [1024]\n")
    run = ["eval", "smollm2", "-o", str(eval_out)]
    cases = [
        (run + ["--suite", "no-such-suite"], "suite 'no-such-suite' not found"),
        (run + ["--suite", str(bad_suite)], "unknown key 'perplexity.lenghts'"),
        (run + ["--spec", "method=no-such-method,factor=2"], "unknown RoPE method 'no-such-method'"),
        (run + ["--spec", "no-such-spec.yaml"], "spec file 'no-such-spec.yaml' does not exist"),
        (run + ["--name", "unpatched"], "--name 'unpatched'"),
        (run + ["--dtype", "float8"], "--dtype 'float8' is not a dtype to load weights in; use one of auto, float64"),
        (run + ["--text", str(tmp_path / "no-such.txt")], "evaluation text not found"),
        (["eval", "smollm2", "-o", str(user)], "is not an eval output folder"),
        (["patch", "smollm2", "--method", "yarn", "--factor", "2", "-o", str(checkpoint)],
         "exists and is not empty; pass --overwrite"),
        (["patch", "smollm2", "--method", "yarn", "--factor", "2", "-o", str(user)], "is not a checkpoint"),
    ]
    code = REFUSAL_PROBE.format(commands=[argv for argv, _ in cases], heavy=("torch", "transformers"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "COLUMNS": "100"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for (argv, words), answer in zip(cases, report):
        assert answer["code"] == 2 and answer["error"], (argv, answer)
        assert answer["error"][0].startswith("rope-extend: error: ") and words in answer["error"][0], (argv, answer)
        assert answer["heavy"] == [], (argv, answer)
    assert not eval_out.exists() and (user / "notes.txt").is_file() and (checkpoint / "config.json").is_file()
    for out, answer in ((checkpoint, report[-2]), (user, report[-1])):
        with pytest.raises(CheckpointError) as refused:  # (OutputNotReplaceableError is a CheckpointError too)
            check_output_path(tmp_path / "source", out, overwrite=False)
        assert answer["error"][0] == f"rope-extend: error: {refused.value}"
