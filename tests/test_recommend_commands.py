"""Every command `inspect --recommend` prints runs as printed (issue 51 §3), offline, on Hub caches of the real
configs (tests/hubcache.py: real config.json files, sparse weights of the real sizes).

The commands are read from the printed text (continuation lines joined, as a shell reads them) and run: `patch`
writes a verified checkpoint whose window is the target; `eval` and `train` plan the spec on the model and get as
far as the memory check before loading, which refuses them on a machine faked to 1 GiB (a 7B model is not loaded
in a test). A target the model already serves prints `no scaling needed` and no command."""

from __future__ import annotations

import json
import shlex
import warnings
from pathlib import Path

import hubcache
import pytest
from helpers import GiB, fake_memory

from rope_extend.cli import run

CASES = [  # (repo, target): a model that ships llama3 (kept, replace_existing), plain RoPE, per-layer-type RoPE
    ("meta-llama/Llama-3.1-8B", 262144),
    ("mistralai/Mistral-7B-v0.3", 65536),
    ("google/gemma-3-1b-pt", 131072),
]


@pytest.fixture(scope="module")
def cache(hub_cache) -> Path:
    assert {repo for repo, _ in CASES} <= set(hubcache.MODELS)
    return hub_cache


@pytest.fixture
def offline(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(tmp_path)
    fake_memory(monkeypatch, tmp_path, GiB)


def printed_commands(text: str) -> dict[str, list[str]]:
    """{label: argv} of the `patch:` / `eval:` / `train:` blocks, each joined across its ` \\` continuations."""
    lines, commands = text.splitlines(), {}
    for i, line in enumerate(lines):
        label = line.strip().split(":", 1)[0]
        if line.startswith("  ") and label in ("patch", "eval", "train") and "rope-extend" in line:
            block = [line.split(":", 1)[1]]
            while block[-1].endswith(" \\"):
                block.append(lines[i + len(block)])
            commands[label] = shlex.split("\n".join(block).replace("\\\n", " "))
    return commands


@pytest.mark.parametrize("repo, target", CASES)
def test_every_printed_command_runs(offline, capsys, repo, target):
    assert run(["inspect", repo, "--recommend", "--target-length", str(target)]) == 0
    commands = printed_commands(capsys.readouterr().out)
    assert set(commands) == {"patch", "eval", "train"}
    assert all(argv[:3] == ["rope-extend", label, repo] for label, argv in commands.items())
    ships = (json.loads(hubcache.config_path(repo).read_text()).get("rope_scaling") or {}).get("rope_type")
    assert ("replace_existing=true" in " ".join(commands["patch"])) == bool(ships)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run(commands["patch"][1:]) == 0, capsys.readouterr().err
    out = Path(commands["patch"][-1])
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == target
    capsys.readouterr()

    Path("train.txt").write_text("Some text of yours to train on.\n")
    for label in ("eval", "train"):  # planned on the model, then stopped by the memory check before loading
        assert run(commands[label][1:]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{repo} needs ~" in err[0] and "1.0 GiB is available" in err[0], (label, err)
        assert not Path(commands[label][-1]).exists()


def test_a_target_the_model_serves_needs_no_scaling_and_no_command(offline, capsys):
    """Llama 3.1 serves 131072 tokens: at 4096 the verdict says `no scaling needed` (not "factor 0.5, method no
    scaling needed") and nothing to run is printed."""
    assert run(["inspect", "meta-llama/Llama-3.1-8B", "--recommend", "--target-length", "4096"]) == 0
    text = capsys.readouterr().out
    assert "recommendation for 4096 tokens: no scaling needed" in text and "factor 0.5" not in text
    assert "the model already serves 131072 tokens" in " ".join(text.split())
    assert printed_commands(text) == {}
    assert run(["inspect", "meta-llama/Llama-3.1-8B", "--recommend", "--target-length", "4096", "--json"]) == 0
    advice = json.loads(capsys.readouterr().out)["recommendation"]
    assert advice["method"] is None and advice["spec"] is None and advice["commands"] == {}
