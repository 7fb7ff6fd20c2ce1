"""The CLI answers at once: `rope-extend --help`, `--version`, `methods` and `validate` never import torch,
transformers or numpy (seconds of imports for a help text). How fast that is: `python bench/cli_startup.py`."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

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
    registry. Importing the package (and the registry, with both run engines registered) leaves the builders
    unimported, which is what runpy needs; the builders' own runs (which build the environments) are `make vllm` and
    `make sglang`."""
    probe = ("import sys, warnings\n"
             "from rope_extend.engines import runs\n"
             "builders = [m for m in ('rope_extend.engines.vllm_env', 'rope_extend.engines.sglang_env') "
             "if m in sys.modules]\n"
             "print(builders, sorted(engine.name for engine in runs.run_engines()))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "[] ['sglang', 'vllm']"
