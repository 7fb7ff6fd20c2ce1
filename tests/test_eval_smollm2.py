"""The evaluation's path on real weights: the suite's 2-layer model (the demo model's first 2 layers, window 256:
`short_window`), its real tokenizer and text, at twice its window (512 tokens, every position past 256 beyond it).

`eval.variants.load_model`, `apply_spec` (rope-extend's `patch_model`, in place) and `eval.perplexity.token_losses`
give, token by token, the losses of stock transformers running its own RoPE of the same method (the model loaded
with that `rope_parameters`): YaRN x2 and linear (PI) x2. A RoPE that differs moves every token past the window, and
on two layers as on thirty: planted bugs (a doubled attention factor, a dropped rope_theta, unscaled frequencies)
fail the comparison (`test_a_planted_bug_fails_the_comparison`). The demo model itself at 12k tokens, where YaRN x2
is far better than the unpatched model past its real 8192-token window (a quality claim two layers cannot make),
runs in `make eval-check` (tests/checks/test_eval_smollm2_long.py, its record in eval/reports/eval-check-smollm2/).
"""

from __future__ import annotations

import pytest
import torch
from helpers import APPLY_BUGS, plant_apply_bug

pytestmark = pytest.mark.slow

WINDOW = 256  # the short_window model's
L = 2 * WINDOW
SPECS = {"yarn": {"method": "yarn", "factor": 2.0}, "linear": {"method": "linear", "factor": 2.0}}
# stock transformers' own RoPE of each spec, written by hand (its rope_parameters; rope_theta is the model's)
STOCK = {
    "yarn": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": WINDOW},
    "linear": {"rope_type": "linear", "factor": 2.0},
}


@pytest.fixture(scope="module")
def ids(short_window):
    from rope_extend.eval.perplexity import tokenize_text
    from rope_extend.eval.texts import load_text
    from rope_extend.eval.variants import load_model

    _, tok = load_model(short_window)
    ids = tokenize_text(tok, load_text())
    assert ids.numel() > L
    return ids[:L]


@pytest.fixture(scope="module")
def stock(short_window, ids):
    """Per method, stock transformers' token losses with its own RoPE (computed once)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rope_extend.compat import dtype_kwargs
    from rope_extend.eval.perplexity import token_losses

    out = {}
    for method, rope in STOCK.items():
        config = AutoConfig.from_pretrained(short_window)
        config.rope_parameters = {**rope, "rope_theta": config.rope_parameters["rope_theta"]}
        config.max_position_embeddings = L
        model = AutoModelForCausalLM.from_pretrained(short_window, config=config, **dtype_kwargs(torch.float32)).eval()
        out[method] = token_losses(model, ids)
    return out


def check_against_stock(folder, ids, stock: dict, method: str) -> None:
    """The evaluation's losses of `method` x2 (loaded, patched in place, scored as `rope-extend eval` does) equal
    stock transformers' to float32 noise at every token, and differ from the unpatched model's past the window."""
    from rope_extend.eval.perplexity import token_losses
    from rope_extend.eval.variants import apply_spec, load_model, original_length

    model, _ = load_model(folder)
    assert original_length(model) == WINDOW
    base = token_losses(model, ids)
    apply_spec(model, SPECS[method])  # rope_extend.patch_model, in place
    assert model.config.max_position_embeddings == L
    patched = token_losses(model, ids)
    assert torch.isfinite(patched).all()
    worst = float((patched - stock[method]).abs().max())
    assert worst < 1e-4, f"{method} x2: the evaluation's losses differ from stock transformers' by up to {worst:.3g}"
    # losses[i] predicts token i+1: from index WINDOW - 1 on, every prediction is past the window
    assert float((patched[WINDOW - 1:] - base[WINDOW - 1:]).abs().mean()) > 0.01


@pytest.mark.parametrize("method", SPECS)
def test_the_evaluation_scores_what_stock_transformers_computes(short_window, ids, stock, method):
    check_against_stock(short_window, ids, stock, method)


# --- planted bugs: what the comparison catches (helpers.APPLY_BUGS: the patch applies another RoPE than it planned) --
@pytest.mark.parametrize("bug", APPLY_BUGS)
def test_a_planted_bug_fails_the_comparison(short_window, ids, stock, bug, monkeypatch):
    applied = plant_apply_bug(monkeypatch, bug)
    with pytest.raises(AssertionError, match="the evaluation's losses differ from stock transformers'"):
        check_against_stock(short_window, ids, stock, "yarn")
    assert applied == ["yarn"]  # the bug was in the patch the evaluation applied
