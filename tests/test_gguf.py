"""GGUF in and out: metadata per method against ggml's RoPE kernel (ported here in float32 from the C source),
streamed tensors, atomic writes, memory, refusals, CLI. The real llama.cpp runs in test_gguf_llamacpp.py."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from helpers import BASE, HEAD_DIM, N_CTX, N_HEAD, write_tiny_gguf

from rope_extend.errors import AlreadyScaledError, CheckpointError, SpecError, UnsupportedModelError
from rope_extend.gguf.info import ROPE_FREQS, read_gguf_info
from rope_extend.gguf.write import patch_gguf
from rope_extend.methods import RopeContext, compute
from rope_extend.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
@pytest.fixture
def tiny(tmp_path) -> Path:
    return write_tiny_gguf(tmp_path / "tiny.gguf")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fields(path: Path) -> dict:
    reader = gguf.GGUFReader(path)
    return {name: f.contents() for name, f in reader.fields.items() if not name.startswith("GGUF.")}


# --- ggml's RoPE, ported from the C source (independent of rope_extend.engines.llama_cpp.port) -----------------------
def ggml_served_rope(path: Path) -> tuple[torch.Tensor, float]:
    """(theta per dim pair at position 1, magnitude) that llama.cpp 0.3.36 computes from the file, float32.

    llama-model.cpp load_hparams + llama-context.cpp (yarn_attn_factor) + ggml-cpu/ops.cpp
    (ggml_rope_cache_init / rope_yarn, theta *= theta_scale iteratively) + ggml.c ggml_rope_yarn_corr_dims.
    """
    f = fields(path)
    reader = gguf.GGUFReader(path)
    arch = f["general.architecture"]
    n_ctx_train = f[f"{arch}.context_length"]
    n_dims = f[f"{arch}.rope.dimension_count"]
    base = np.float32(f.get(f"{arch}.rope.freq_base", 10000.0))
    rope_type = f.get(f"{arch}.rope.scaling.type", "linear")
    scale = np.float32(f.get(f"{arch}.rope.scaling.factor", 0.0))
    freq_scale = np.float32(1.0) if scale == 0 or rope_type == "none" else np.float32(1.0) / scale
    n_ctx_orig = f.get(f"{arch}.rope.scaling.original_context_length", n_ctx_train)
    attn_key = np.float32(f.get(f"{arch}.rope.scaling.attn_factor", 1.0))
    ext_factor = np.float32(1.0 if rope_type == "yarn" else 0.0)
    ff = next((np.array(t.data, dtype=np.float32) for t in reader.tensors if t.name == ROPE_FREQS), None)
    attn_factor = np.float32(1.0)
    if ext_factor != 0:
        factor = np.float32(1.0) / freq_scale
        mscale = np.float32(0.1) * np.log(factor) + np.float32(1.0) if factor > 1 else np.float32(1.0)
        attn_factor = mscale * (np.float32(1.0) / (np.float32(1.0) + np.float32(0.1) * np.log(factor)))
    attn_factor = attn_factor * attn_key

    def corr_dim(n_rot):
        return n_dims * np.log(np.float32(n_ctx_orig) / (np.float32(n_rot) * 2 * np.float32(math.pi))) / (2 * np.log(base))

    low, high = max(0.0, math.floor(corr_dim(32.0))), min(n_dims - 1.0, math.ceil(corr_dim(1.0)))
    theta_scale = np.float32(base ** (np.float32(-2.0) / np.float32(n_dims)))
    theta, out, magnitude = np.float32(1.0), [], None  # position p = 1
    for i0 in range(0, n_dims, 2):
        extrap = theta / (ff[i0 // 2] if ff is not None else np.float32(1.0))
        interp = freq_scale * extrap
        value, m = interp, attn_factor
        if ext_factor != 0:
            y = (i0 / 2 - low) / max(0.001, high - low)
            ramp_mix = np.float32(1 - min(1.0, max(0.0, y))) * ext_factor
            value = interp * (1 - ramp_mix) + extrap * ramp_mix
            m = attn_factor * (np.float32(1.0) + np.float32(0.1) * np.log(np.float32(1.0) / freq_scale))
        out.append(value)
        magnitude = float(m)
        theta = theta * theta_scale
    return torch.tensor(np.array(out, dtype=np.float32)), magnitude


LONG = [1.0 + 0.05 * i for i in range(HEAD_DIM // 2)]
SPECS = {
    "linear": {"method": "linear", "factor": 4},
    "ntk": {"method": "ntk", "factor": 4},
    "yarn": {"method": "yarn", "factor": 4},
    "yarn-x2": {"method": "yarn", "factor": 2},
    "yarn-mscale": {"method": "yarn", "factor": 8, "mscale": 0.707, "mscale_all_dim": 1.0},
    "yarn-attention": {"method": "yarn", "factor": 4, "attention_factor": 1.3},
    "ntk-by-parts": {"method": "ntk-by-parts", "factor": 4},
    "llama3": {"method": "llama3", "factor": 8},
    "longrope": {"method": "longrope", "factor": 4, "short_factor": [1.0] * (HEAD_DIM // 2), "long_factor": LONG},
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_written_gguf_makes_ggml_serve_the_method(tiny, tmp_path, name):
    """ggml's kernel, fed the keys and rope_freqs we write, gives the method's frequencies and magnitude."""
    spec = load_spec(SPECS[name])
    out = tmp_path / "out.gguf"
    result = patch_gguf(tiny, spec, out)
    served, magnitude = ggml_served_rope(out)
    resolved = spec.resolve(N_CTX)
    params = resolved.method_params()
    seq_len = resolved.target_length if name == "longrope" else None
    expected, attention = compute(resolved.method, RopeContext(HEAD_DIM, BASE, N_CTX, resolved.factor, params, seq_len=seq_len))
    torch.testing.assert_close(served, expected, rtol=5e-6, atol=0)
    assert math.isclose(magnitude, attention, rel_tol=1e-6), (magnitude, attention)
    f = fields(out)
    assert f["llama.context_length"] == resolved.target_length
    assert (ROPE_FREQS in result.added_tensors) == (name in ("llama3", "longrope"))


def test_magnitude_key_values(tiny, tmp_path):
    """The attention factor lands in rope.scaling.attn_factor divided by llama.cpp's own 1 + 0.1 ln s."""
    patch_gguf(tiny, {"method": "ntk-by-parts", "factor": 2}, tmp_path / "a.gguf")
    assert fields(tmp_path / "a.gguf")["llama.rope.scaling.attn_factor"] == pytest.approx(1 / (1 + 0.1 * math.log(2)), rel=1e-7)
    patch_gguf(tiny, {"method": "yarn", "factor": 2}, tmp_path / "b.gguf")
    f = fields(tmp_path / "b.gguf")
    assert f["llama.rope.scaling.attn_factor"] == pytest.approx(1.0)
    assert (f["llama.rope.scaling.type"], f["llama.rope.scaling.factor"], f["llama.rope.scaling.original_context_length"]) == ("yarn", 2.0, N_CTX)


def test_tensors_and_other_metadata_are_copied_unchanged(tiny, tmp_path):
    before = sha256(tiny)
    out = tmp_path / "out.gguf"
    patch_gguf(tiny, {"method": "llama3", "factor": 4}, out)
    assert sha256(tiny) == before
    src, dst = gguf.GGUFReader(tiny), gguf.GGUFReader(out)
    src_t = {t.name: (t.tensor_type, list(t.shape), bytes(t.data.tobytes())) for t in src.tensors}
    dst_t = {t.name: (t.tensor_type, list(t.shape), bytes(t.data.tobytes())) for t in dst.tensors}
    assert dst_t.pop(ROPE_FREQS)[0] == gguf.GGMLQuantizationType.F32
    assert dst_t == src_t
    f_src, f_dst = fields(tiny), fields(out)
    assert {k: v for k, v in f_dst.items() if k != "llama.context_length"} == {
        k: v for k, v in f_src.items() if k != "llama.context_length"
    }
    assert os.stat(out).st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_demo_gguf_copy_is_exact(demo_gguf, tmp_path):
    """On the real Q4_1 file: every other key and every tensor read back (by gguf.GGUFReader) unchanged."""
    out = tmp_path / "demo-llama3.gguf"
    patch_gguf(demo_gguf, {"method": "llama3", "factor": 2}, out)
    src, dst = gguf.GGUFReader(demo_gguf), gguf.GGUFReader(out)
    changed = {"llama.context_length"}
    assert {k for k in dst.fields if k not in changed} == {k for k in src.fields if k not in changed}
    for key in src.fields:
        if key not in changed and not key.startswith("GGUF."):
            assert dst.fields[key].contents() == src.fields[key].contents(), key
    dst_tensors = {t.name: t for t in dst.tensors}
    assert set(dst_tensors) == {t.name for t in src.tensors} | {ROPE_FREQS}
    for t in src.tensors:
        assert dst_tensors[t.name].tensor_type == t.tensor_type and np.array_equal(dst_tensors[t.name].data, t.data)


def test_read_gguf_info_of_the_demo_gguf(demo_gguf, smollm2_path):
    """The facts read from the GGUF match the Hugging Face checkpoint converted from the same file."""
    info = read_gguf_info(demo_gguf)
    config = json.loads((smollm2_path / "config.json").read_text())
    assert info.architecture == config["model_type"] == "llama"
    assert info.context_length == config["max_position_embeddings"] == 8192
    assert info.freq_base == config["rope_theta"] == 1e5
    assert info.rope_dim == config["hidden_size"] // config["num_attention_heads"] == 64
    assert not info.is_scaled and info.rope_freqs is None


# --- refusals -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"method": "dynamic", "factor": 2}, ["dynamic", "grows", "--method ntk"]),
        ({"method": "dynamic-yarn", "factor": 2}, ["dynamic-yarn", "--method yarn"]),
        ({"method": "yarn", "factor": 2, "truncate": False}, ["truncate: false", "floors/ceils"]),
        ({"method": "ntk-by-parts", "factor": 2, "truncate": False}, ["truncate: false"]),
        ({"method": "yarn", "factor": 2, "beta_fast": 64}, ["beta_fast=64", "--yarn-beta-fast 64"]),
        ({"method": "yarn", "factor": 2, "rope_theta": 5e5}, ["rope_theta", "freq_base"]),
    ],
)
def test_refuses_what_llamacpp_cannot_express(tiny, tmp_path, spec, words):
    out = tmp_path / "out.gguf"
    with pytest.raises(SpecError) as err:
        patch_gguf(tiny, spec, out)
    for word in words:
        assert word in str(err.value)
    assert not out.exists() and not list(tmp_path.glob(".out.gguf*"))


def test_refuses_unverified_architecture(tmp_path):
    source = write_tiny_gguf(tmp_path / "q.gguf", arch="qwen2")
    with pytest.raises(UnsupportedModelError, match="'qwen2' is not supported.*convert_hf_to_gguf.py"):
        patch_gguf(source, {"method": "yarn", "factor": 2}, tmp_path / "out.gguf")


def test_refuses_already_scaled_and_unsafe_outputs(tiny, tmp_path):
    scaled = tmp_path / "scaled.gguf"
    patch_gguf(tiny, {"method": "yarn", "factor": 2}, scaled)
    with pytest.raises(AlreadyScaledError, match="already carries RoPE scaling.*'yarn'"):
        patch_gguf(scaled, {"method": "yarn", "factor": 2}, tmp_path / "twice.gguf")
    with_freqs = tmp_path / "freqs.gguf"
    patch_gguf(tiny, {"method": "llama3", "factor": 2}, with_freqs)
    with pytest.raises(AlreadyScaledError, match="rope_freqs=yes"):
        patch_gguf(with_freqs, {"method": "linear", "factor": 2}, tmp_path / "twice.gguf")
    with pytest.raises(CheckpointError, match="is SOURCE"):
        patch_gguf(tiny, {"method": "yarn", "factor": 2}, tiny, overwrite=True)
    with pytest.raises(CheckpointError, match="exists; pass overwrite"):
        patch_gguf(tiny, {"method": "yarn", "factor": 2}, scaled)
    patch_gguf(tiny, {"method": "linear", "factor": 2}, scaled, overwrite=True)
    assert fields(scaled)["llama.rope.scaling.type"] == "linear"
    notes = tmp_path / "notes.gguf"  # only a GGUF file is replaced (rope_extend/outputs.py)
    notes.write_text("my notes")
    with pytest.raises(CheckpointError, match="is not a GGUF file.*remove it yourself"):
        patch_gguf(tiny, {"method": "yarn", "factor": 2}, notes, overwrite=True)
    assert notes.read_text() == "my notes"
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00")
    with pytest.raises(CheckpointError, match="not a readable GGUF"):
        patch_gguf(broken, {"method": "yarn", "factor": 2}, tmp_path / "x.gguf")


@pytest.mark.parametrize("given", ["outdir", "outdir/", "newdir/", "out.bin", "my out"])
def test_a_gguf_out_that_is_not_a_gguf_file_name_is_refused_with_one_that_works(tiny, tmp_path, monkeypatch, capsys,
                                                                               given):
    """`-o` an existing folder, a path ending in / (which the path drops), or a name not ending in .gguf: one line,
    nothing written, and the command it names writes the GGUF."""
    import shlex

    from rope_extend.cli import run

    monkeypatch.chdir(tmp_path)
    (tmp_path / "outdir").mkdir()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert run(["patch", "tiny.gguf", "--method", "yarn", "--factor", "2", "-o", given]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a .gguf SOURCE writes one GGUF file" in err[0], err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    suggested = shlex.split(err[0].split("-o ", 1)[1].split(",")[0])[0]
    assert suggested.endswith(".gguf")
    assert run(["patch", "tiny.gguf", "--method", "yarn", "--factor", "2", "-o", suggested]) == 0
    assert fields(Path(suggested))["llama.rope.scaling.type"] == "yarn"


def test_unknown_tensor_type_names_the_tensor_and_the_fix(tmp_path):
    """A ggml type the installed gguf package does not know (a newer quantization) is named with its tensor."""
    path = write_tiny_gguf(tmp_path / "t.gguf")
    data = bytearray(path.read_bytes())
    header = gguf.GGUFReader(path)
    field = header.tensors[0]
    type_at = field.field.offset + sum(p.nbytes for p in field.field.parts[:-2])  # parts: ..., type, offset
    assert int.from_bytes(data[type_at : type_at + 4], "little") == int(field.tensor_type)
    data[type_at : type_at + 4] = (977).to_bytes(4, "little")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"tensor '{field.name}' has ggml type 977.*pip install -U gguf"):
        read_gguf_info(bad)


def test_a_vocab_only_gguf_is_diagnosed_as_such_and_a_truncated_one_as_truncated(tiny, tmp_path, capsys):
    """Issue 66 item 6: a vocab-only GGUF (what `convert_hf_to_gguf.py --vocab-only` writes: the header and the
    tokenizer's metadata, no tensor, no data section) was called truncated (`tensor data ends at 7818144 but the file
    has 7818140 bytes; re-download`). It is named for what it is, in one line, whatever reads it; a model GGUF cut
    short still says truncated."""
    from rope_extend.cli import run

    vocab = tmp_path / "ggml-vocab-tiny.gguf"
    writer = gguf.GGUFWriter(str(vocab), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(300)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert gguf.GGUFReader(vocab).tensors == []  # gguf's own reader: a well-formed file with no tensor
    with pytest.raises(CheckpointError) as info:
        read_gguf_info(vocab)
    message = str(info.value)
    assert message == (f"{str(vocab)!r} is a vocab-only GGUF: a tokenizer (tokenizer.* metadata) and no tensor, as "
                       "llama.cpp's ggml-vocab-*.gguf files and `convert_hf_to_gguf.py --vocab-only` write, so it "
                       "holds no model; give the GGUF of the model itself (with its weights)")
    assert "re-download" not in message and "tensor data ends" not in message
    capsys.readouterr()
    assert run(["patch", str(vocab), "--method", "yarn", "--factor", "2", "-o", str(tmp_path / "o.gguf")]) == 2
    assert "is a vocab-only GGUF" in capsys.readouterr().err and not (tmp_path / "o.gguf").exists()

    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[:-4])
    with pytest.raises(CheckpointError, match="tensor data ends at .* but the file has .*re-download"):
        read_gguf_info(cut)


# --- atomicity and memory (child processes) -----------------------------------------------------------------------
KILL_CHILD = """
import sys, time
import rope_extend.gguf.binary as binary
from rope_extend.gguf.write import patch_gguf
real = binary.copy_extent
def slow(*args):
    n = real(*args)
    open(sys.argv[3], "w").close()
    time.sleep(60)
    return n
binary.copy_extent = slow
patch_gguf(sys.argv[1], {"method": "yarn", "factor": 2}, sys.argv[2])
"""


def test_sigkill_during_write_leaves_nothing_at_out(tiny, tmp_path):
    out, marker = tmp_path / "out.gguf", tmp_path / "copying"
    before = sha256(tiny)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", KILL_CHILD, str(tiny), str(out), str(marker)], env=env)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, "the child exited before copying"
            assert time.monotonic() < deadline, "the child never started copying"
            time.sleep(0.05)
        assert list(tmp_path.glob(".out.gguf.*.tmp")), "the partial file should be a hidden temp file"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not out.exists()
    assert sha256(tiny) == before
    # the killed writer's hidden temp file is removed by the next write to OUT (its pid no longer runs)
    stale = list(tmp_path.glob(".out.gguf.*.tmp"))
    assert [p.name.split(".")[3] for p in stale] == [str(proc.pid)]
    live = tmp_path / f".out.gguf.{os.getppid()}.x.tmp"  # a running writer's temp file is left alone
    live.write_bytes(b"")
    patch_gguf(tiny, {"method": "yarn", "factor": 2}, out)
    assert out.is_file() and not any(p.exists() for p in stale) and live.exists()
    assert sorted(p.name for p in tmp_path.glob(".out.gguf.*.tmp")) == [live.name]


RSS_CHILD = """
import json, resource, sys
import rope_extend.gguf.write, rope_extend.methods, gguf, numpy, torch  # every import the patch needs, before measuring
from rope_extend.spec import load_spec
spec = load_spec(method="llama3", factor=2)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
rope_extend.gguf.write.patch_gguf(sys.argv[1], spec, sys.argv[2])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"before_kb": before, "after_kb": after}))
"""


def _peak_rss_increase_mb(source: Path, out: Path) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", RSS_CHILD, str(source), str(out)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return (data["after_kb"] - data["before_kb"]) / 1024


def write_sparse_gguf(path: Path, gib: int) -> Path:
    """A model-shaped GGUF of *gib* GiB whose tensors are holes (ftruncate): big on paper, nothing on disk."""
    n = 1 << 28  # 1 GiB of float32 per tensor
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(HEAD_DIM * N_HEAD)
    writer.add_head_count(N_HEAD)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(BASE)
    for i in range(gib):
        writer.add_tensor_info(f"blk.{i}.ffn_up.weight", (n,), np.dtype(np.float32), 4 * n)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    fout = writer.fout[0]
    start = gguf.GGUFWriter.ggml_pad(fout.tell(), writer.data_alignment)
    fout.truncate(start + gib * 4 * n)
    writer.close()
    return path


def test_memory_stays_o_metadata_on_demo_and_sparse_multi_gb(demo_gguf, tmp_path):
    """Peak RSS added by patch_gguf: small on the 98 MB demo and on a 6 GiB sparse GGUF (tensors never loaded)."""
    demo_mb = _peak_rss_increase_mb(demo_gguf, tmp_path / "demo-out.gguf")
    sparse = write_sparse_gguf(tmp_path / "sparse.gguf", gib=6)
    sparse_mb = _peak_rss_increase_mb(sparse, tmp_path / "sparse-out.gguf")
    out = tmp_path / "sparse-out.gguf"
    print(f"\npeak RSS increase: demo GGUF (98 MB) {demo_mb:.1f} MB; sparse {sparse.stat().st_size / 2**30:.1f} GiB GGUF "
          f"{sparse_mb:.1f} MB")
    assert 0 < out.stat().st_size - sparse.stat().st_size < 4096  # + rope_freqs (32 floats) and its tensor info
    assert out.stat().st_blocks * 512 < 16 << 20, "holes must stay holes"
    # O(metadata), not O(model). (gguf.GGUFReader alone would add 160 MB on the demo: a numpy view per vocab item.)
    assert sparse_mb < 30
    assert demo_mb < 30


# --- CLI ----------------------------------------------------------------------------------------------------------
def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "rope_extend", *args], env=env, capture_output=True, text=True)


def test_cli_patch_show_inspect_and_refusal(tiny, tmp_path):
    out = tmp_path / "cli.gguf"
    spec = tmp_path / "spec.yaml"
    spec.write_text("method: yarn\nfactor: 8\n")
    proc = _cli("patch", str(tiny), "--config", str(spec), "--set", "factor=4", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "yarn x4: 8192 -> 32768" in proc.stdout and "llama.rope.scaling.attn_factor=1" in proc.stdout
    assert fields(out)["llama.rope.scaling.factor"] == 4.0
    proc = _cli("show", str(out))
    assert proc.returncode == 0 and "context_length: 32768" in proc.stdout and "type=yarn" in proc.stdout
    proc = _cli("inspect", str(tiny), "--method", "yarn", "--factor", "4")
    assert proc.returncode == 0 and "rotary dim 64, base 100000" in proc.stdout
    proc = _cli("patch", str(tiny), "--method", "dynamic", "--factor", "2", "-o", str(tmp_path / "d.gguf"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "cannot express dynamic" in proc.stderr
    assert not (tmp_path / "d.gguf").exists()
