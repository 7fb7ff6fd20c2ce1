"""rope_extend.train.lora: LoRA on all linear layers but lm_head, trainable embeddings and norms (LongLoRA+),
tied embeddings kept tied through training and merging; merged == adapter model; and a smoke run of the training
command on the demo model's first 2 layers, which refuses to write a checkpoint trained with a planted bug."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from helpers import APPLY_BUGS, plant_apply_bug

from rope_extend import patch_model
from rope_extend.cli import run
from rope_extend.train import lora

pytest.importorskip("peft")


def _tied_llama(seed: int = 0):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("llama", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                  num_hidden_layers=2, intermediate_size=96, vocab_size=256,
                                  max_position_embeddings=32, head_dim=16, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).float()
    patch_model(model, method="yarn", factor=4)
    return model


def _train_a_little(model, steps: int = 5):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(1))
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids, attention_mask=torch.ones_like(ids)).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    return ids


def test_lora_trains_adapters_on_every_linear_but_lm_head_plus_embeddings_and_norms():
    base = _tied_llama()
    names = lora.embedding_and_norm_names(base)
    assert names == ["embed_tokens", "input_layernorm", "norm", "post_attention_layernorm"]
    model = lora.wrap(base, r=4, alpha=16, dropout=0.0, embeddings_and_norms=True, seed=0)
    trainable = lora.trainable_names(model)
    adapters = {n.split(".lora_")[0].removeprefix("base_model.model.") for n in trainable if ".lora_" in n}
    linear = {n for n, m in _tied_llama().named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"}
    assert adapters == linear and len(linear) == 2 * 7  # q k v o gate up down in each of the 2 layers, no lm_head
    extra = [n for n in trainable if ".lora_" not in n]
    assert any("embed_tokens" in n for n in extra)
    assert sum("layernorm" in n for n in extra) == 4 and any(n.endswith("model.norm.modules_to_save.default.weight")
                                                             or ".norm." in n for n in extra)
    frozen_linear = [p.requires_grad for n, p in model.named_parameters() if n.endswith("q_proj.base_layer.weight")]
    assert frozen_linear and not any(frozen_linear)
    only = lora.wrap(_tied_llama(), r=4, alpha=16, dropout=0.0, embeddings_and_norms=False, seed=0)
    assert all(".lora_" in n for n in lora.trainable_names(only))


def test_merged_model_stays_tied_and_equals_the_adapter_model(tmp_path):
    from transformers import AutoModelForCausalLM

    model = lora.wrap(_tied_llama(), r=4, alpha=16, dropout=0.0, embeddings_and_norms=True, seed=0)
    before = _tied_llama().get_input_embeddings().weight.detach().clone()
    ids = _train_a_little(model)
    positions = torch.tensor([[0, 1, 2, 40, 80, 127]])
    probe = ids[:1, :6]
    with torch.no_grad():
        adapter_logits = model(input_ids=probe, position_ids=positions, use_cache=True).logits
    merged = lora.merge(model)
    assert lora.is_tied(merged)
    assert not torch.equal(merged.get_input_embeddings().weight, before)  # the embedding was trained...
    with torch.no_grad():
        merged_logits = merged(input_ids=probe, position_ids=positions, use_cache=True).logits
    torch.testing.assert_close(merged_logits, adapter_logits, atol=1e-5, rtol=0)  # ...and lm_head followed it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        merged.save_pretrained(tmp_path / "m")
        reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    with torch.no_grad():
        reloaded_logits = reloaded(input_ids=probe, position_ids=positions, use_cache=True).logits
    torch.testing.assert_close(reloaded_logits, adapter_logits, atol=1e-5, rtol=0)


def smoke_run(folder, tmp_path) -> tuple[int, dict]:
    """A few LoRA+ steps of the suite's 2-layer model (the demo model's first 2 layers, its real tokenizer and tied
    embeddings; window 256 -> 512, PoSE window 64) on a short Shakespeare-like text: (exit status, written config)."""
    text = tmp_path / "verse.txt"
    text.write_text(" ".join(f"Line {i}: shall I compare thee to a summer's day, thou art more lovely." for i in range(60)))
    out = tmp_path / "smol"
    args = ["train", str(folder), "--method", "yarn", "--factor", "2", "--text", str(text), "--window", "64",
            "--steps", "2", "--batch-tokens", "64", "--lora", "--save-adapter", "--save-steps", "100", "-o", str(out)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = run(args)
    config = json.loads((out / "config.json").read_text()) if (out / "config.json").is_file() else {}
    return code, config


@pytest.mark.slow
def test_lora_smoke_run_of_the_demo_layers_writes_a_verified_checkpoint(short_window, tmp_path):
    """The training command on the demo model's own layers and tokenizer writes a checkpoint that stock
    transformers reloads to the trained model (the writer's verification); the demo model itself (8k -> 16k) is
    `make train-check`'s (tests/checks/test_train_smollm2_long.py)."""
    code, config = smoke_run(short_window, tmp_path)
    assert code == 0
    assert config["max_position_embeddings"] == 512 and config["rope_scaling"]["factor"] == 2
    assert config["tie_word_embeddings"] is True
    out = tmp_path / "smol"
    assert (out / "adapter" / "adapter_config.json").is_file()
    summary = json.loads((out / "training.json").read_text())
    assert summary["recipe"]["lora"] and summary["tokens_trained"] == 2 * 64
    assert summary["recipe"]["pose"] and summary["recipe"]["target_length"] == 512


@pytest.mark.slow
@pytest.mark.parametrize("bug", APPLY_BUGS)
def test_a_planted_bug_in_the_trained_patch_is_never_written(short_window, tmp_path, bug, monkeypatch, capsys):
    """The model trains with another RoPE than the checkpoint's config says (helpers.APPLY_BUGS): the run's
    verification refuses to write it, and says so in one line."""
    applied = plant_apply_bug(monkeypatch, bug)
    code, _ = smoke_run(short_window, tmp_path)
    err = capsys.readouterr().err
    assert applied and code != 0, err
    assert "did not verify" in err, err
