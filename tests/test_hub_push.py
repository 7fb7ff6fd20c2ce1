"""Publishing to the Hub against a real HTTP server (tests/hubserver.py) that speaks the Hub API huggingface_hub's
`create_repo` and `upload_folder` use: the files and bytes received, the card's metadata as the Hub parses it,
private/public, the commit message, the token never printed, `--dry-run` listing exactly what the push uploads,
and the failures (Hub unreachable, no token) that keep OUT and print the one command that pushes it later.

One test runs the CLI in a subprocess with HF_ENDPOINT pointing at the server (huggingface_hub reads it at
import); the others run in-process with `huggingface_hub.constants.ENDPOINT` set to it, which is what HF_ENDPOINT
sets (seconds instead of a Python start each).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tiny
from hubserver import HubServer

from rope_extend.cli import run
from rope_extend.hub import upload_files

SECRET = "hf_SECRETtoken1234567890abcdef"
YARN = ["--method", "yarn", "--factor", "2"]


def cli(*args) -> int:
    return run([str(a) for a in args])


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A small checkpoint folder as users have them: weights, config, tokenizer and generation configs."""
    folder = tmp_path_factory.mktemp("push") / "src"
    tiny.make_model("llama").save_pretrained(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": tiny.ORIGINAL}))
    (folder / "generation_config.json").write_text(json.dumps({"max_length": tiny.ORIGINAL, "bos_token_id": 1}))
    return folder


@pytest.fixture()
def hub(monkeypatch, tmp_path):
    """The local Hub, with huggingface_hub pointed at it, HF_TOKEN set and no stored token."""
    from huggingface_hub import constants

    with HubServer() as server:
        monkeypatch.setattr(constants, "ENDPOINT", server.endpoint)
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setenv("HF_TOKEN", SECRET)
        yield server


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in upload_files(folder)}


def dry_run_files(stdout: str) -> list[str]:
    return [line.split("+ ", 1)[1] for line in stdout.splitlines() if line.startswith("  + ")]


def one_error(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.startswith("rope-extend: error:")]
    assert len(lines) == 1, err
    return lines[0]


def card_data(text: str, tmp_path: Path):
    from huggingface_hub import ModelCard

    path = tmp_path / "card" / "README.md"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return ModelCard.load(path).data


def test_patch_push_to_hub_over_http(source, tmp_path):
    """`patch --push-to-hub --private` in a fresh process with HF_ENDPOINT set: the repo is created private and
    receives exactly OUT's files, byte for byte, in one commit whose message is the spec; the token is sent in the
    Authorization header and printed nowhere."""
    out = tmp_path / "out"
    with HubServer() as hub:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(HF_ENDPOINT=hub.endpoint, HF_TOKEN=SECRET, HF_HOME=str(tmp_path / "hf-home"))
        done = subprocess.run([sys.executable, "-m", "rope_extend", "patch", str(source), *YARN, "-o", str(out),
                               "--push-to-hub", "me/tiny-yarn", "--private"],
                              capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout + done.stderr
    repo = hub.repos["me/tiny-yarn"]
    assert repo.private is True
    assert repo.files == folder_bytes(out)
    assert sorted(repo.files) == ["README.md", "config.json", "generation_config.json", "model.safetensors",
                                  "rope_extend.yaml", "tokenizer_config.json"]
    spec = " ".join((out / "rope_extend.yaml").read_text().split())
    assert repo.commits == [f"rope-extend: {spec}"] and spec.startswith("method: yarn factor: 2.0")
    writes = [r for r in hub.requests if r.method == "POST"]
    assert writes and all(r.headers.get("authorization") == f"Bearer {SECRET}" for r in writes)
    data = card_data(repo.files["README.md"].decode(), tmp_path)
    assert data.library_name == "transformers"
    assert "long-context" in data.tags
    assert "vllm serve me/tiny-yarn" in repo.files["README.md"].decode()  # the card names the path users will have
    assert f"pushed: {hub.endpoint}/me/tiny-yarn" in done.stdout
    assert "serve:  vllm serve me/tiny-yarn --max-model-len 64" in done.stdout


def test_dry_run_lists_exactly_what_the_push_uploads(source, tmp_path, hub, capsys):
    out = tmp_path / "out"
    (source / ".cache").mkdir(exist_ok=True)  # hidden files are never carried or uploaded
    assert cli("patch", source, *YARN, "-o", out, "--push-to-hub", "me/a", "--dry-run") == 0
    printed = capsys.readouterr()
    listed = dry_run_files(printed.out)
    assert hub.requests == []  # a dry run sends nothing
    assert "would push 6 files to me/a (public" in printed.out
    assert cli("push", out, "me/a") == 0
    assert sorted(hub.repos["me/a"].files) == listed == upload_files(out)
    assert hub.repos["me/a"].private is False
    assert SECRET not in "".join(capsys.readouterr())


def test_a_later_push_renames_the_serving_commands_and_adds_a_commit(source, tmp_path, hub, capsys):
    out = tmp_path / "smollm2-yarn2"
    assert cli("patch", source, *YARN, "-o", out) == 0
    assert "vllm serve smollm2-yarn2 " in (out / "README.md").read_text()
    capsys.readouterr()
    assert cli("push", out, "me/b", "--dry-run") == 0
    assert "README.md: its serving commands would be rewritten to name me/b" in capsys.readouterr().out
    assert "vllm serve smollm2-yarn2 " in (out / "README.md").read_text()  # the dry run wrote nothing
    assert cli("push", out, "me/b") == 0
    card = hub.repos["me/b"].files["README.md"].decode()
    assert "vllm serve me/b " in card and "smollm2-yarn2 " not in card
    assert (out / "README.md").read_text() == card  # OUT describes what was published
    assert cli("push", out, "me/b") == 0  # the repo exists (409): the push adds a commit
    assert len(hub.repos["me/b"].commits) == 2


def test_push_with_the_hub_down_keeps_out_and_prints_the_push_later_command(source, tmp_path, hub, monkeypatch,
                                                                            capsys):
    from huggingface_hub import constants

    with HubServer() as down:
        pass  # started and stopped: its port refuses connections
    monkeypatch.setattr(constants, "ENDPOINT", down.endpoint)
    out = tmp_path / "my model"  # a path that needs quoting in the printed command
    assert cli("patch", source, *YARN, "-o", out, "--push-to-hub", "me/c", "--private") == 2
    error = one_error(capsys.readouterr().err)
    assert "unreachable" in error and "is complete" in error
    later = re.search(r"push it later with `([^`]+)`", error)[1]
    assert later == f"rope-extend push '{out.resolve()}' me/c --private"
    assert set(upload_files(out)) >= {"README.md", "config.json", "model.safetensors", "rope_extend.yaml"}
    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)  # the Hub is back: the printed command pushes OUT
    import shlex

    assert run(shlex.split(later)[1:]) == 0
    assert hub.repos["me/c"].private is True and hub.repos["me/c"].files == folder_bytes(out)


def test_a_missing_token_is_reported_before_any_network_call(source, tmp_path, hub, monkeypatch, capsys):
    monkeypatch.delenv("HF_TOKEN")
    out = tmp_path / "out"
    assert cli("patch", source, *YARN, "-o", out, "--push-to-hub", "me/d") == 2
    error = one_error(capsys.readouterr().err)
    assert "no Hugging Face token" in error and "hf auth login" in error
    assert f"push it later with `rope-extend push {out.resolve()} me/d`" in error
    assert (out / "config.json").is_file()
    assert cli("push", out, "me/d") == 2 and "no Hugging Face token" in one_error(capsys.readouterr().err)
    assert hub.requests == []


def test_push_refuses_a_folder_that_is_not_a_checkpoint(tmp_path, hub, capsys):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.md").write_text("mine")
    assert cli("push", tmp_path / "notes", "me/e") == 2
    assert "not a checkpoint folder" in one_error(capsys.readouterr().err)
    assert cli("push", tmp_path / "notes", "not a repo") == 2
    assert "repo id like" in one_error(capsys.readouterr().err)
    assert hub.requests == []
