"""demo_model: cache location, reuse, and atomic (all-or-nothing) materialisation."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rope_extend import demo_model


def test_default_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("ROPE_EXTEND_CACHE", str(tmp_path))
    assert demo_model.default_cache_dir() == tmp_path / "smollm2-135m-instruct"
    monkeypatch.delenv("ROPE_EXTEND_CACHE")
    assert demo_model.default_cache_dir() == Path.home() / ".cache" / "rope-extend" / "smollm2-135m-instruct"


def _fake_convert(gguf_file, out_dir):
    out = Path(out_dir)
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"x")
    (out / "tokenizer_config.json").write_text("{}")


def test_build_is_atomic_and_reused(monkeypatch, tmp_path):
    calls = []

    def fake_download(workdir, then=""):
        calls.append(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        f = workdir / demo_model.GGUF_NAME
        f.write_bytes(b"gguf")
        return f

    def failing_convert(gguf_file, out_dir):
        Path(out_dir).mkdir(parents=True)
        (Path(out_dir) / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(demo_model, "_download_gguf", fake_download)
    monkeypatch.setattr(demo_model, "convert_gguf", failing_convert)
    target = tmp_path / "cache" / "smol"
    with pytest.raises(RuntimeError, match="disk full"):
        demo_model.smollm2_path(target)
    assert not target.exists()
    assert list((tmp_path / "cache").iterdir()) == []  # temp dir cleaned up

    monkeypatch.setattr(demo_model, "convert_gguf", _fake_convert)
    assert demo_model.smollm2_path(target) == target
    assert (target / ".complete").is_file()
    n = len(calls)
    assert demo_model.smollm2_path(target) == target  # reused, nothing downloaded
    assert len(calls) == n


def test_the_conversion_bars_are_one_line_each_when_stderr_is_not_a_terminal(monkeypatch, tmp_path, capsys):
    """Issue 57: the first conversion flooded a log with tqdm's carriage-return redraws (transformers' GGUF
    conversion, weight loading, saving); off a terminal each bar ends as one line, and other output is kept."""
    from tqdm.auto import tqdm

    def converting(gguf_file, out_dir):
        for _ in tqdm(range(272), desc="Converting and de-quantizing GGUF tensors...", mininterval=0):
            pass
        print("a warning line", file=sys.stderr)
        _fake_convert(gguf_file, out_dir)

    monkeypatch.setattr(demo_model, "_download_gguf",
                        lambda w, then="": (w.mkdir(parents=True, exist_ok=True), w / "f.gguf")[1])
    monkeypatch.setattr(demo_model, "convert_gguf", converting)
    assert not sys.stderr.isatty()  # capsys: what a log or a pipe is
    demo_model.smollm2_path(tmp_path / "smol")
    err = capsys.readouterr().err
    assert "\r" not in err, repr(err[:300])
    lines = err.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("Converting and de-quantizing GGUF tensors...: 100%"), lines
    assert "272/272" in lines[0] and lines[1] == "a warning line"


def test_incomplete_cache_is_rebuilt(monkeypatch, tmp_path):
    target = tmp_path / "smol"
    target.mkdir()
    (target / "config.json").write_text("{}")  # leftover without the .complete marker
    monkeypatch.setattr(demo_model, "_download_gguf",
                        lambda w, then="": (w.mkdir(parents=True, exist_ok=True), w / "f.gguf")[1])
    monkeypatch.setattr(demo_model, "convert_gguf", _fake_convert)
    assert demo_model.smollm2_path(target) == target
    assert (target / "model.safetensors").is_file()


@pytest.mark.slow
def test_real_checkpoint(smollm2_path):
    d = demo_model.describe(smollm2_path)
    assert d["architectures"] == ["LlamaForCausalLM"]
    assert (d["max_position_embeddings"], d["rope_theta"]) == (8192, 100000.0)
    assert not list(Path(smollm2_path).glob("*.gguf"))


def test_portable_tokenizer_config_rewrites_the_5x_only_class(tmp_path):
    cfg = tmp_path / "tokenizer_config.json"
    cfg.write_text('{"backend": "tokenizers", "tokenizer_class": "TokenizersBackend", "is_local": true, "bos_token": "<s>"}')
    assert demo_model.write_portable_tokenizer_config(tmp_path) is True
    import json

    data = json.loads(cfg.read_text())
    assert data == {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "add_bos_token": False,
                    "add_eos_token": False}
    assert demo_model.write_portable_tokenizer_config(tmp_path) is False  # idempotent


@pytest.mark.portability
def test_demo_tokenizer_loads_in_both_transformers_lines(smollm2_path):
    """The cached demo tokenizer loads in this line and (ROPE_EXTEND_OTHER_PYTHON) the other, same ids."""
    import json
    import os
    import subprocess
    import sys

    code = (
        "import json, sys; from transformers import AutoTokenizer; "
        "t = AutoTokenizer.from_pretrained(sys.argv[1]); "
        "print(json.dumps(t('The GNU General Public License, version 3.\\n   2 1', add_special_tokens=False)['input_ids']))"
    )
    pythons = [sys.executable] + ([os.environ["ROPE_EXTEND_OTHER_PYTHON"]] if os.environ.get("ROPE_EXTEND_OTHER_PYTHON") else [])
    ids = []
    for python in pythons:
        proc = subprocess.run([python, "-c", code, str(smollm2_path)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        ids.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert len(ids[0]) > 8 and all(x == ids[0] for x in ids)
    assert json.loads((smollm2_path / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_main_block_comes_after_every_definition():
    """`python -m rope_extend.demo_model` (building the demo model by hand) runs its `__main__` block when the module
    reaches it: a function defined below it (the GGUF's license, read while building) did not exist yet."""
    import ast

    tree = ast.parse(Path(demo_model.__file__).read_text())
    mains = [i for i, node in enumerate(tree.body) if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
    assert mains == [len(tree.body) - 1]
