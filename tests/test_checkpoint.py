"""`rope-extend patch` end to end: fast path vs full path, hard links, SOURCE untouched, atomic output, errors,
Hub-id resolution from a local Hub cache (offline), model card (the push: tests/test_hub_push.py)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tiny
import torch
from transformers import AutoModelForCausalLM

from rope_extend import CheckpointError, patch_model
from rope_extend.checkpoint import check_safetensors
from rope_extend.cli import run

checksums = tiny.checksums


def cli(*args) -> int:
    return run([str(a) for a in args])


def stock_logits(folder, ids):
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(ids).logits


@pytest.fixture()
def source(tmp_path):
    folder = tmp_path / "src"
    model = tiny.make_model("llama")
    model.save_pretrained(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": tiny.ORIGINAL}))
    (folder / "generation_config.json").write_text(json.dumps({"max_length": tiny.ORIGINAL, "bos_token_id": 1}))
    return folder


def test_fast_and_full_paths_load_to_identical_logits(source, tmp_path, capsys):
    before = checksums(source)
    ids = tiny.input_ids()
    assert cli("patch", source, "--method", "yarn", "--factor", 4, "-o", tmp_path / "fast") == 0
    assert cli("patch", source, "--method", "yarn", "--factor", 4, "-o", tmp_path / "full", "--mode", "full") == 0
    fast, full = stock_logits(tmp_path / "fast", ids), stock_logits(tmp_path / "full", ids)
    model = tiny.make_model("llama")
    patch_model(model, method="yarn", factor=4)
    with torch.no_grad():
        in_memory = model(ids).logits
    torch.testing.assert_close(fast, full, atol=1e-5, rtol=0)
    torch.testing.assert_close(fast, in_memory, atol=1e-5, rtol=0)
    # the fast path hard-links weights; SOURCE is byte-identical afterwards
    assert os.path.samefile(source / "model.safetensors", tmp_path / "fast" / "model.safetensors")
    assert checksums(source) == before
    # length caps users forget are raised; provenance written
    assert json.loads((tmp_path / "fast" / "tokenizer_config.json").read_text())["model_max_length"] == 4 * tiny.ORIGINAL
    assert json.loads((tmp_path / "fast" / "generation_config.json").read_text())["max_length"] == 4 * tiny.ORIGINAL
    assert "method: yarn" in (tmp_path / "fast" / "rope_extend.yaml").read_text()
    out = capsys.readouterr().out
    # stdout says what to do next in three lines (wrapped at 80 columns between words, the serve command with shell
    # continuations); every engine's command is in the model card
    fast = tmp_path / "fast"
    words = " ".join(out.replace(" \\\n", " ").split())
    assert "verified with stock transformers" in words and f"output: {fast} " in words
    assert f"serve: vllm serve {fast} --max-model-len {4 * tiny.ORIGINAL}" in words and "--rope-scaling yarn" not in out
    assert f"report: {fast / 'README.md'}" in words and "--rope-scaling yarn" in (fast / "README.md").read_text()


def test_config_only_does_not_load_weights(source, tmp_path, monkeypatch):
    """The fast path never opens the weights with torch: poison the loaders and it still works."""
    import safetensors.torch
    import transformers

    def boom(*args, **kwargs):
        raise AssertionError("weights were loaded on the config-only path")

    monkeypatch.setattr(safetensors.torch, "load_file", boom)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    assert cli("patch", source, "--method", "ntk", "--factor", 2, "-o", tmp_path / "out") == 0


def test_config_from_yaml_with_overrides(source, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("method: yarn\nfactor: 8\n")
    out = tmp_path / "out"
    assert cli("patch", source, "--config", spec, "--factor", 2, "--set", "beta_fast=64", "-o", out) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["rope_scaling"]["factor"] == 2.0 and config["rope_scaling"]["beta_fast"] == 64.0
    assert config["rope_parameters"]["rope_type"] == "yarn" and config["rope_theta"] == 10000.0
    assert config["max_position_embeddings"] == 2 * tiny.ORIGINAL


def one_error_line(capsys) -> str:
    """The one error line on stderr (progress lines of work that had started, `rope-extend: [i/n] ...`, aside)."""
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("rope-extend: [")]
    assert len(err) == 1, err
    assert "Traceback" not in err[0] and err[0].startswith("rope-extend: error:")
    return err[0]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--method", "yarn", "--factor", "0.5"], ["factor", ">= 1"]),
        (["--method", "yarnn", "--factor", "2"], ["did you mean 'yarn'"]),
        (["--method", "yarn", "--target-length", "8"], ["shorter than the original length"]),
        (["--factor", "2"], ["--method"]),
        (["--method", "yarn", "--factor", "2", "--set", "nope=1"], ["unknown spec key 'nope'"]),
        (["--method", "yarn", "--factor", "2", "--mode", "fast"], ["--mode 'fast'"]),
    ],
)
def test_bad_specs_exit_2_and_leave_nothing(source, tmp_path, capsys, args, words):
    out = tmp_path / "out"
    assert cli("patch", source, *args, "-o", out) == 2
    line = one_error_line(capsys)
    for word in words:
        assert word in line
    assert not out.exists()
    assert not list(tmp_path.glob(".out.rope-extend-tmp-*"))


def test_output_location_errors(source, tmp_path, capsys):
    before = checksums(source)
    assert cli("patch", source, "--method", "yarn", "--factor", 2, "-o", source) == 2
    assert "is SOURCE itself" in one_error_line(capsys)
    assert cli("patch", source, "--method", "yarn", "--factor", 2, "-o", source / "sub") == 2
    assert "inside SOURCE" in one_error_line(capsys)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    for overwrite in ([], ["--overwrite"]):  # a folder of the user's files is never replaced (tests/test_outputs.py)
        assert cli("patch", source, "--method", "yarn", "--factor", 2, "-o", busy, *overwrite) == 2
        assert "keep.txt" in one_error_line(capsys)
        assert (busy / "keep.txt").read_text() == "mine" and not (busy / "config.json").exists()
    assert cli("patch", tmp_path / "missing", "--method", "yarn", "--factor", 2, "-o", tmp_path / "o") == 2
    assert "neither an existing folder, a Hub repo id" in one_error_line(capsys)
    assert checksums(source) == before


def test_verification_mismatch_is_an_error_and_leaves_nothing(source, tmp_path, capsys, monkeypatch):
    from rope_extend import verify
    from rope_extend.errors import VerificationError

    def mismatch(config, plan, rtol=1e-6):
        raise VerificationError("stock transformers builds attention factor 1.0, rope-extend computed 1.1386")

    monkeypatch.setattr(verify, "verify_stock_config", mismatch)
    out = tmp_path / "out"
    assert cli("patch", source, "--method", "yarn", "--factor", 4, "-o", out) == 2
    assert "attention factor" in one_error_line(capsys)
    assert not out.exists() and not list(tmp_path.glob(".out.rope-extend-tmp-*"))
    assert cli("patch", source, "--method", "yarn", "--factor", 4, "-o", out, "--no-verify") == 0


def test_truncated_and_missing_weights_are_refused(source, tmp_path, capsys):
    data = (source / "model.safetensors").read_bytes()
    (source / "model.safetensors").write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match="truncated"):
        check_safetensors(source / "model.safetensors")
    assert cli("patch", source, "--method", "yarn", "--factor", 2, "-o", tmp_path / "out") == 2
    assert "truncated" in one_error_line(capsys)
    (source / "model.safetensors").unlink()
    assert cli("patch", source, "--method", "yarn", "--factor", 2, "-o", tmp_path / "out") == 2
    assert "no weights" in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_pickle_weights_need_allow_pickle(source, tmp_path, capsys):
    state = AutoModelForCausalLM.from_pretrained(source).state_dict()
    (source / "model.safetensors").unlink()
    torch.save(state, source / "pytorch_model.bin")
    capsys.readouterr()
    assert cli("patch", source, "--method", "yarn", "--factor", 2, "-o", tmp_path / "out") == 2
    assert "--allow-pickle" in one_error_line(capsys)
    assert cli("patch", source, "--method", "yarn", "--factor", 2, "-o", tmp_path / "out", "--allow-pickle") == 0
    assert (tmp_path / "out" / "pytorch_model.bin").exists()


def test_corrupt_config_is_one_line(source, tmp_path, capsys):
    (source / "config.json").write_text("{not json")
    assert cli("patch", source, "--method", "yarn", "--factor", 2, "-o", tmp_path / "out") == 2
    assert "not valid JSON" in one_error_line(capsys)


def test_model_card_contents(source, tmp_path):
    out = tmp_path / "out"
    assert cli("patch", source, "--method", "yarn", "--factor", 4, "-o", out) == 0
    card = (out / "README.md").read_text()
    for text in ("rope-extend", "yarn", "arxiv.org/abs/2309.00071", "| `max_position_embeddings` | `32` | `128` |",
                 "beta_fast", "vllm serve", "transformers", "factor: 4.0"):
        assert text in card, text


def make_hub_cache(cache: Path, repo: str, folder: Path, revision: str = "a" * 40) -> None:
    """The layout huggingface_hub writes: blobs/, snapshots/<commit>/ with links into blobs, refs/main."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "blobs").mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(revision)
    snapshot = root / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for file in folder.iterdir():
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        blob = root / "blobs" / digest
        blob.write_bytes(file.read_bytes())
        os.symlink(os.path.relpath(blob, snapshot), snapshot / file.name)


def run_cli_process(args, env_extra, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "rope_extend", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def test_hub_id_resolves_from_local_cache_offline(source, tmp_path):
    cache = tmp_path / "hub"
    make_hub_cache(cache, "acme/tiny-llama", source)
    blobs = checksums(cache)
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HOME": str(tmp_path / "hf")}
    done = run_cli_process(["patch", "acme/tiny-llama", "--method", "yarn", "--factor", 2, "-o", tmp_path / "out"],
                           env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "out" / "config.json").read_text())["rope_scaling"]["rope_type"] == "yarn"
    assert checksums(cache) == blobs  # the cache's blobs were linked, never written
    shown = run_cli_process(["show", "acme/tiny-llama"], env, tmp_path)
    assert shown.returncode == 0 and "existing scheme: none" in shown.stdout
    missing = run_cli_process(["patch", "acme/not-cached", "--method", "yarn", "--factor", 2, "-o", tmp_path / "o2"],
                              env, tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0 and "not in the local Hub cache" in missing.stderr
    assert not (tmp_path / "o2").exists()


@pytest.mark.slow
def test_real_smollm2_fast_and_full_paths_agree(smollm2_path, tmp_path):
    """SmolLM2-135M: both paths give configs that load to the same logits; SOURCE untouched; links used."""
    before = checksums(smollm2_path)
    ids = torch.randint(100, 40000, (1, 96), generator=torch.Generator().manual_seed(0))
    assert cli("patch", smollm2_path, "--method", "yarn", "--factor", 2, "-o", tmp_path / "fast") == 0
    assert cli("patch", smollm2_path, "--method", "yarn", "--factor", 2, "-o", tmp_path / "full", "--mode", "full") == 0
    torch.testing.assert_close(stock_logits(tmp_path / "fast", ids), stock_logits(tmp_path / "full", ids),
                               atol=1e-4, rtol=0)
    assert os.path.samefile(smollm2_path / "model.safetensors", tmp_path / "fast" / "model.safetensors")
    assert checksums(smollm2_path) == before
