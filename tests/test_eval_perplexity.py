"""Chunked loss equals the full-logits loss; buckets and per-length perplexity bookkeeping."""

from __future__ import annotations

import math

import pytest
import torch

from rope_extend.eval.perplexity import (
    bucket_losses,
    perplexity_at_length,
    token_losses,
    token_losses_unchunked,
)
from rope_extend.eval.toy_models import tiny_llama


@pytest.fixture(scope="module")
def model():
    return tiny_llama(vocab_size=1000, max_position_embeddings=256)


@pytest.mark.parametrize("chunk", [1, 7, 64, 100, 299, 4096])
def test_chunked_equals_unchunked(model, chunk):
    ids = torch.randint(0, 1000, (300,), generator=torch.Generator().manual_seed(0))
    ref = token_losses_unchunked(model, ids)
    got = token_losses(model, ids, chunk_size=chunk)
    assert got.shape == (299,)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_matches_hf_loss(model):
    ids = torch.randint(0, 1000, (1, 200), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hf = model(input_ids=ids, labels=ids).loss
    assert token_losses(model, ids, chunk_size=33).mean().item() == pytest.approx(hf.item(), rel=1e-5)


def test_buckets():
    losses = torch.arange(10, dtype=torch.float32)  # predicts positions 1..10
    b = bucket_losses(losses, bucket_size=4, original_length=6)
    assert [(x["start"], x["end"]) for x in b] == [(0, 4), (4, 6), (6, 8), (8, 11)]
    assert sum(x["n"] for x in b) == 10
    assert b[0]["loss"] == pytest.approx((0 + 1 + 2) / 3)  # positions 1,2,3


def test_perplexity_at_length(model):
    ids = torch.randint(0, 1000, (1000,), generator=torch.Generator().manual_seed(2))
    r = perplexity_at_length(model, ids, 400, original_length=256, bucket_size=128, chunk_size=50)
    assert r["length"] == 400
    assert r["ppl"] == pytest.approx(math.exp(r["loss"]))
    assert r["loss_within_original"] is not None and r["loss_beyond_original"] is not None
    n = sum(b["n"] for b in r["buckets"])
    assert n == 399
    with pytest.raises(ValueError, match="1000 tokens"):
        perplexity_at_length(model, ids, 2000)


def test_two_builtin_corpora_are_long_and_unrelated():
    from rope_extend.eval.texts import LICENSE_FILES, load_text, text_label

    docs, licenses = load_text("pydoc_topics"), load_text("debian_licenses")
    assert len(licenses) > 150_000 and len(docs) > 400_000  # >= 16k tokens each for any BPE tokenizer
    assert "GNU GENERAL PUBLIC LICENSE" in licenses and "Apache License" in licenses
    assert "GNU GENERAL PUBLIC LICENSE" not in docs
    assert text_label("debian_licenses") == "debian_licenses" and text_label("/x/my.txt") == "my.txt"
    assert len(set(LICENSE_FILES)) == len(LICENSE_FILES)


def test_missing_license_texts_say_what_to_do(tmp_path):
    from rope_extend.eval.texts import debian_licenses_text

    with pytest.raises(FileNotFoundError, match="needs Apache-2.0, GPL-3.*base-files.*--text"):
        debian_licenses_text(tmp_path)


def test_block_interval_in_perplexity_metrics(model):
    from rope_extend.eval.perplexity import perplexity_at_lengths

    ids = torch.randint(0, 1000, (1000,), generator=torch.Generator().manual_seed(3))
    res = perplexity_at_lengths(model, ids, [100, 400], block_size=64)
    r = res[400]
    assert len(r["block_losses"]) == 7  # 399 losses: 6 blocks of 64 + one of 15
    assert r["loss_ci"][0] < r["loss"] < r["loss_ci"][1]
    assert r["ppl_ci"] == pytest.approx([math.exp(x) for x in r["loss_ci"]])
    own = perplexity_at_length(model, ids, 100, block_size=64)
    assert res[100]["loss"] == pytest.approx(own["loss"], abs=1e-5)
    one = perplexity_at_length(model, ids, 60, block_size=64)  # 59 losses, one block: no interval (issue 66)
    assert len(one["block_losses"]) == 1 and "loss_ci" not in one and "ppl_ci" not in one
    assert one["ci"] == "n = 1: no interval (one 64-token block)"
