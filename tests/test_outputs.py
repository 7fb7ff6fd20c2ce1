"""--overwrite, eval -o, tune -o and GGUF outputs never delete a user's files (rope_extend/outputs.py).

Every refusal is checked through the CLI (one line on stderr, exit 2, the user's files byte for byte intact) on
folders shaped like the ones users have: notes, configs, plots, a folder of earlier checkpoints, a checkpoint with a
file of theirs added. What may be replaced is replaced: a folder rope-extend wrote, a clean checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import tiny

from rope_extend.cli import run
from rope_extend.errors import CheckpointError, OutputNotReplaceableError
from rope_extend.outputs import check_replaceable, is_checkpoint

YARN = ["--method", "yarn", "--factor", "2", "--no-verify"]


@pytest.fixture(scope="module")
def source(tmp_path_factory, tiny_llama_folder) -> Path:
    folder = shutil.copytree(tiny_llama_folder, tmp_path_factory.mktemp("outputs") / "src")
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": tiny.ORIGINAL}))
    (folder / "special_tokens_map.json").write_text("{}")
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    return folder


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(capsys, args: list, *words: str) -> str:
    assert run([str(a) for a in args]) == 2, args
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for word in words:
        assert word in err[0], err[0]
    return err[0]


def notes(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for i in range(13):
        (folder / f"page{i:02d}.md").write_text(f"# page {i}\n")
    return folder


def test_folders_of_notes_configs_and_plots_are_refused(source, tmp_path, capsys):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "config.json").write_text(json.dumps({"model_type": "llama"}))  # a config, but no weights
    (configs / "train.yaml").write_text("lr: 1e-4\n")
    (configs / "tokenizer.json").write_text("{}")
    plots = tmp_path / "plots"
    plots.mkdir()
    for name in ("loss.png", "ppl.png"):
        (plots / name).write_bytes(b"\x89PNG\r\n\x1a\n")
    docs = notes(tmp_path / "docs")
    cases = [(docs, ["13 files", "page00.md", "and 9 more", "holds files a checkpoint does not"]),
             (configs, ["3 files", "train.yaml", "holds files a checkpoint does not"]),
             (plots, ["2 files", "loss.png, ppl.png", "holds files a checkpoint does not"])]
    for folder, words in cases:
        before = snapshot(folder)
        for overwrite in (["--overwrite"], []):  # without it, no hint to pass an --overwrite that would be refused
            line = refused(capsys, ["patch", source, *YARN, "-o", folder, *overwrite], *words,
                           "choose another -o, or remove it yourself")
            assert "pass --overwrite" not in line
        refused(capsys, ["eval", source, "--spec", "method=yarn,factor=2", "--suite", "smoke", "-o", folder],
                "not an eval output folder", "choose another -o")
        with pytest.raises(OutputNotReplaceableError, match="not a tune output folder"):
            check_replaceable(folder, "tune")
        assert snapshot(folder) == before
    # only weights missing: named as the reason
    (configs / "train.yaml").unlink()
    with pytest.raises(OutputNotReplaceableError, match="it has no weights"):
        check_replaceable(configs, "checkpoint")


def test_a_folder_of_checkpoints_and_a_checkpoint_with_a_user_file_are_refused(source, tmp_path, capsys):
    out = tmp_path / "out"
    for name in ("a", "b"):
        assert run(["patch", str(source), *YARN, "-o", str(out / name)]) == 0
    capsys.readouterr()
    before = snapshot(out)
    line = refused(capsys, ["patch", source, *YARN, "-o", out, "--overwrite"], "a/ (", "b/ (",
                   f"would delete {len(before)} files")
    assert snapshot(out) == before, line
    stray = out / "a"
    (stray / "notes.txt").write_text("mine")
    before = snapshot(stray)
    refused(capsys, ["patch", source, "--method", "ntk", "--factor", "2", "--no-verify", "-o", stray, "--overwrite"],
            "notes.txt", "holds files a checkpoint does not")
    assert snapshot(stray) == before
    sub = out / "b"
    (sub / "runs").mkdir()
    (sub / "runs" / "log.txt").write_text("mine")
    refused(capsys, ["patch", source, *YARN, "-o", sub, "--overwrite"], "runs/ (1 file)")
    weights = next(sub.glob("*.safetensors"))
    config = json.loads((sub / "config.json").read_text())
    shutil.rmtree(sub / "runs")
    assert is_checkpoint(sub)
    (sub / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "model_type"}))
    with pytest.raises(OutputNotReplaceableError, match="names no model_type"):
        check_replaceable(sub, "checkpoint")
    assert weights.exists()


def test_rope_extend_outputs_and_clean_checkpoints_are_replaced(source, tmp_path, capsys):
    previous = tmp_path / "previous"
    assert run(["patch", str(source), *YARN, "-o", str(previous)]) == 0
    capsys.readouterr()
    refused(capsys, ["patch", source, *YARN, "-o", previous], "pass --overwrite to replace it")
    assert run(["patch", str(source), "--method", "ntk", "--factor", "2", "--no-verify", "-o", str(previous),
                "--overwrite"]) == 0
    assert "method: ntk" in (previous / "rope_extend.yaml").read_text()
    clean = tmp_path / "downloaded"  # as `hf download --local-dir` leaves it: a checkpoint and huggingface_hub's .cache
    shutil.copytree(source, clean)
    (clean / "README.md").write_text("---\nlicense: apache-2.0\n---\n# model\n")
    (clean / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    (clean / ".cache" / "huggingface").mkdir(parents=True)
    (clean / ".cache" / "huggingface" / "model.safetensors.metadata").write_text("abc\n")
    assert run(["patch", str(source), *YARN, "-o", str(clean), "--overwrite"]) == 0
    assert (clean / "rope_extend.yaml").exists() and not (clean / ".cache").exists()


def test_eval_and_tune_write_into_their_own_outputs_only(tmp_path):
    check_replaceable(tmp_path / "new", "eval")
    (tmp_path / "empty").mkdir()
    check_replaceable(tmp_path / "empty", "tune")
    report = tmp_path / "report"
    report.mkdir()
    (report / "run.json").write_text(json.dumps({"suite": {"name": "quick"}, "variants": [], "model_path": "m"}))
    (report / "notes.md").write_text("mine")  # written into, not replaced: a note beside the report is kept
    check_replaceable(report, "eval")
    with pytest.raises(OutputNotReplaceableError, match="not a tune output folder"):
        check_replaceable(report, "tune")
    tuned = tmp_path / "tuned"
    tuned.mkdir()
    (tuned / "search.jsonl").write_text(json.dumps({"kind": "run", "model": "m"}) + "\n")
    check_replaceable(tuned, "tune")
    (tuned / "search.jsonl").write_text('{"kind": "eval"}\n')
    with pytest.raises(OutputNotReplaceableError, match="no search.jsonl written by rope-extend tune"):
        check_replaceable(tuned, "tune")
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(OutputNotReplaceableError, match="existing file"):
        check_replaceable(file, "eval")


def test_only_a_gguf_file_is_replaced(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(20))
    check_replaceable(gguf, "gguf")
    check_replaceable(tmp_path / "new.gguf", "gguf")
    notes_file = tmp_path / "notes.gguf"
    notes_file.write_text("my notes, misnamed")
    with pytest.raises(OutputNotReplaceableError, match="not a GGUF file") as err:
        check_replaceable(notes_file, "gguf")
    assert isinstance(err.value, CheckpointError | ValueError)
    with pytest.raises(OutputNotReplaceableError, match="is a folder"):
        check_replaceable(tmp_path, "gguf")
    assert notes_file.read_text() == "my notes, misnamed"
