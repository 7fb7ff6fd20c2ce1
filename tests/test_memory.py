"""Memory before loading (issue 51 §3): a command that loads weights estimates what it needs first and refuses in
one line, with the numbers and the ways out, instead of being killed for memory.

The weights' estimate is checked against the published sizes of real checkpoints (Hub caches of sparse safetensors
files, tests/hubcache.py: real headers, no data); the working memory against a forward's measured peak; the
refusals run the real commands by Hub id with a faked /proc/meminfo (the 23 GB machine of the issue)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import hubcache
import pytest
from helpers import GiB, fake_memory

from rope_extend import memory
from rope_extend.cli import run


@pytest.fixture(scope="module")
def cache(hub_cache) -> Path:
    return hub_cache


def snapshot(cache: Path, repo: str) -> Path:
    return next((cache / f"models--{repo.replace('/', '--')}" / "snapshots").iterdir())


def hub_env(monkeypatch, cache: Path, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("repo", list(hubcache.MODELS))
def test_the_weights_are_the_published_sizes_read_from_the_headers_alone(cache, repo):
    """In the stored dtype the weights are the published index's total_size (Llama-2's float32 inv_freq buffers
    load in float16 like the rest); in float32, twice the 16-bit part."""
    model, folder = hubcache.MODELS[repo], snapshot(cache, repo)
    buffers = 32 * 64 * 4 if model.inv_freq else 0  # float32 bytes of the rotary buffers in the shards
    stored = {"BF16": "bfloat16", "F16": "float16"}[model.dtype]
    assert memory.load_dtype(folder, "auto") == stored
    assert memory.weights_bytes(folder, stored) == model.total_size - buffers // 2
    assert memory.weights_bytes(folder, "float32") == 2 * (model.total_size - buffers) + buffers


def test_mistral_in_float32_on_a_23_gb_machine_is_refused_in_one_line_before_loading(cache, tmp_path, monkeypatch,
                                                                                     capsys):
    """The issue's command: `tune mistralai/Mistral-7B-v0.3 --target-length 65536 --budget 1` (float32 by
    default) on a machine with 22 GiB available. One line: the weights' size (2 x the published 14.5 GB), the
    available memory, bfloat16, another device, the override; nothing written. eval by Hub id likewise."""
    hub_env(monkeypatch, cache, tmp_path)
    fake_memory(monkeypatch, tmp_path, 22 * GiB)
    weights = 2 * hubcache.MODELS["mistralai/Mistral-7B-v0.3"].total_size
    for args in (["tune", "mistralai/Mistral-7B-v0.3", "--target-length", "65536", "--budget", "1", "-o", "t"],
                 ["eval", "mistralai/Mistral-7B-v0.3", "--spec", "method=yarn,factor=2", "-o", "r"]):
        assert run(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        line = err[0]
        assert line.startswith("rope-extend: error: mistralai/Mistral-7B-v0.3 needs ~")
        assert f"of RAM in float32 at 65536 tokens (weights {weights / GiB:.1f} GiB" in line
        assert "and 22.0 GiB is available" in line
        assert "load it in bfloat16 (--dtype bfloat16: ~" in line and "--device cuda" in line
        assert line.endswith("or pass --no-memory-check to load it anyway")
        assert not Path(args[-1]).exists()


def test_the_shorter_length_it_offers_fits(cache, tmp_path, monkeypatch, capsys):
    """In bfloat16 the weights fit and the length does not: the refusal names the longest --target-length that
    fits, and the estimate at that length is within the available memory (and 1024 tokens more is not)."""
    hub_env(monkeypatch, cache, tmp_path)
    fake_memory(monkeypatch, tmp_path, 18 * GiB)
    repo = "mistralai/Mistral-7B-v0.3"
    assert run(["tune", repo, "--target-length", "65536", "--dtype", "bfloat16", "-o", "t"]) == 2
    line = capsys.readouterr().err.strip()
    assert "load it in" not in line  # already 16 bits
    fits = int(line.split("--target-length ")[1].split(")")[0])
    folder = snapshot(cache, repo)
    from rope_extend.files import load_config

    config = load_config(folder)

    def total(length: int) -> int:
        return memory.inference_need(folder, config, "bfloat16", length).total

    assert 1024 <= fits < 65536 and total(fits) <= 18 * GiB < total(fits + 1024)


def test_a_cgroup_limit_below_meminfo_is_what_is_available(tmp_path, monkeypatch):
    fake_memory(monkeypatch, tmp_path, 20 * GiB, cgroup_limit=9 * GiB)
    assert memory.available() == memory.Available(8 * GiB, "RAM")  # the limit less the cgroup's current use
    fake_memory(monkeypatch, tmp_path, 6 * GiB, cgroup_limit=9 * GiB)
    assert memory.available().bytes == 6 * GiB


def test_device_map_and_the_override_are_not_checked(cache, tmp_path, monkeypatch):
    """--device-map (accelerate places the layers) and --no-memory-check skip the check; the estimate is the same."""
    fake_memory(monkeypatch, tmp_path, GiB)
    folder = snapshot(cache, "meta-llama/Llama-3.1-70B")
    from rope_extend.files import load_config

    config = load_config(folder)
    with pytest.raises(memory.NotEnoughMemoryError, match="meta-llama/Llama-3.1-70B needs ~"):
        memory.check_inference("meta-llama/Llama-3.1-70B", folder, config, "auto", 8192)
    for kwargs in ({"device_map": "auto"}, {"skip": True}):
        need = memory.check_inference("meta-llama/Llama-3.1-70B", folder, config, "auto", 8192, **kwargs)
        assert need.weights == hubcache.MODELS["meta-llama/Llama-3.1-70B"].total_size


MEASURE = """
import json, os, resource, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
from rope_extend.eval.perplexity import token_losses
from rope_extend.memory import inference_per_token
torch.set_num_threads(1)
n = 2048
config = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=16384, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=n)
for name, kv in (("float32", False), ("bfloat16", True)):
    read, write = os.pipe()
    if os.fork() == 0:  # each measurement in its own child: a process's peak resident size only grows
        dtype = getattr(torch, name)
        model = LlamaForCausalLM(config).to(dtype).eval()
        ids = torch.randint(0, 1000, (1, n))
        with torch.inference_mode():
            token_losses(model, ids[:, :64])  # the kernels' one-time allocations
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            if kv:  # a probe's prefill: the cache filled, the last position's logits
                model(input_ids=ids, use_cache=True, logits_to_keep=1)
            else:  # perplexity: a forward and the loss in chunks
                token_losses(model, ids)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        estimate = inference_per_token(config, dtype.itemsize, kv) * n
        os.write(write, json.dumps({"dtype": name, "kv": kv, "measured": peak - before, "estimate": estimate}).encode())
        os._exit(0)
    os.close(write)
    print(os.read(read, 4096).decode())
    os.wait()
"""


def test_the_working_memory_is_a_forwards_measured_peak():
    """The per-token working memory times 2048 tokens against the peak resident memory a forward adds, in float32
    (perplexity: the loss in chunks) and in bfloat16 with the key/value cache (a probe's prefill); each in a child
    process, one thread, a narrow model with a wide MLP so that the activations are ~200-400 MB for little
    compute: within a factor 1.5 (the bound is loose because a process's peak resident size moves with the
    allocator)."""
    done = subprocess.run([sys.executable, "-c", MEASURE], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    measured = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert [(m["dtype"], m["kv"]) for m in measured] == [("float32", False), ("bfloat16", True)]
    for numbers in measured:
        assert numbers["estimate"] > 100e6
        assert 1 / 1.5 <= numbers["measured"] / numbers["estimate"] <= 1.5, numbers


@pytest.mark.gpu
def test_on_cuda_the_free_memory_of_the_device_is_what_is_available():
    import torch

    free, _ = torch.cuda.mem_get_info(0)
    have = memory.available("cuda:0")
    assert have.where == "cuda:0" and abs(have.bytes - free) < 64 << 20


def test_eval_plans_every_spec_on_the_config_before_the_memory_check(cache, tmp_path, monkeypatch, capsys):
    """Llama 3.1 ships llama3 x8: a llama3 spec at 262144 without replace_existing is refused by the plan, in one
    line, before the memory check; with it the plan passes and the memory check answers (nothing loaded either way)."""
    hub_env(monkeypatch, cache, tmp_path)
    fake_memory(monkeypatch, tmp_path, GiB)
    args = ["eval", "meta-llama/Llama-3.1-8B", "-o", "r", "--spec", "method=llama3,target_length=262144"]
    assert run(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "replace_existing" in err[0] and "needs ~" not in err[0], err
    assert run([*args[:-1], args[-1] + ",replace_existing=true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "meta-llama/Llama-3.1-8B needs ~" in err[0] and not Path("r").exists(), err


def test_train_is_refused_with_its_ways_out_before_loading(cache, tmp_path, monkeypatch, capsys):
    """`train meta-llama/Llama-3.1-8B` to 262144 on a 22 GiB machine: 16 bytes a parameter (float32 weights,
    gradients, AdamW's two moments; the parameters from the published bfloat16 size), --lora offered with its own
    estimate; with --lora and a 60 GiB machine, a --window that fits (PoSE) is offered, and fits. Nothing written."""
    hub_env(monkeypatch, cache, tmp_path)
    Path("t.txt").write_text("hello\n")
    repo = "meta-llama/Llama-3.1-8B"
    base = ["train", repo, "--method", "yarn", "--target-length", "262144", "--set", "replace_existing=true",
            "--text", "t.txt", "-o", "tr"]
    fake_memory(monkeypatch, tmp_path, 22 * GiB)
    assert run(base) == 2
    line = capsys.readouterr().err.strip()
    parameters = hubcache.MODELS[repo].total_size // 2
    assert f"(weights, gradients and optimizer state {16 * parameters / GiB:.1f} GiB" in line, line
    assert "train adapters (--lora: ~" in line and line.endswith("--no-memory-check to load it anyway")
    fake_memory(monkeypatch, tmp_path, 60 * GiB)
    assert run([*base, "--lora", "--window", "262144"]) == 2
    line = capsys.readouterr().err.strip()
    assert "--lora" not in line.split("to fit it,")[1]  # already asked
    window = int(line.split("--window ")[1].split(":")[0])
    from rope_extend.files import load_config

    folder = snapshot(cache, repo)
    need = memory.training_need(folder, load_config(folder), window, lora_r=16)
    assert 1024 <= window < 262144 and need.total <= 60 * GiB
    assert not any(p.name.startswith("tr") for p in Path(".").iterdir())


def test_patch_mode_full_is_refused_before_loading_and_config_only_offered(cache, tmp_path, monkeypatch, capsys):
    """`patch mistralai/Mistral-7B-v0.3 --mode full --dtype float32` on a 22 GiB machine: the float32 weights (2 x
    the published size), bfloat16 and --mode config-only (which loads nothing) offered; in the stored bfloat16 on a
    10 GiB machine, only config-only. Nothing written."""
    hub_env(monkeypatch, cache, tmp_path)
    repo = "mistralai/Mistral-7B-v0.3"
    weights = 2 * hubcache.MODELS[repo].total_size
    fake_memory(monkeypatch, tmp_path, 22 * GiB)
    base = ["patch", repo, "--method", "yarn", "--factor", "2", "--mode", "full", "-o", "o"]
    assert run([*base, "--dtype", "float32"]) == 2
    line = capsys.readouterr().err.strip()
    assert f"of RAM in float32 at 6 tokens (weights {weights / GiB:.1f} GiB" in line, line
    assert "load it in bfloat16 (--dtype bfloat16: ~" in line and "write the config only (--mode config-only" in line
    fake_memory(monkeypatch, tmp_path, 10 * GiB)
    assert run(base) == 2
    line = capsys.readouterr().err.strip()
    assert f"in bfloat16 at 6 tokens (weights {weights / 2 / GiB:.1f} GiB" in line and "--dtype" not in line
    assert not Path("o").exists()


def test_verify_of_changed_weights_is_refused_before_loading_them(tmp_path, monkeypatch, capsys):
    """OUT's weights replaced by other bytes: `verify` would load them, so on a machine faked to 1 MiB it stops in
    one line before loading, writing nothing; --no-memory-check verifies them."""
    import tiny
    from safetensors.torch import save_file

    source = tmp_path / "source"
    tiny.make_model("llama").save_pretrained(source)
    out = tmp_path / "out"
    assert run(["patch", str(source), "--method", "yarn", "--factor", "2", "-o", str(out)]) == 0
    state = {k: v + 1 for k, v in tiny.make_model("llama").state_dict().items()}
    save_file(state, tmp_path / "other.safetensors", metadata={"format": "pt"})
    (tmp_path / "other.safetensors").replace(out / "model.safetensors")
    record = (out / "rope_extend.yaml").read_bytes()
    capsys.readouterr()
    fake_memory(monkeypatch, tmp_path, 1 << 20)
    assert run(["verify", str(out)]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "error" in line]
    assert len(err) == 1 and f"{out} needs ~" in err[0] and "at 6 tokens" in err[0], err
    assert "--dtype" not in err[0] and "on another device (a machine with more memory)" in err[0]
    assert (out / "rope_extend.yaml").read_bytes() == record
    assert run(["verify", str(out), "--no-memory-check"]) == 0
    assert "on the real weights" in " ".join(capsys.readouterr().out.split())
