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
    assert {"rope-scaling", "yarn", "long-context"} <= set(data.tags)
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


# --- the model card's metadata, as the Hub parses it ------------------------------------------------------------------
PAPER = Path(__file__).resolve().parents[1] / "eval" / "reports" / "smollm2-paper" / "results.jsonl"


def test_base_model_is_named_whenever_the_source_is_known(tmp_path):
    from rope_extend.hub import base_model_id

    snapshot = tmp_path / "hub" / "models--acme--tiny-llama" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    plain = tmp_path / "my-model"
    plain.mkdir()
    assert base_model_id("smollm2", plain) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert base_model_id("meta-llama/Llama-3.1-8B", snapshot) == "meta-llama/Llama-3.1-8B"
    assert base_model_id(str(snapshot), snapshot) == "acme/tiny-llama"  # a path inside a Hub cache
    assert base_model_id(str(plain), plain) is None


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval, from its closed form (the reference for the card's accuracy intervals)."""
    p = k / n
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z / (1 + z * z / n) * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    return centre - half, centre + half


def test_card_metadata_license_eval_results_and_banner(tmp_path):
    """A fine-tuned x8 card from a source whose card says its license, with the real records of the paper suite
    (YaRN x2's, up to 16k tokens) as its evaluation marked smoke: the Hub's metadata and the body."""
    from huggingface_hub import ModelCard

    from rope_extend.card import CardEval, build_model_card

    source = tmp_path / "src"
    source.mkdir()
    (source / "README.md").write_text("---\nlicense: apache-2.0\nlanguage: en\n---\n# A model\n")
    (source / "config.json").write_text(json.dumps({"model_type": "llama"}))
    records = [json.loads(line) for line in PAPER.read_text().splitlines() if line.strip()]
    evaluation = CardEval(records, suite="paper", smoke=True, variant="yarn-x2")
    spec = "method: yarn\nfactor: 8.0\ntarget_length: 65536\noriginal_max_position_embeddings: 8192\n"
    text = build_model_card("HuggingFaceTB/SmolLM2-135M-Instruct", spec, "yarn", [], "- vLLM: `vllm serve me/x`",
                            eval_summary=evaluation, training="400 steps.", source_dir=source)
    path = tmp_path / "README.md"
    path.write_text(text)
    card = ModelCard.load(path)
    data = card.data
    assert data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert data.base_model_relation == "finetune"
    assert data.license == "apache-2.0" and data.library_name == "transformers"
    assert data.tags == ["rope-extend", "rope-scaling", "yarn", "long-context"]
    mine = [r for r in records if r["variant"] == "yarn-x2"]
    ppl = {(r["metrics"]["text"], r["length"]): r["metrics"] for r in mine if r["kind"] == "perplexity"}
    passkey: dict[int, list[float]] = {}
    for r in mine:
        if r["kind"] == "passkey":
            passkey.setdefault(r["length"], []).append(r["metrics"]["score"])
    results = data.eval_results
    assert len(results) == len(ppl) + len(passkey)
    for result in results:
        length = result.metric_args["context_length"]
        if result.metric_type == "perplexity":
            m = ppl[(result.dataset_name, length)]
            assert result.metric_value == pytest.approx(m["ppl"], abs=1e-4)
            assert result.metric_args["interval_95"] == pytest.approx(m["ppl_ci"], abs=1e-4)
            assert result.metric_args["n"] == len(m["block_losses"])
        else:
            scores = passkey[length]
            k, n = int(sum(scores)), len(scores)
            assert result.metric_type == "accuracy" and result.metric_args["n"] == n
            assert result.metric_value == pytest.approx(k / n, abs=1e-4)
            assert result.metric_args["interval_95"] == pytest.approx(wilson(k, n), abs=1e-4)
        assert "smoke test" in result.metric_config and result.source_url is None  # no unchecked address
    assert card.text.count("> **Smoke test.** The `paper` suite") == 1
    assert "Nothing was measured at the target length (65536 tokens): the longest context evaluated is 16384" in text
    assert "pypi.org" not in text and "github.com" not in text
    assert "License: `apache-2.0`, read from the metadata of the base model's card (its README.md)." in text


def test_config_only_card_without_a_known_source(tmp_path):
    from huggingface_hub import ModelCard

    from rope_extend.card import build_model_card

    spec = "method: ntk\nfactor: 2.0\ntarget_length: 64\noriginal_max_position_embeddings: 32\n"
    text = build_model_card("my-model", spec, "ntk", [], "- vLLM: `vllm serve x`", source_dir=tmp_path)
    (tmp_path / "README.md").write_text(text)
    data = ModelCard.load(tmp_path / "README.md").data.to_dict()
    assert "base_model" not in data and "base_model_relation" not in data and "license" not in data
    assert "No license is given: neither the base model's card nor its config.json says one" in text
    assert "model-index" not in data and "eval_results" not in data
    assert "the local checkpoint `my-model`" in text
    assert "No evaluation was run" in text and "Nothing was measured at the target length (64 tokens)" in text
