"""`make eval-check`: the real model, SmolLM2-135M-Instruct (8k window), with YaRN x2 beyond its native window.

One 12,288-token forward per variant (~1 min each on 2 CPU cores): not part of `make test`. The suite checks the same
evaluation path on the 2-layer model at twice its 256-token window against stock transformers' own RoPE
(tests/test_eval_smollm2.py, where planted bugs show that it fails); this run's record is
eval/reports/eval-check-smollm2/ (tools/run_check.py). Measured with this text (stdlib docs prose): mean loss on
tokens 10240-12288 is ~3.30 unpatched vs ~2.38 with YaRN x2; on tokens 0-2048 ~2.48 vs ~2.50.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow

L = 12288


@pytest.fixture(scope="module")
def setup(smollm2_path):
    from rope_extend.eval.perplexity import tokenize_text
    from rope_extend.eval.texts import load_text
    from rope_extend.eval.variants import load_model

    model, tok = load_model(smollm2_path)
    ids = tokenize_text(tok, load_text())
    assert ids.numel() > L
    return smollm2_path, model, tok, ids


def test_yarn_x2_far_better_beyond_window(setup):
    from rope_extend.eval.perplexity import token_losses
    from rope_extend.eval.variants import apply_spec, original_length

    _, model, _, ids = setup
    assert original_length(model) == 8192
    base = token_losses(model, ids[:L])
    apply_spec(model, {"method": "yarn", "factor": 2.0})  # rope_extend.patch_model, in place
    assert model.config.max_position_embeddings == 16384
    yarn = token_losses(model, ids[:L])

    # losses[i] predicts token i+1
    far_base, far_yarn = base[10239:].mean().item(), yarn[10239:].mean().item()
    beyond_base, beyond_yarn = base[8191:].mean().item(), yarn[8191:].mean().item()
    short_base, short_yarn = base[:2047].mean().item(), yarn[:2047].mean().item()
    print(f"\nunpatched: 0-2k {short_base:.3f}  8k-12k {beyond_base:.3f}  10k-12k {far_base:.3f}")
    print(f"yarn x2:   0-2k {short_yarn:.3f}  8k-12k {beyond_yarn:.3f}  10k-12k {far_yarn:.3f}")
    assert far_yarn < far_base - 0.5  # ~2.4 vs ~3.3
    assert beyond_yarn < beyond_base - 0.2
    # short-context regression is small (static YaRN: the first 2k losses equal a 2k-only run)
    assert abs(short_yarn - short_base) < 0.1
    assert torch.isfinite(yarn).all()


def test_linear_x2_hurts_short_context(setup):
    """Position interpolation without fine-tuning degrades short context much more than YaRN."""
    from rope_extend.eval.perplexity import token_losses
    from rope_extend.eval.variants import apply_spec, load_model

    path, _, _, ids = setup
    short = 2048
    m, _ = load_model(path)
    base = token_losses(m, ids[:short]).mean().item()
    apply_spec(m, {"method": "linear", "factor": 2.0})
    lin = token_losses(m, ids[:short]).mean().item()
    print(f"\n2k tokens: unpatched {base:.3f}  linear x2 {lin:.3f}")
    assert lin > base + 0.3
