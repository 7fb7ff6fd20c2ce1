"""Training memory that grows linearly with the window: the chunked loss (`rope_extend/train/loss.py`) against
transformers' own full-logits loss, what the training forward keeps for backward (no window x window and no
window x vocabulary tensor), and the attention kernel training gets (`rope_extend/train/sdpa.py`).

Tiny random llamas (GQA: 4 query heads, 2 key/value heads), float32 on the CPU; each test runs in about a second.
"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import profile
from transformers import LlamaConfig, LlamaForCausalLM

from rope_extend.train import sdpa
from rope_extend.train.loss import chunk_tokens_for, chunked_causal_lm_loss, head_input

VOCAB = 300


def _model(seed: int = 0, tie: bool = True) -> LlamaForCausalLM:
    config = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, max_position_embeddings=4096,
                         tie_word_embeddings=tie)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.config.use_cache = False
    return model.train()


def _batch(n: int, batch: int = 2):
    """A training batch as `WindowDataset` makes it: PoSE positions (a jump after chunk 1), an all-ones mask,
    labels with the chunk-2 start ignored."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (batch, n), generator=g)
    positions = torch.arange(n).repeat(batch, 1)
    positions[:, n // 3:] += 1000
    labels = ids.clone()
    labels[:, n // 3] = -100
    return {"input_ids": ids, "position_ids": positions, "attention_mask": torch.ones(batch, n, dtype=torch.long),
            "labels": labels}


def _grads(model) -> dict[str, torch.Tensor]:
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("num_items", [None, 157])
def test_the_chunked_loss_and_its_gradients_equal_transformers_full_logits_loss(tie, num_items):
    """The reference is the model's own loss (`ForCausalLMLoss` on [B, n, vocab] float32 logits); chunks of 16
    positions that split rows unevenly (2 x 50 positions), with and without the Trainer's `num_items_in_batch`."""
    batch = _batch(50)
    plain = _model(tie=tie)
    kwargs = {} if num_items is None else {"num_items_in_batch": torch.tensor(num_items)}
    want = plain(**batch, **kwargs).loss
    want.backward()
    chunked = _model(tie=tie)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with head_input(chunked.get_output_embeddings()) as seen:
        out = chunked(**inputs)
    assert out.logits.shape == (2, 1, VOCAB)  # the model's own logits: the last position only
    got = chunked_causal_lm_loss(seen[0], batch["labels"], chunked.get_output_embeddings(), 16,
                                 None if num_items is None else torch.tensor(num_items))
    got.backward()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    want_grads, got_grads = _grads(plain), _grads(chunked)
    assert sorted(want_grads) == sorted(got_grads)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_chunk_size_follows_the_vocabulary():
    assert chunk_tokens_for(49152) == (256 << 20) // (4 * 49152) == 1365
    assert chunk_tokens_for(128256) == 523 and chunk_tokens_for(10**9) == 64


def _largest_saved(run) -> int:
    """The largest tensor (elements) autograd keeps for the backward pass while `run()` builds the graph."""
    sizes = [0]

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = run()
    loss.backward()
    return max(sizes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_training_forward_keeps_no_window_squared_or_window_by_vocabulary_tensor(dtype):
    """At n = 768 the score matrix of one head is n^2 = 589,824 elements and the full logits n x 300 = 230,400;
    the chunked training loss keeps neither (the largest saved tensor is a hidden/MLP activation or a weight),
    while transformers' own loss keeps the full logits (the check can fail). The attention kernel is torch's
    flash kernel for the CPU in both dtypes, GQA included, never the math one."""
    n = 768
    batch = _batch(n, batch=1)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    model = _model()
    head = model.get_output_embeddings()

    def chunked():
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            with head_input(head) as seen:
                model(**inputs)
            return chunked_causal_lm_loss(seen[0], batch["labels"], head, 128)

    def plain():
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            return model(**batch).loss

    with profile() as prof:
        largest = _largest_saved(chunked)
    assert largest < n * VOCAB // 2 and largest < n * n // 4, largest
    assert _largest_saved(plain) >= n * VOCAB
    kernels = {e.name for e in prof.events() if "scaled_dot_product" in e.name}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in kernels, kernels
    assert not any("math" in k for k in kernels), kernels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_training_attention_on_the_cpu_is_sdpa_with_the_flash_kernel(dtype):
    choice = sdpa.choose(_model().config, "cpu", dtype, window=4096)
    assert (choice.how, choice.kernel) == (sdpa.SDPA, "flash")
    assert choice.describe() == "sdpa (flash kernel)"


def test_expanded_kv_attention_equals_transformers_sdpa_and_is_installed_only_inside_the_block():
    """The swap CUDA float32 gets (K/V heads repeated, no enable_gqa): the same logits as transformers' "sdpa" on
    a GQA model; installed as the "sdpa" entry only within `sdpa.installed` (the config keeps "sdpa")."""
    from rope_extend import compat

    model = _model().eval()
    batch = _batch(40, batch=1)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        want = model(**inputs).logits
    registry = compat.attention_functions()
    before = registry.get_local("sdpa")
    with sdpa.installed(sdpa.AttentionChoice(sdpa.EXPANDED, "memory-efficient")):
        assert registry.get_local("sdpa") is sdpa.expanded_kv_attention
        with torch.no_grad(), profile(record_shapes=True) as prof:
            got = model(**inputs).logits
    assert registry.get_local("sdpa") is before and model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    shapes = [e.input_shapes for e in prof.events() if e.name == "aten::scaled_dot_product_attention"]
    assert shapes and all(s[1][1] == 4 for s in shapes), shapes  # keys arrive with all 4 heads


def test_no_memory_efficient_kernel_is_refused_naming_the_dtype(monkeypatch):
    monkeypatch.setattr(sdpa, "_kernel", lambda *a, **k: "math")
    with pytest.raises(ValueError, match=r"--dtype float32: .* 16384 x 16384 .* use --dtype bfloat16"):
        sdpa.choose(_model().config, "cpu", torch.float32, window=16384)


def test_the_activation_estimate_behind_auto_checkpointing_matches_what_autograd_keeps():
    """`memory.activation_bytes` (what `--gradient-checkpointing auto` weighs) against the bytes autograd actually
    saves per token and layer in a training forward of a GQA llama (distinct storages, weights left out, one layer's
    share taken as the difference between 3 and 1 layers): within 30 % (the count is 1.19x of it)."""
    from rope_extend.memory import activation_bytes

    n = 256

    def saved_bytes(layers: int) -> int:
        config = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=16, vocab_size=VOCAB)
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).train()
        weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        kept: dict[int, int] = {}

        def pack(t):
            if t.untyped_storage().data_ptr() not in weights:
                kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        batch = _batch(n, batch=1)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model.model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                        attention_mask=batch["attention_mask"])
        return sum(kept.values())

    measured = (saved_bytes(3) - saved_bytes(1)) / 2 / n
    estimate = activation_bytes(n, 64, 96, 2 * 16, 1, 4) / n
    assert 0.7 <= measured / estimate <= 1.3, (measured, estimate)
