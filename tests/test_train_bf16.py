"""`rope-extend train` in half precision, and what a run keeps when anything fails after its optimizer steps.

Issue 36: with `--dtype bfloat16` (the default on GPUs) every run trained, then failed verification at the last step:
transformers' Trainer leaves accelerate's autocast wrapper on `model.forward`, so the writer probed the trained model
in bfloat16 and compared it with the float32 reload of the same weights. Here a bf16 (and an fp16) run on the CPU
verifies, and its checkpoint reloads in stock transformers (this line and, with ROPE_EXTEND_OTHER_PYTHON, the other
one) to the trained model's own logits; at a tiny window and at SmolLM2's RoPE (original 8192, theta 1e5, PoSE
windows of 512 positioned up to 16383). Then one trained run goes through a failed verification, a full disk and a
SIGTERM while writing, each rerun training nothing, and the last one writes OUT with the trained weights.
"""

from __future__ import annotations

import copy
import errno
import json
import os
import shutil
import signal
import warnings
from pathlib import Path

import pytest
import tiny
import torch
from safetensors.torch import load_file

from rope_extend.cli import run
from rope_extend.errors import VerificationError

OTHER = os.environ.get("ROPE_EXTEND_OTHER_PYTHON")


def _source(folder: Path, smollm2_path: str, **rope) -> Path:
    """A tiny random llama with SmolLM2's real tokenizer (tied embeddings, 49k vocab) and the given RoPE fields."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    config = AutoConfig.for_model(
        "llama", hidden_size=rope.pop("hidden_size", 64), num_attention_heads=rope.pop("heads", 4),
        num_key_value_heads=rope.pop("kv_heads", 2), num_hidden_layers=2, intermediate_size=96,
        vocab_size=len(tokenizer), tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, **rope)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(Path(smollm2_path) / name, folder / name)
    return folder


def _text(path: Path, words: int = 2400) -> Path:
    vocab = [f"w{i:02d}" for i in range(60)]  # a 60-word cycle, as tests/test_train.py's toy text
    path.write_text(" ".join(vocab[i % 60] for i in range(words)) + "\n")
    return path


@pytest.fixture(scope="module")
def sources(tmp_path_factory, smollm2_path):
    root = tmp_path_factory.mktemp("bf16-src")
    small = _source(root / "tiny-64", smollm2_path, max_position_embeddings=64, head_dim=16)
    smol_rope = _source(root / "tiny-smollm2-rope", smollm2_path, max_position_embeddings=8192, rope_theta=100000.0,
                        head_dim=64, hidden_size=128, heads=2, kv_heads=1)
    return {"tiny": small, "smollm2-rope": smol_rope, "text": _text(root / "toy.txt", 6000)}


def _spy_trained_model(monkeypatch) -> dict:
    """Wrap the writer the training run calls: record whether the model came with accelerate's mixed-precision wrapper
    and, after the write, the trained model itself (its class's plain forward is the reference below)."""
    from rope_extend.train import finish

    seen: dict = {}
    real = finish.write_checkpoint

    def spy(*args, model, **kwargs):
        seen["autocast_wrapper"] = "_original_forward" in vars(model)
        seen["model"] = model
        return real(*args, model=model, **kwargs)

    monkeypatch.setattr(finish, "write_checkpoint", spy)
    return seen


@pytest.mark.parametrize(("dtype", "source", "window", "factor", "positions"), [
    ("bfloat16", "tiny", 32, 4, 200),
    ("bfloat16", "smollm2-rope", 512, 2, 256),
    pytest.param("float16", "tiny", 32, 4, 200, marks=pytest.mark.gpu),  # fp16 mixed precision needs an accelerator
])
def test_half_precision_training_verifies_and_reloads_to_the_trained_logits(sources, tmp_path, monkeypatch, capsys,
                                                                            dtype, source, window, factor, positions):
    out = tmp_path / "out"
    seen = _spy_trained_model(monkeypatch)
    args = ["train", str(sources[source]), "--method", "yarn", "--factor", str(factor), "--text",
            str(sources["text"]), "--window", str(window), "--steps", "2", "--batch-tokens", str(window),
            "--lr", "3e-3", "--warmup", "0", "--dtype", dtype, "-o", str(out)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run(args) == 0, capsys.readouterr().err[-2000:]
    assert "verified with stock transformers" in " ".join(capsys.readouterr().out.split())  # wrapped at 80 columns
    # The Trainer did hand the writer an autocast-wrapped model (the bug's trigger); the weights are its float32
    # master weights, saved as such, and the config says so.
    assert seen["autocast_wrapper"] is True
    saved = load_file(str(out / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.float32}
    config = json.loads((out / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "float32"
    assert json.loads((out / "training.json").read_text())["precision"].startswith(f"{dtype} mixed precision")
    source_weights = load_file(str(sources[source] / "model.safetensors"))
    assert any(not torch.equal(saved[k], source_weights[k]) for k in saved)  # trained
    # Reference: the trained model's own logits through its class's forward (no wrapper): beyond the original
    # length for the tiny source (200 positions, original 64); for the SmolLM2-RoPE one the writer's probe covered
    # positions up to 16383 and this reload check covers the first 256.
    ids = torch.randint(3, 49152, (1, positions), generator=torch.Generator().manual_seed(0))
    model = copy.deepcopy(seen["model"]).cpu().eval()  # on the reload's device (a GPU run's model is on CUDA)
    with torch.no_grad():
        trained = type(model).forward(model, input_ids=ids).logits.float()
    (this,) = tiny.stock_logits([(out, ids)], tmp_path / "this")
    torch.testing.assert_close(this, trained, atol=1e-5, rtol=0)
    if OTHER:
        (other,) = tiny.stock_logits([(out, ids)], tmp_path / "other", python=OTHER)
        torch.testing.assert_close(other, trained, atol=1e-5, rtol=0)


def test_float16_on_the_cpu_is_refused_before_any_work(sources, tmp_path, capsys, monkeypatch):
    """accelerate runs fp16 mixed precision only on accelerators; on the CPU it would silently train in float32."""
    from rope_extend.train import prepare

    monkeypatch.setattr(prepare, "device", lambda: "cpu")
    out = tmp_path / "fp16"
    args = ["train", str(sources["tiny"]), "--method", "yarn", "--factor", "4", "--text", str(sources["text"]),
            "--window", "32", "--steps", "2", "--dtype", "float16", "-o", str(out)]
    assert run(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--dtype float16 needs a GPU" in err[0] and "bfloat16" in err[0]
    assert not out.exists() and not (tmp_path / "fp16.train-state").exists()


def test_the_autocast_forward_is_what_failed_verification(sources, tmp_path):
    """The root cause, isolated: the same float32 weights probed under bfloat16 autocast (what the wrapped forward
    ran) and plainly differ by more than float32's tolerance, so comparing them with the float32 reload failed;
    `stock_forward` removes accelerate's wrapper and the comparison is like with like."""
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM

    from rope_extend.checkpoint import stock_forward
    from rope_extend.patch import patch_model
    from rope_extend.plan import plan_patch
    from rope_extend.verify import output_rtol, probe_outputs

    model = AutoModelForCausalLM.from_pretrained(sources["tiny"], dtype=torch.float32).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        patch_model(model, {"method": "yarn", "factor": 4}, verify=False)
    plan = plan_patch(model.config, {"method": "yarn", "factor": 4})
    plain = probe_outputs(model, plan)
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()  # an in-process training run before this test (same xdist worker) fixed fp32
    wrapped = Accelerator(cpu=True, mixed_precision="bf16").prepare_model(model)
    assert "_original_forward" in vars(wrapped)
    autocast = probe_outputs(wrapped, plan)
    scale = float(plain.abs().max())
    assert float((autocast - plain).abs().max()) > output_rtol(torch.float32) * scale
    unwrapped = stock_forward(wrapped)
    assert "_original_forward" not in vars(unwrapped)
    assert torch.equal(probe_outputs(unwrapped, plan), plain)
    assert output_rtol(torch.bfloat16) == 4 * 2**-7 and output_rtol(torch.float16) == 4 * 2**-10


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def _err_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rope-extend: ")]
    return lines[-1]


def test_nothing_trained_is_thrown_away_when_writing_fails(sources, tmp_path, monkeypatch, capsys):
    """One bf16 run (2 steps), then everything that can fail after the optimizer: verification (simulated: the
    verifier raises), a full disk halfway through the weights file, SIGTERM during the write. Each keeps the trained
    weights on disk and says where and how to finish; each rerun of the same command trains nothing; the last one
    writes and verifies OUT with exactly the weights the first run trained."""
    import transformers

    from rope_extend import checkpoint

    out = tmp_path / "run"
    state = tmp_path / "run.train-state"
    kept = tmp_path / "run.unverified"
    args = ["train", str(sources["tiny"]), "--method", "yarn", "--factor", "4", "--text", str(sources["text"]),
            "--window", "32", "--steps", "2", "--batch-tokens", "64", "--lr", "3e-3", "--warmup", "0",
            "--dtype", "bfloat16", "-o", str(out)]
    warnings.simplefilter("ignore")

    # 1. verification fails: OUT is not created, the written checkpoint is kept beside it, marked
    with monkeypatch.context() as patch:
        def failing(*a, **k):
            raise VerificationError("saved model: simulated disagreement")

        patch.setattr(checkpoint, "verify_output", failing)
        assert run(args) == 2
    err = capsys.readouterr().err
    assert "step 2/2" in err
    line = [x for x in err.splitlines() if x.startswith("rope-extend: error:")][-1]
    assert "did not verify: saved model: simulated disagreement" in line
    assert str(kept) in line and str(state / "checkpoint-2") in line and "rerun the same command" in line
    assert not out.exists()
    card = (kept / "README.md").read_text()
    assert "**Not verified.**" in card and "simulated disagreement" in card
    trained = _weights(state / "checkpoint-2")
    kept_weights = _weights(kept)
    assert kept_weights.keys() == trained.keys()
    assert all(torch.equal(kept_weights[k], trained[k]) for k in trained)  # the kept model is the trained one
    (kept_logits,) = tiny.stock_logits([(kept, torch.arange(3, 103)[None])], tmp_path / "kept")  # loadable
    assert kept_logits.shape == (1, 100, 49152)

    # 2. the disk fills up halfway through the weights file: nothing half-written is left, the state is intact
    real_save = transformers.PreTrainedModel.save_pretrained

    def disk_full(self, folder, *a, **k):
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "model.safetensors").write_bytes(b"\0" * 4096)
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(transformers.PreTrainedModel, "save_pretrained", disk_full)
        assert run(args) == 2
    err = capsys.readouterr().err
    assert "training had finished (checkpoint-2)" in err and "step 1/" not in err  # no training
    line = [x for x in err.splitlines() if x.startswith("rope-extend: error:")][-1]
    assert "no space left" in line and str(state / "checkpoint-2") in line and "rerun the same command" in line
    assert not out.exists() and not list(tmp_path.glob(".run.rope-extend-tmp-*"))
    assert all(torch.equal(_weights(state / "checkpoint-2")[k], trained[k]) for k in trained)

    # 3. SIGTERM while the weights are being written: exit 143, the line names the signal and the kept weights
    def terminated(self, folder, *a, **k):
        real_save(self, folder, *a, **k)
        os.kill(os.getpid(), signal.SIGTERM)

    with monkeypatch.context() as patch:
        patch.setattr(transformers.PreTrainedModel, "save_pretrained", terminated)
        assert run(args) == 143
    line = _err_line(capsys)
    assert line.startswith("rope-extend: interrupted (SIGTERM) while writing") and "after training finished" in line
    assert str(state / "checkpoint-2") in line and "rerun the same command" in line
    assert not out.exists() and not list(tmp_path.glob(".run.rope-extend-tmp-*"))

    # 4. the same command once more: OUT written and verified with the trained weights; the state and the
    # unverified copy are gone
    assert run(args) == 0
    streams = capsys.readouterr()
    assert "step 1/" not in streams.err and f"removed {kept}" in streams.err
    assert "all 2 step(s) already trained (resumed at step 2): no step to run; writing OUT" in streams.err
    assert "verified with stock transformers" in " ".join(streams.out.split())  # wrapped at 80 columns
    assert all(torch.equal(_weights(out)[k], trained[k]) for k in trained)
    assert not state.exists() and not kept.exists()
    log = [json.loads(x) for x in (out / "training_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == [1, 2]  # the card's log is the first run's
