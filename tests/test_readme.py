"""The README's Python example runs as written (MODEL pointed at a tiny local checkpoint)."""

from __future__ import annotations

import re
from pathlib import Path

import tiny

README = Path(__file__).parent.parent / "README.md"


def test_readme_python_example_runs(tmp_path, monkeypatch):
    text = README.read_text()
    block = text.split("<!-- README-EXAMPLE")[1].split("```python\n", 1)[1].split("```", 1)[0]
    source = tmp_path / "model"
    tiny.make_model("llama").save_pretrained(source)
    code, count = re.subn(r'MODEL = ".*"', f"MODEL = {str(source)!r}", block)
    assert count == 1
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert (tmp_path / "out" / "config.json").exists()
    assert namespace["model"].config.rope_extend["method"] == "dynamic-yarn"


def test_readme_mentions_every_method_and_command():
    text = README.read_text()
    from rope_extend.methods import method_names

    for name in method_names():
        assert f"`{name}`" in text
    for command in ("make demo", "make test", "rope-extend patch", "rope-extend validate", "rope-extend methods",
                    "rope-extend show", "rope-extend inspect", "rope-extend eval"):
        assert command in text
    assert "make test" in (Path(__file__).parent.parent / ".ci" / "run").read_text()


def test_readme_method_table_is_generated_from_the_registry():
    """The table between the markers is exactly what the registry renders (regenerate with
    `python -m rope_extend.methods.docs README.md`)."""
    from rope_extend.methods.docs import END, START, method_table

    text = README.read_text()
    assert text.split(START, 1)[1].split(END, 1)[0].strip() == method_table().strip()
    # one row per registered method, each with its formula
    from rope_extend.methods import all_methods

    rows = method_table().splitlines()[2:]
    assert len(rows) == len(all_methods())
    for row, method in zip(rows, all_methods()):
        assert row.startswith(f"| `{method.name}`") and method.formula.replace("|", "\\|") in row
