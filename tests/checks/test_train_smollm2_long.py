"""`make train-check`: training and tuning the demo model itself, SmolLM2-135M-Instruct (30 layers, 8k window), not
part of `make test`. The suite runs the same on the 2-layer model (the demo model's first 2 layers, window 256:
tests/test_train_lora.py, where planted bugs in the patch it trains show that the run refuses to write an unverified
checkpoint, and tests/test_tune.py); this run's record is eval/reports/train-check-smollm2/ (tools/run_check.py)."""

from __future__ import annotations

import json
import warnings

import pytest

from rope_extend import patch_model, unpatch_model
from rope_extend.cli import run

pytest.importorskip("peft")


@pytest.mark.slow
def test_smollm2_lora_smoke_run_writes_a_verified_16k_checkpoint(smollm2_path, tmp_path):
    """A few LoRA+ steps of the real SmolLM2-135M (8k -> 16k, PoSE window 64) on a short Shakespeare-like text."""
    text = tmp_path / "verse.txt"
    text.write_text(" ".join(f"Line {i}: shall I compare thee to a summer's day, thou art more lovely." for i in range(60)))
    out = tmp_path / "smol"
    args = ["train", str(smollm2_path), "--method", "yarn", "--factor", "2", "--text", str(text), "--window", "64",
            "--steps", "2", "--batch-tokens", "64", "--lora", "--save-adapter", "--save-steps", "100", "-o", str(out)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run(args) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["max_position_embeddings"] == 16384 and config["rope_scaling"]["factor"] == 2
    assert config["tie_word_embeddings"] is True
    assert (out / "adapter" / "adapter_config.json").is_file()
    summary = json.loads((out / "training.json").read_text())
    assert summary["recipe"]["lora"] and summary["tokens_trained"] == 2 * 64
    assert summary["recipe"]["pose"] and summary["recipe"]["target_length"] == 16384


@pytest.mark.slow
def test_tune_smoke_on_the_demo_model(smollm2_path, tmp_path):
    """The real model with its window pretended to be 512 tokens, so the lengths stay small (it really handles 8k,
    so no quality claim here): the search runs both families and logs the winner's true loss beyond 512."""
    from rope_extend.eval.perplexity import token_losses_unchunked, tokenize_text
    from rope_extend.eval.texts import load_text
    from rope_extend.eval.variants import load_model
    from rope_extend.tune.objective import CalibrationObjective
    from rope_extend.tune.search import tune

    model, tok = load_model(smollm2_path)
    model.config.max_position_embeddings = 512
    ids = tokenize_text(tok, load_text(None))[:1024]
    result = tune(model, 1024, ids, budget=3.3, knots=4, progress=False, log_path=tmp_path / "log.jsonl")
    assert result.best_per_dim is not None and result.best_closed is not None
    obj = CalibrationObjective(model, ids, 512)
    patch_model(model, result.winner.candidate.spec)
    ref = float(token_losses_unchunked(model, ids[:1024])[511:].double().mean())
    unpatch_model(model)
    assert result.winner.loss == pytest.approx(ref, rel=1e-4)
    assert obj(result.winner.candidate, 1024).loss == pytest.approx(result.winner.loss, rel=1e-6)
    print(f"winner {result.winner.candidate.spec}: loss beyond 512 {result.winner.loss:.4f}")
