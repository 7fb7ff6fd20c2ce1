"""The headline command on the checkpoints people extend, from Hub caches laid out as huggingface_hub writes them.

The fixtures (tests/hubcache.py) are the models' real config.json files, their model.safetensors.index.json and
sparse weight files of the real sizes (real safetensors headers, data as holes). Each model is patched by its Hub
id offline, verified, and every weight file in OUT must be a hard link of the cache's blob.

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

from rope_extend.cli import run

# Published file sizes (bytes) of the weight files on the Hub: the fixture must reproduce them, header included.
PUBLISHED_SIZES = {
    "meta-llama/Llama-3.1-8B": [4_976_698_672, 4_999_802_720, 4_915_916_176, 1_168_138_808],
    "mistralai/Mistral-7B-v0.3": [4_949_453_792, 4_999_819_336, 4_546_807_800],
    "google/gemma-3-1b-pt": [1_999_811_208],
}
SUITE = ["google/gemma-3-1b-pt", "Qwen/Qwen2.5-7B", "meta-llama/Llama-3.1-8B"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hub-cache")
    for repo in hubcache.MODELS:
        hubcache.build(folder, repo)
    return folder


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
    args = ["patch", repo, "--method", "yarn", "--factor", "4", "-o", str(out)]
    ships_llama3 = (json.loads(hubcache.config_path(repo).read_text()).get("rope_scaling") or {}).get("rope_type")
    if ships_llama3 == "llama3":
        assert run(args) == 2  # it carries scaling already: re-deriving needs replace_existing
        assert "replace_existing" in capsys.readouterr().err and not out.exists()
        args += ["--set", "replace_existing=true"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run(args) == 0, capsys.readouterr().err
    printed = " ".join(capsys.readouterr().out.split())  # wrapped at 80 columns between words
    assert "verified with stock transformers" in printed
    files = model.shards + (model.shards > 1)  # the weights and the index; config.json is written fresh
    assert f"config-only: {files} linked, 0 copied" in printed
    snapshot = next((cache / f"models--{repo.replace('/', '--')}" / "snapshots").iterdir())
    for shard in _weights(snapshot):
        blob = os.stat(os.path.realpath(shard))
        written = os.stat(out / shard.name)
        assert not (out / shard.name).is_symlink()
        assert (written.st_ino, written.st_dev) == (blob.st_ino, blob.st_dev) and blob.st_nlink == 2
    if model.shards > 1:
        assert os.stat(out / "model.safetensors.index.json").st_nlink == 2
    original = _original_length(repo)
    config = json.loads((out / "config.json").read_text())
    assert config["max_position_embeddings"] == 4 * original
    slots = config["rope_parameters"]
    full = slots.get("full_attention", slots)
    assert (full["rope_type"], full["factor"], full["original_max_position_embeddings"]) == ("yarn", 4.0, original)
    assert full["attention_factor"] == pytest.approx(0.1 * math.log(4) + 1, rel=1e-12)  # YaRN's sqrt(1/t)
    if "sliding_attention" in slots:  # Gemma 3's local layers keep their own base, unscaled
        assert slots["sliding_attention"] == {"rope_type": "default", "rope_theta": 10000.0}
