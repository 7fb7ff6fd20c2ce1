"""`rope-extend tune`: the search machinery on tiny models, a spec round trip through stock transformers, and one
smoke test on the demo model's first 2 layers (the whole demo model: `make train-check`).

Planted optimum: text is *sampled* from a tiny model patched with a chosen ("planted") spec, so that spec is the
model that generated the text and minimises the expected loss; the search must return it.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import tiny
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rope_extend import patch_model, unpatch_model
from rope_extend.cli import run
from rope_extend.dynamic import fixed_rope_length
from rope_extend.eval.perplexity import token_losses_unchunked
from rope_extend.tune import heldout as ho
from rope_extend.tune.objective import CalibrationObjective, eval_cost
from rope_extend.tune.search import plan_schedule, rung_lengths, tune
from rope_extend.tune.space import closed_form_grid, curve_factors, geometry_of, per_dim_moves

L, N, V = 32, 256, 64
ROOT = Path(__file__).resolve().parents[1]


def planted_model():
    """A tiny llama whose attention depends strongly on position (low base, large init)."""
    cfg = AutoConfig.for_model(
        "llama", hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2,
        intermediate_size=128, vocab_size=V, max_position_embeddings=L, head_dim=16, rope_theta=100.0,
        initializer_range=0.3, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()


def sample_text(model, spec, n=N, seed=0) -> torch.Tensor:
    """n tokens sampled from `model` patched with `spec` (the planted optimum of the loss on this text). Dynamic
    methods (longrope) are held at n tokens, the scale a forward over the whole text uses."""
    patch_model(model, spec)
    try:
        gen = torch.Generator().manual_seed(seed)
        ids, past, nxt = [1], None, torch.tensor([[1]])
        with torch.no_grad(), fixed_rope_length(model, n):
            for _ in range(n - 1):
                out = model(nxt, past_key_values=past, use_cache=True,
                            position_ids=torch.tensor([[len(ids) - 1]]))
                past = out.past_key_values
                token = int(torch.multinomial(torch.softmax(out.logits[0, -1].double(), -1), 1, generator=gen))
                ids.append(token)
                nxt = torch.tensor([[token]])
    finally:
        unpatch_model(model)
    return torch.tensor(ids)


@pytest.fixture(scope="module")
def planted_closed():
    model = planted_model()
    planted = next(c for c in closed_form_grid(geometry_of(model, N)) if c.name == "ntk-by-parts x8")
    return model, planted, sample_text(model, planted.spec)


def test_search_finds_a_planted_closed_form(planted_closed):
    model, planted, ids = planted_closed
    result = tune(model, N, ids, budget=6, knots=0, progress=False)
    assert result.winner.candidate.name == planted.name
    # the winner's logged loss is the independent full-logits loss of the planted spec beyond L
    patch_model(model, planted.spec)
    ref = float(token_losses_unchunked(model, ids[:N])[L - 1 :].double().mean())
    unpatch_model(model)
    assert result.winner.loss == pytest.approx(ref, rel=1e-5)


def test_search_finds_a_planted_per_dim_curve():
    model = planted_model()
    geom = geometry_of(model, N)
    seed = next(c for c in closed_form_grid(geom) if c.name == "ntk-by-parts x8")
    # the planted curve: the slowest knot of the seed moved up (what LongRoPE finds: slow dims beyond s)
    planted = next(c for c in per_dim_moves(geom, seed.name, seed.spec, knots=4, step=0.5) if "knot3+" in c.name)
    ids = sample_text(model, planted.spec)
    result = tune(model, N, ids, budget=6, knots=4, step=0.5, methods=["ntk-by-parts"],
                  progress=False)
    assert result.winner.candidate.family == "per-dim"
    assert result.winner.candidate.spec["long_factor"] == planted.spec["long_factor"]
    assert result.winner.candidate.spec["attention_factor"] == planted.spec["attention_factor"]
    # the curve is >= 1 and non-decreasing from fast to slow dimensions, and short factors are all 1
    lf = result.winner.candidate.spec["long_factor"]
    assert all(f >= 1 for f in lf) and all(b >= a for a, b in zip(lf, lf[1:]))
    assert result.winner.candidate.spec["short_factor"] == [1.0] * (geom.rotary_dim // 2)


def test_curves_are_monotone_and_seed_exact():
    seed = torch.tensor([1.0, 1.0, 1.2, 1.9, 2.0, 2.0, 2.0, 2.0], dtype=torch.float64)
    assert curve_factors(seed, [0.0] * 4) == pytest.approx(seed.tolist())
    moved = curve_factors(seed, [-1.0, 0.3, -0.8, 0.2])
    assert all(f >= 1 for f in moved) and all(b >= a for a, b in zip(moved, moved[1:]))


def test_search_is_deterministic(planted_closed):
    model, _, ids = planted_closed
    a = tune(model, N, ids, budget=4, knots=4, progress=False)
    b = tune(model, N, ids, budget=4, knots=4, progress=False)
    assert [(s.candidate.key, s.loss) for s in [a.winner, a.best_closed, a.best_per_dim]] == [
        (s.candidate.key, s.loss) for s in [b.winner, b.best_closed, b.best_per_dim]
    ]
    assert sorted(a.candidates) == sorted(b.candidates)


@pytest.mark.parametrize("budget", [1.5, 2.5, 4, 7.3, 12])
def test_budget_is_respected(planted_closed, budget, tmp_path):
    model, _, ids = planted_closed
    result = tune(model, N, ids, budget=budget, knots=4, log_path=tmp_path / "log.jsonl", progress=False)
    costs = [r["cost"] for r in result.records]
    assert sum(costs) <= budget + 1e-9
    assert result.spent == pytest.approx(sum(costs))
    # every cost is the documented (n/N)^1.5 of the rung length, and the final rung is the target length
    assert all(r["cost"] == pytest.approx(eval_cost(r["length"], N)) for r in result.records)
    assert max(r["length"] for r in result.records) == N


def test_too_small_budget_is_refused():
    with pytest.raises(ValueError, match="budget 0.5 is too small"):
        plan_schedule(0.5, rung_lengths(L, N), N)


def test_schedule_halves():
    rungs, keeps = plan_schedule(12, rung_lengths(8192, 16384), 16384)
    assert rungs[0] == 12288 and rungs[-1] == 16384
    assert keeps == sorted(keeps, reverse=True) and keeps[-1] == 2
    assert sum(k * eval_cost(n, 16384) for n, k in zip(rungs, keeps)) <= 12


WORKER = textwrap.dedent(
    """
    import sys, time, torch
    sys.path.insert(0, {tests!r})
    import test_tune as t
    from rope_extend.tune.objective import CalibrationObjective
    from rope_extend.tune.search import tune
    model = t.planted_model()
    ids = torch.load({ids!r})
    slow = float(sys.argv[1])
    class Slow(CalibrationObjective):
        def __call__(self, cand, length):
            time.sleep(slow)
            return super().__call__(cand, length)
    res = tune(model, t.N, ids, budget=4, knots=4, log_path={log!r}, objective=Slow(model, ids, t.L), progress=True)
    print("WINNER", res.winner.candidate.key, repr(res.winner.loss))
    """
)


def test_resume_after_kill(planted_closed, tmp_path):
    _, _, ids = planted_closed
    torch.save(ids, tmp_path / "ids.pt")
    log = tmp_path / "out" / "search.jsonl"
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(tests=str(ROOT / "tests"), ids=str(tmp_path / "ids.pt"), log=str(log)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script), "0.3"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while time.time() < deadline:
        if log.exists() and len(log.read_text().splitlines()) >= 4:  # header + 3 evaluations
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = len(log.read_text().splitlines()) - 1
    assert 3 <= done_before
    with open(log, "a") as fh:  # a line cut mid-write by the kill
        fh.write('{"kind": "eval", "key": "abc')
    second = subprocess.run([sys.executable, str(script), "0"], env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    fresh = [line for line in second.stderr.splitlines() if line.startswith("[tune") and "(from log)" not in line]
    reused = [line for line in second.stderr.splitlines() if "(from log)" in line]
    assert len(reused) == done_before
    records = [json.loads(line) for line in log.read_text().splitlines()[1:]]
    assert len(records) == done_before + len(fresh)
    assert len({(r["key"], r["length"]) for r in records}) == len(records)  # nothing evaluated twice
    # the result equals an uninterrupted run
    ref = tune(planted_model(), N, ids, budget=4, knots=4, progress=False)
    assert f"WINNER {ref.winner.candidate.key} {ref.winner.loss!r}" in second.stdout


def test_log_from_other_settings_is_refused(planted_closed, tmp_path):
    model, _, ids = planted_closed
    tune(model, N, ids, budget=2.5, knots=4, log_path=tmp_path / "log.jsonl", progress=False)
    with pytest.raises(ValueError, match="budget"):
        tune(model, N, ids, budget=3, knots=4, log_path=tmp_path / "log.jsonl", progress=False)


def test_per_dim_spec_round_trip_through_patch_and_stock_transformers(tmp_path):
    """The per-dim result (longrope, short factors 1) patches with `rope-extend patch --config` and loads in stock
    transformers (this line, and the other one when ROPE_EXTEND_OTHER_PYTHON is set) to the same logits, below
    and beyond the original window (where longrope switches to the long factors)."""
    source = tmp_path / "src"
    tiny.make_model("llama").save_pretrained(source)
    model = tiny.make_model("llama")
    geom = geometry_of(model, tiny.SEQ)
    seed = next(c for c in closed_form_grid(geom) if c.name.startswith("yarn x"))
    cand = per_dim_moves(geom, seed.name, seed.spec, knots=4, step=0.3)[3]
    spec = {**cand.spec, "original_max_position_embeddings": tiny.ORIGINAL}
    from rope_extend.tune.runner import spec_yaml

    (tmp_path / "tuned.yaml").write_text(spec_yaml(spec, "test"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run(["patch", str(source), "--config", str(tmp_path / "tuned.yaml"), "-o", str(tmp_path / "out")]) == 0
        patch_model(model, spec)
    long_ids, short_ids = tiny.input_ids(), tiny.input_ids(tiny.ORIGINAL)
    with torch.no_grad():
        expected = [model(long_ids).logits, model(short_ids).logits]
    unpatch_model(model)
    with torch.no_grad():
        original_short = model(short_ids).logits
    # inside the window the tuned model is the original up to the attention factor on cos/sin
    assert not torch.equal(expected[0][:, : tiny.ORIGINAL], expected[1])  # long factors used beyond L
    pythons = [sys.executable] + ([os.environ["ROPE_EXTEND_OTHER_PYTHON"]] if os.environ.get("ROPE_EXTEND_OTHER_PYTHON") else [])
    for python in pythons:
        got = tiny.stock_logits([(tmp_path / "out", long_ids), (tmp_path / "out", short_ids)], tmp_path / "w", python)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    # with attention factor 1 the short range is exactly the original model
    spec1 = {**spec, "attention_factor": 1.0}
    patch_model(model, spec1)
    with torch.no_grad():
        torch.testing.assert_close(model(short_ids).logits, original_short, rtol=0, atol=0)
    unpatch_model(model)


def test_heldout_shares_forwards_exactly_and_reuses_unpatched_inside_window(tmp_path):
    model = planted_model()
    ids = torch.randint(3, V, (N,), generator=torch.Generator().manual_seed(3))
    variants = [ho.HeldoutVariant("unpatched", None), ho.HeldoutVariant("yarn x8", {"method": "yarn", "factor": 8}),
                ho.HeldoutVariant("dynamic x8", {"method": "dynamic", "factor": 8}),
                ho.HeldoutVariant("tuned closed: yarn x8", {"method": "yarn", "factor": 8.0, "original_max_position_embeddings": L})]
    recs = ho.compare(model, ids, variants, L, N, windows=(16,), block=8, log_path=tmp_path / "h.jsonl",
                      progress=False)
    # static: the first 16 positions of the N-token forward equal a separate 16-token forward
    patch_model(model, {"method": "yarn", "factor": 8})
    sep = token_losses_unchunked(model, ids[:16]).double()
    unpatch_model(model)
    assert sum(recs[1]["inside_16"]["sums"]) == pytest.approx(float(sep.sum()), rel=1e-6)
    assert recs[1]["shared_forward"] and not recs[2]["shared_forward"]
    # a tuned closed form equal to a default is not evaluated twice
    assert recs[3]["same_as"] == "yarn x8" and recs[3]["beyond"] == recs[1]["beyond"]
    # dynamic NTK below the window is the original model: reused, and equal to a real evaluation
    assert recs[2]["reused_unpatched"] == [16, L]
    patch_model(model, {"method": "dynamic", "factor": 8})
    dyn = token_losses_unchunked(model, ids[:L]).double()
    unpatch_model(model)
    assert sum(recs[2][f"inside_{L}"]["sums"]) == pytest.approx(float(dyn.sum()), rel=1e-6)
    # the bootstrap interval contains the point estimate and the paired difference to itself is zero
    ppl, lo, hi = ho.ppl_interval(recs[1]["beyond"])
    assert lo <= ppl <= hi and ppl == pytest.approx(math.exp(sum(recs[1]["beyond"]["sums"]) / (N - L)))
    assert ho.relative_interval(recs[1]["beyond"], recs[1]["beyond"]) == (0.0, 0.0, 0.0)


@pytest.mark.slow
def test_smoke_on_the_demo_layers(short_window, tmp_path):
    """The demo model's first 2 layers with a 256-token window (`short_window`; its weights really handle 8k, so no
    quality claim here): the search runs both families at 512 tokens and logs the winner's true loss beyond 256.
    The same on the whole demo model (window pretended to be 512, 1024 tokens) is `make train-check`'s
    (tests/checks/test_train_smollm2_long.py)."""
    from rope_extend.eval.perplexity import tokenize_text
    from rope_extend.eval.texts import load_text
    from rope_extend.eval.variants import load_model

    model, tok = load_model(short_window)
    ids = tokenize_text(tok, load_text(None))[:512]
    result = tune(model, 512, ids, budget=3.3, knots=4, progress=False, log_path=tmp_path / "log.jsonl")
    assert result.best_per_dim is not None and result.best_closed is not None
    obj = CalibrationObjective(model, ids, 256)
    patch_model(model, result.winner.candidate.spec)
    ref = float(token_losses_unchunked(model, ids[:512])[255:].double().mean())
    unpatch_model(model)
    assert result.winner.loss == pytest.approx(ref, rel=1e-4)
    assert obj(result.winner.candidate, 512).loss == pytest.approx(result.winner.loss, rel=1e-6)


def test_cli_tune_end_to_end_and_rerun_resumes(smollm2_path, tmp_path, capsys):
    """`rope-extend tune` on a tiny llama with the SmolLM2 tokenizer: specs, report, held-out table; a rerun
    evaluates nothing again."""
    from transformers import AutoTokenizer

    from rope_extend.spec import load_spec

    tok = AutoTokenizer.from_pretrained(str(smollm2_path))
    cfg = AutoConfig.for_model(
        "llama", hidden_size=32, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1,
        intermediate_size=64, vocab_size=len(tok), max_position_embeddings=64, head_dim=16, rope_theta=10000.0,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    args = ["tune", str(tmp_path / "m"), "--target-length", "256", "--budget", "4", "--knots", "4",
            "--heldout", "licenses", "-o", str(tmp_path / "out")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run(args) == 0
    err = capsys.readouterr().err
    out = tmp_path / "out"
    for name in ("best.yaml", "best-closed.yaml", "best-per-dim.yaml", "report.md", "objective.png", "curve.png"):
        assert (out / name).is_file(), name
    per_dim = load_spec(out / "best-per-dim.yaml")
    assert per_dim.method == "longrope" and set(per_dim.short_factor) == {1.0}
    report = (out / "report.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ") and " [" in line]
    assert len(rows) == 9  # unpatched, 6 closed forms at defaults, tuned closed, tuned per-dim
    n_evals = len([line for line in err.splitlines() if line.startswith("[tune ")])
    # progress on a stderr that is not a terminal: one line per evaluation and per held-out variant, each with the
    # elapsed time and an ETA
    progress = [line for line in err.splitlines() if line.startswith(("[tune ", "[heldout "))]
    assert n_evals and len(progress) > n_evals, err
    assert all(re.search(r"\| \d:\d\d:\d\d elapsed, ETA (\d:\d\d:\d\d|\?)$", line) for line in progress), err
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run(args) == 0
    err = capsys.readouterr().err
    tune_lines = [line for line in err.splitlines() if line.startswith("[tune ")]
    assert len(tune_lines) == n_evals and all("(from log)" in line for line in tune_lines)
    # the held-out text is refused as calibration text
    assert run(["tune", str(tmp_path / "m"), "--target-length", "256", "--text", str(out / "report.md"),
                "--heldout", str(out / "report.md"), "-o", str(tmp_path / "o2")]) == 2


def test_pinned_attention_factor_keeps_the_window_exact(planted_closed, tmp_path):
    """`attention_factor=1`: every per-dimension candidate carries exactly 1 (never moved), the search still
    moves the curve, and the tuned spec inside the window is bit-identical to the original model."""
    model, _, ids = planted_closed
    result = tune(model, N, ids, budget=4, knots=4, progress=False, attention_factor=1.0,
                  log_path=tmp_path / "log.jsonl")
    per_dim = [c for c in result.candidates.values() if c.family == "per-dim"]
    assert len(per_dim) >= 2 and {c.spec["attention_factor"] for c in per_dim} == {1.0}
    assert len({tuple(c.spec["long_factor"]) for c in per_dim}) == len(per_dim)  # distinct curves searched
    assert any("pinned" in c.name for c in per_dim)  # the seed's curve at the pinned factor is evaluated
    # the pin is part of the log's settings: a run without it does not resume this log
    with pytest.raises(ValueError, match="attention_factor"):
        tune(model, N, ids, budget=4, knots=4, progress=False, log_path=tmp_path / "log.jsonl")
    with pytest.raises(ValueError, match="attention_factor"):
        tune(model, N, ids, budget=4, knots=4, progress=False, attention_factor=0.0)
    spec = result.spec("best_per_dim")
    short = ids[:L].reshape(1, -1)
    with torch.no_grad():
        original = model(short).logits
        patch_model(model, spec)
        try:
            pinned = model(short).logits
        finally:
            unpatch_model(model)
    torch.testing.assert_close(pinned, original, rtol=0, atol=0)


@pytest.mark.parametrize("spec", [{"method": "dynamic", "factor": 2.0},
                                  {"method": "longrope", "factor": 2.0, "short_factor": [1.0] * 8,
                                   "long_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.4, 2.8, 3.0]}])
def test_heldout_passkey_shares_prefixes_exactly(spec):
    """The held-out passkey prompts reuse each other's KV prefix; for dynamic methods too (one length, one scale
    per request), the answers equal those of prompts run one by one."""
    from rope_extend.eval.probes import make_passkey, run_probe
    from rope_extend.eval.toy_models import tiny_llama, tiny_tokenizer

    tok = tiny_tokenizer()
    model = tiny_llama(max_position_embeddings=256, head_dim=16)
    patch_model(model, spec)
    try:
        shared = ho.passkey(model, tok, 400, samples=4)
        alone = [run_probe(model, tok, make_passkey(tok, 392, depth=(i + 0.5) / 4, index=i))["output"]
                 for i in range(4)]
    finally:
        unpatch_model(model)
    assert shared["outputs"] == alone
    assert len(shared["scores"]) == 4 and shared["accuracy"] == sum(shared["scores"]) / 4


def test_heldout_table_gives_passkey_with_its_wilson_interval_and_n():
    from rope_extend.tune.report import heldout_markdown, heldout_rows

    blocks = {"sums": [2.0, 2.2, 1.9], "counts": [10, 10, 10]}
    scores = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    rec = {"name": "unpatched", "spec": None, "beyond": blocks, "whole": blocks,
           "passkey": {"accuracy": 0.3, "scores": scores}}
    table = heldout_markdown(heldout_rows([rec], n_boot=50), 32, 64)
    # Wilson 95 % for 3/10 (Newcombe 1998): 0.1078 to 0.6032
    assert "30% [11%, 60%] 3/10" in table
