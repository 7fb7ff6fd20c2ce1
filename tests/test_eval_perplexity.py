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
from rope_extend.eval.tiny import tiny_llama


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
