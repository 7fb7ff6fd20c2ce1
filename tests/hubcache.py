"""Hugging Face Hub caches of real checkpoints, laid out exactly as huggingface_hub writes them, at no disk cost.

`build(cache, repo_id)` writes `models--org--name/{blobs/<hash>, snapshots/<commit>/<file> -> ../../blobs/<hash>,
refs/main}` for one of `MODELS`: the model's real config.json (tests/data/hub/<org--name>/config.json), its
model.safetensors.index.json and its weight files. The weight files are SPARSE: a valid safetensors header listing
the model's real tensor names, shapes, dtypes and offsets, then a data region that is a hole (`truncate`), so a
141 GB Llama-3.1-70B costs a few hundred kilobytes of disk and rope-extend's header checks see exactly the real
layout.

The index is what transformers' `save_pretrained` writes for that model (the upload's `max_shard_size`, tensors in
state-dict order, a new shard when the next tensor would overflow it); `MODELS` records the published index's
shard count and `metadata.total_size`, which the builder asserts, so a wrong tensor list or split cannot pass
silently. (Llama-2-7b-hf's published shards also hold each layer's float32 `rotary_emb.inv_freq` buffer: 32 x 64
x 4 = 8192 bytes of its total_size.)

Blob names are what huggingface_hub uses: the git blob sha1 of small files and a sha256 for LFS files (weights);
for the sparse weights it is the sha256 of the header and the file length (their real content hash would need
the real bytes).

Run as a script to build a cache for manual checks or the bench: `python tests/hubcache.py CACHE [REPO_ID...]`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "hub"
DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class Model:
    family: str  # the tensor list: llama (also mistral), qwen2, gemma3_text
    dtype: str  # safetensors dtype of the weights
    max_shard_size: int  # bytes, as the upload's save_pretrained(max_shard_size=...) split it
    shards: int  # the published index's shard count (1: a single model.safetensors, no index)
    total_size: int  # the published index's metadata.total_size (tensor bytes)
    inv_freq: bool = False  # the shards carry each layer's rotary_emb.inv_freq buffer (transformers < 4.32)


MODELS = {
    "meta-llama/Llama-2-7b-hf": Model("llama", "F16", 10 * 10**9, 2, 13_476_839_424, inv_freq=True),
    "meta-llama/Llama-3.1-8B": Model("llama", "BF16", 5 * 10**9, 4, 16_060_522_496),
    "mistralai/Mistral-7B-v0.3": Model("llama", "BF16", 5 * 10**9, 3, 14_496_047_104),
    "Qwen/Qwen2.5-7B": Model("qwen2", "BF16", 4 * 10**9, 4, 15_231_233_024),
    "Qwen/Qwen2.5-7B-Instruct": Model("qwen2", "BF16", 4 * 10**9, 4, 15_231_233_024),
    "google/gemma-3-1b-pt": Model("gemma3_text", "BF16", 0, 1, 1_999_771_904),
    "meta-llama/Llama-3.1-70B": Model("llama", "BF16", 5 * 10**9, 30, 141_107_412_992),
}


# config.json of models the suite reads only the config of (`build_config`; no weight layout modelled here, and not
# among tests/test_verify.py's small-model configs: gemma-3-4b-it's is multimodal, with a vision tower).
CONFIG_ONLY = DATA.parent / "hub-config-only"


def config_path(repo_id: str) -> Path:
    name = repo_id.replace("/", "--")
    path = DATA / name / "config.json"
    return path if path.exists() or repo_id in MODELS else CONFIG_ONLY / name / "config.json"


def tensors(repo_id: str) -> list[tuple[str, str, list[int]]]:
    """(name, dtype, shape) of every tensor of the checkpoint, in state-dict order."""
    model = MODELS[repo_id]
    c = json.loads(config_path(repo_id).read_text())
    hidden, inter, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    heads, kv = c["num_attention_heads"], c.get("num_key_value_heads") or c["num_attention_heads"]
    head_dim = c.get("head_dim") or hidden // heads
    dt = model.dtype
    out = [("model.embed_tokens.weight", dt, [vocab, hidden])]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        attn = [
            (p + "self_attn.q_proj.weight", dt, [heads * head_dim, hidden]),
            (p + "self_attn.k_proj.weight", dt, [kv * head_dim, hidden]),
            (p + "self_attn.v_proj.weight", dt, [kv * head_dim, hidden]),
            (p + "self_attn.o_proj.weight", dt, [hidden, heads * head_dim]),
        ]
        if model.family == "qwen2":  # q/k/v biases, each after its weight
            attn.insert(1, (p + "self_attn.q_proj.bias", dt, [heads * head_dim]))
            attn.insert(3, (p + "self_attn.k_proj.bias", dt, [kv * head_dim]))
            attn.insert(5, (p + "self_attn.v_proj.bias", dt, [kv * head_dim]))
        if model.family == "gemma3_text":
            attn += [(p + "self_attn.q_norm.weight", dt, [head_dim]), (p + "self_attn.k_norm.weight", dt, [head_dim])]
        if model.inv_freq:
            attn.append((p + "self_attn.rotary_emb.inv_freq", "F32", [head_dim // 2]))
        mlp = [
            (p + "mlp.gate_proj.weight", dt, [inter, hidden]),
            (p + "mlp.up_proj.weight", dt, [inter, hidden]),
            (p + "mlp.down_proj.weight", dt, [hidden, inter]),
        ]
        norms = ["input_layernorm", "post_attention_layernorm"]
        if model.family == "gemma3_text":
            norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
        out += attn + mlp + [(p + f"{n}.weight", dt, [hidden]) for n in norms]
    out.append(("model.norm.weight", dt, [hidden]))
    if not c.get("tie_word_embeddings", model.family == "gemma3_text"):
        out.append(("lm_head.weight", dt, [vocab, hidden]))
    return out


def nbytes(dtype: str, shape: list[int]) -> int:
    size = DTYPE_BYTES[dtype]
    for dim in shape:
        size *= dim
    return size


def split(repo_id: str) -> list[list[tuple[str, str, list[int]]]]:
    """The tensors of each shard, as save_pretrained splits them (greedy, in state-dict order)."""
    model = MODELS[repo_id]
    shards: list[list] = [[]]
    used = 0
    for entry in tensors(repo_id):
        size = nbytes(entry[1], entry[2])
        if model.max_shard_size and shards[-1] and used + size > model.max_shard_size:
            shards.append([])
            used = 0
        shards[-1].append(entry)
        used += size
    return shards


def safetensors_header(entries: list[tuple[str, str, list[int]]]) -> tuple[bytes, int]:
    """A safetensors header (names sorted, data packed in that order, padded to 8 bytes) and the data length."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in sorted(entries):
        size = nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw, offset


# What Qwen2.5's model cards tell users to add to config.json for inputs beyond 32768 tokens (YaRN x4, 131072).
QWEN_YARN = {"rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}}


def files(repo_id: str, config_update: dict | None = None) -> dict[str, bytes | tuple[bytes, int]]:
    """name -> content (bytes), or (header, file length) for a sparse weights file. `config_update`: keys a user
    added to config.json (e.g. `QWEN_YARN`), written as huggingface_hub's cache then holds it (the edited blob)."""
    model = MODELS[repo_id]
    shards = split(repo_id)
    assert len(shards) == model.shards, (repo_id, len(shards), model.shards)
    total = sum(nbytes(d, s) for shard in shards for _, d, s in shard)
    assert total == model.total_size, (repo_id, total, model.total_size)
    config = config_path(repo_id).read_bytes()
    if config_update:
        config = (json.dumps({**json.loads(config), **config_update}, indent=2) + "\n").encode()
    out: dict[str, bytes | tuple[bytes, int]] = {"config.json": config}
    if model.shards == 1:
        head, length = safetensors_header(shards[0])
        out["model.safetensors"] = (head, len(head) + length)
        return out
    weight_map = {}
    for number, shard in enumerate(shards, 1):
        name = f"model-{number:05d}-of-{model.shards:05d}.safetensors"
        head, length = safetensors_header(shard)
        out[name] = (head, len(head) + length)
        weight_map.update({tensor: name for tensor, _, _ in shard})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    out[INDEX] = (json.dumps(index, indent=2) + "\n").encode()
    return out


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def commit_of(repo_id: str) -> str:
    return hashlib.sha1(f"rope-extend test snapshot of {repo_id}".encode()).hexdigest()


def build(cache: Path, repo_id: str, config_update: dict | None = None) -> Path:
    """Write `repo_id` into the Hub cache folder `cache` (HF_HUB_CACHE); returns its snapshot folder.
    `config_update`: see `files`."""
    root = Path(cache) / f"models--{repo_id.replace('/', '--')}"
    commit = commit_of(repo_id)
    snapshot = root / "snapshots" / commit
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, content in files(repo_id, config_update).items():
        if isinstance(content, bytes):
            blob = root / "blobs" / git_blob_sha1(content)
            if not blob.exists():
                blob.write_bytes(content)
        else:
            head, length = content
            blob = root / "blobs" / hashlib.sha256(head + length.to_bytes(8, "little")).hexdigest()
            if not blob.exists():
                with open(blob, "wb") as handle:
                    handle.write(head)
                    handle.truncate(length)  # the tensor data: a hole, no disk blocks
        link = snapshot / name
        if not link.is_symlink():
            os.symlink(os.path.relpath(blob, snapshot), link)  # ../../blobs/<hash>, as huggingface_hub links
    (root / "refs" / "main").write_text(commit)  # huggingface_hub writes the commit without a newline
    return snapshot


def build_config(cache: Path, repo_id: str, config_update: dict | None = None) -> Path:
    """Only config.json of `repo_id` (tests/data/hub/<org--name>/config.json, which need not be one of `MODELS`) in
    the Hub cache folder `cache`, as `hf_hub_download(repo_id, "config.json")` leaves it (what `rope-extend engines`
    and `inspect` fetch); returns its snapshot folder."""
    root = Path(cache) / f"models--{repo_id.replace('/', '--')}"
    commit = commit_of(repo_id)
    snapshot = root / "snapshots" / commit
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    config = config_path(repo_id).read_bytes()
    if config_update:
        config = (json.dumps({**json.loads(config), **config_update}, indent=2) + "\n").encode()
    blob = root / "blobs" / git_blob_sha1(config)
    blob.write_bytes(config)
    link = snapshot / "config.json"
    if not link.is_symlink():
        os.symlink(os.path.relpath(blob, snapshot), link)
    (root / "refs" / "main").write_text(commit)
    return snapshot


def build_all(cache: Path) -> Path:
    """Every one of `MODELS` into the Hub cache folder `cache`; returns it."""
    for repo_id in MODELS:
        build(cache, repo_id)
    return Path(cache)


def from_folder(cache: Path, repo_id: str, folder: Path, commit: str | None = None) -> Path:
    """Put the files of a local checkpoint folder into the Hub cache layout (real content, real hashes: sha256 of
    weights, git sha1 of the rest); returns the snapshot folder."""
    root = Path(cache) / f"models--{repo_id.replace('/', '--')}"
    commit = commit or commit_of(repo_id)
    snapshot = root / "snapshots" / commit
    for sub in (root / "blobs", root / "refs", snapshot):
        sub.mkdir(parents=True, exist_ok=True)
    for file in sorted(Path(folder).iterdir()):
        data = file.read_bytes()
        digest = hashlib.sha256(data).hexdigest() if file.suffix == ".safetensors" else git_blob_sha1(data)
        blob = root / "blobs" / digest
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / file.name)
    (root / "refs" / "main").write_text(commit)
    return snapshot


if __name__ == "__main__":
    target = Path(sys.argv[1])
    for repo in sys.argv[2:] or list(MODELS):
        print(build(target, repo))
