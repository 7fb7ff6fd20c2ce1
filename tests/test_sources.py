"""Every command that takes SOURCE takes what `patch` takes: a local folder, a Hub id resolved through the Hub cache
(here offline, from a cache laid out as huggingface_hub writes it), or the alias `smollm2` (issue 51 §3).

The checkpoint is a tiny random llama with its tokenizer, put into the Hub cache layout with real hashes
(`hubcache.from_folder`), so every command runs whole in seconds."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import hubcache
import pytest

from rope_extend.cli import run

REPO = "acme/tiny-llama"


@pytest.fixture(scope="module")
def hub(tmp_path_factory, tiny_ckpt) -> Path:
    root = tmp_path_factory.mktemp("sources")
    hubcache.from_folder(root / "cache", REPO, tiny_ckpt)
    text = root / "toy.txt"
    text.write_text(" ".join(f"w{i % 60:02d}" for i in range(2400)) + "\n")
    return root


@pytest.fixture
def offline(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.chdir(tmp_path)
    return hub


def _run(capsys, *args) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = run([str(a) for a in args])
    captured = capsys.readouterr()
    assert code == 0, (args, captured.err[-2000:])
    return captured.out


def test_eval_tune_and_train_take_a_hub_id(offline, capsys, monkeypatch, tmp_path):
    """The commands that load weights, given the Hub id: eval (report and run.json name the id; on a machine
    reporting 1 MiB available it is refused in one line until --no-memory-check), tune (its specs written), train
    (a trained checkpoint whose config is the snapshot's, extended)."""
    from helpers import fake_memory

    suite = Path("suite.yaml")  # one perplexity length and one passkey prompt: the eval's two kinds of forward
    suite.write_text("name: hub\nsmoke: true\nshort_context: [128]\nperplexity:\n  lengths: [512]\n"
                     "passkey:\n  lengths: [256]\n")
    args = ["eval", REPO, "--spec", "method=yarn,factor=2", "--suite", suite, "--no-plots", "-o", "r"]
    with monkeypatch.context() as patched:
        fake_memory(patched, tmp_path, 1 << 20)
        assert run([str(a) for a in args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "acme/tiny-llama needs ~" in err[0] and not Path("r").exists(), err
        _run(capsys, *args, "--no-memory-check")
    meta = json.loads(Path("r/run.json").read_text())
    assert meta["model_path"] == REPO and meta["original_length"] == 256
    assert {json.loads(line)["variant"] for line in Path("r/results.jsonl").read_text().splitlines()} == {
        "unpatched", "yarn-x2"}

    _run(capsys, "tune", REPO, "--target-length", "512", "--budget", "2", "--knots", "4", "--no-plots", "-o", "t")
    assert Path("t/best.yaml").is_file() and json.loads(Path("t/summary.json").read_text())["winner"]

    _run(capsys, "train", REPO, "--method", "yarn", "--factor", "2", "--text", offline / "toy.txt", "--window", "32",
         "--steps", "1", "--batch-tokens", "64", "--no-verify", "-o", "tr")
    config = json.loads(Path("tr/config.json").read_text())
    assert config["max_position_embeddings"] == 512


def test_the_config_readers_take_a_hub_id(offline, capsys):
    """show, inspect (--recommend), engines (SOURCE + spec) and eval-tasks' --tokenizer, given the Hub id."""
    assert "max_position_embeddings: 256" in _run(capsys, "show", REPO)
    assert "recommendation for 512 tokens" in " ".join(
        _run(capsys, "inspect", REPO, "--recommend", "--target-length", "512").split())
    assert "yarn x2: 256 -> 512 tokens" in " ".join(_run(capsys, "engines", REPO, "--method", "yarn", "--factor", "2")
                                                     .split())
    printed = _run(capsys, "eval-tasks", "--tokenizer", REPO, "--task", "passkey", "--length", "128", "-o", "et")
    assert "passkey:" in printed and any(Path("et").iterdir())


def test_a_hub_id_missing_from_the_cache_is_one_line_for_every_command(offline, capsys):
    """Offline, an id the cache lacks: each command says so in one line (exit 2), naming the id and `hf download`,
    and writes nothing."""
    missing = "acme/not-cached"
    commands = [["eval", missing, "-o", "r"], ["tune", missing, "--target-length", "512", "-o", "t"],
                ["train", missing, "--method", "yarn", "--factor", "2", "--text", offline / "toy.txt", "-o", "tr"],
                ["show", missing], ["inspect", missing], ["engines", missing, "--method", "yarn", "--factor", "2"],
                ["eval-tasks", "--tokenizer", missing, "-o", "et"]]
    for args in commands:
        assert run([str(a) for a in args]) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{missing!r} is not in the local Hub cache" in err[0], (args, err)
        assert f"hf download {missing}" in err[0]
    assert not any(Path(".").iterdir())
