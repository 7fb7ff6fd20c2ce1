"""A real mlx-lm (mlx[cpu] 0.32.4 + mlx-lm 0.32.2 in its own virtualenv, `make mlx`) serving what rope-extend writes.

One worker process (`rope_extend/engines/mlx/worker.py`, under the MLX environment's Python) serves every checkpoint
of the session in turn, float32, each request through mlx-lm's own `generate_step` (the loop behind `mlx_lm.generate`)
with the card command's prefill chunks. The mlx-cpu wheel computes with a reference BLAS, so the model is the demo
model's first 2 layers with a 256-token window (`short_window`), served with Debian's OpenBLAS preloaded (conftest.py's
`mlx_worker`; `make mlx-check` runs the wheel's own): requests of 256 and 512 tokens (2x), where a RoPE
that differs moves log-probabilities by 0.1 and more. The reference is transformers running rope-extend's RoPE
(`patch_model`) on the same token ids. The port (`rope_extend/engines/mlx/port.py`) is checked against mlx-lm's own
RoPE modules for every rope type mlx-lm has; every frequency method through both card routes runs in `make mlx-check`
and on the demo model (eval/reports/mlx-engines-*).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ENGINE_SUITE, LLAMA, QWEN, BorrowedWorker, assert_records_match, offline_hub, run_audit

from rope_extend.engines.hint import COMMAND, ORIGINAL
from rope_extend.engines.mlx import port
from rope_extend.engines.mlx.engine import MLX as MLX_ROOM
from rope_extend.engines.mlx.run import MlxRefused
from rope_extend.engines.runs import LOGPROB_TOL, MEAN_TOL, compare_logprobs, linked_folder
from rope_extend.engines.served import NotServed, compare, own_rope, positions

MLX = MLX_ROOM.run
WINDOW = 256
ROUTES = ("this checkpoint", "original model + model_config")
HALF = 32  # rotary_dim / 2 of the demo model (head_dim 64)


def serving_rule(plan):
    """The MLX room's hint for `plan`."""
    from rope_extend.engines.written import Written

    return MLX_ROOM.hint(Written.of(plan))


def _plan(folder, spec: dict):
    from transformers import AutoConfig

    from rope_extend.plan import plan_patch
    from rope_extend.spec import load_spec

    return plan_patch(AutoConfig.from_pretrained(folder), load_spec(spec))


# --- without mlx-lm ----------------------------------------------------------------------------------------------------
def test_mlx_lm_reads_rope_theta_and_rope_scaling_never_rope_parameters():
    """What mlx-lm 0.32.2's llama model reads from config.json (models/llama.py ModelArgs; base.py from_dict drops
    the rest): a transformers-5 config with only `rope_parameters` is plain RoPE at base 10000; `model_config` (what
    `mlx_lm.load(path, model_config=...)` merges, utils.py:446-447) replaces a top-level key whole."""
    config = {"model_type": "llama", "hidden_size": 576, "num_attention_heads": 9, "head_dim": 64,
              "max_position_embeddings": 8192,
              "rope_parameters": {"rope_type": "yarn", "rope_theta": 100000.0, "factor": 2.0,
                                  "original_max_position_embeddings": 8192}}
    fields, rope = port.load_config(config)
    assert (fields["rope_theta"], rope) == (10000, None)
    assert "rope_parameters (rope_theta 100000.0, rope_type yarn) not read" in fields["dropped"]
    served = port.served(fields, rope, 16)
    assert "not read" in served.note and served.magnitude == 1.0
    fields, rope = port.load_config({**config, "rope_theta": 1e5, "rope_scaling": {"type": "linear", "factor": 4.0,
                                                                                   "rope_type": "yarn"}},
                                    {"rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    assert rope == {"rope_type": "linear", "factor": 2.0} and fields["rope_theta"] == 1e5
    assert fields["dropped"].endswith("mlx-lm reads rope_theta 100000.0 and rope_scaling linear")
    # `type` wins over `rope_type` (rope_utils.py:298-301)
    assert port.rope_type({"type": "linear", "rope_type": "yarn"}) == "linear"


def test_the_card_gives_mlx_lm_the_magnitude_it_does_not_read():
    """YaRN's attention_factor is not read by mlx-lm (its magnitude is get_mscale(s, mscale) / get_mscale(s,
    mscale_all_dim)): where the checkpoint's differs from 0.1 ln s + 1, the card's command is Python with the
    mscale that gives it (no CLI flag takes a model_config); where it agrees, `mlx_lm.generate --model OUT`."""
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                         num_hidden_layers=30, max_position_embeddings=8192, rope_theta=100000.0)
    from rope_extend.plan import plan_patch
    from rope_extend.spec import load_spec

    plain = serving_rule(plan_patch(config, load_spec({"method": "yarn", "factor": 4})))
    assert plain.named("OUT").command == "mlx_lm.generate --model OUT --prompt -" and not plain.warnings
    fixed = serving_rule(plan_patch(config, load_spec({"method": "yarn", "factor": 4, "attention_factor": 1.2})))
    assert fixed.named("OUT").command.startswith("model, tokenizer = mlx_lm.load('OUT', model_config={'rope_scaling'")
    scaling = fixed.route(COMMAND).settings.model_config["rope_scaling"]
    assert port.yarn_magnitude(scaling) == pytest.approx(1.2, rel=1e-12)
    assert fixed.route(ORIGINAL).settings.model_config["rope_scaling"] == scaling and not fixed.warnings
    assert any("ignores attention_factor" in note for note in fixed.notes)


def test_run_names_include_mlx():
    from rope_extend.engines.runs import eval_engines, run_names

    assert "mlx" in run_names() and "mlx" in eval_engines() and MLX.runs == {"mlx": "generate"}


def test_the_environment_module_runs_without_a_runpy_warning():
    """`python -m rope_extend.engines.mlx.env` (make mlx): the package import does not import it first."""
    proc = subprocess.run([sys.executable, "-W", "default", "-c", "import rope_extend.engines, sys; "
                           "print('rope_extend.engines.mlx.env' in sys.modules)"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr


def test_engines_long_tokens_shortens_the_long_request(short_window, capsys):
    """`engines ... --long-tokens N` (what the demo model's MLX runs use: mlx-cpu is slow): every row's long request
    is N tokens, the report says so; a length outside (L, target] is refused before anything runs."""
    from rope_extend.cli import run

    capsys.readouterr()
    assert run(["engines", str(short_window), "--method", "yarn", "--factor", "2", "--long-tokens", "384",
                "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["short_tokens"], report["long_tokens"], report["target_length"]) == (WINDOW, 384, 2 * WINDOW)
    assert {row["long"]["tokens"] for row in report["rows"] if row["long"]["served"]} == {384}
    assert run(["engines", str(short_window), "--method", "yarn", "--factor", "2", "--long-tokens", "200"]) == 2
    assert "--long-tokens 200: the long request must be longer than the original length 256" in capsys.readouterr().err


# --- the port against mlx-lm's own RoPE ----------------------------------------------------------------------------------
LONG = [1.0 + i / (HALF - 1) for i in range(HALF)]
SHORT = [1.0 + 0.5 * i / (HALF - 1) for i in range(HALF)]
PORT_CASES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 2.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64, "attention_factor": 1.2,
             "truncate": False},
    "yarn-mscale": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "mscale": 0.707,
                    "mscale_all_dim": 1.0, "beta_fast": 16},
    "deepseek_yarn": {"type": "deepseek_yarn", "factor": 2.0, "original_max_position_embeddings": 64},
    "telechat3-yarn": {"type": "telechat3-yarn", "factor": 3.0},
    "longrope": {"rope_type": "longrope", "original_max_position_embeddings": 32, "long_factor": LONG,
                 "short_factor": SHORT},
    "proportional": {"rope_type": "proportional", "factor": 2.0, "partial_rotary_factor": 0.5},
    "mrope": {"rope_type": "mrope", "mrope_section": [8, 12, 12]},
}


@pytest.mark.parametrize("prefill_step", [16, 2048])
def test_the_port_is_mlx_lm_s_own_rope(prefill_step, mlx_worker):
    """For every rope type mlx-lm 0.32.2 has (rope_utils.py initialize_rope), the port's cos/sin (magnitude included)
    equal those of mlx-lm's own RoPE module, built by its llama model from the same config.json and applied as
    `generate_step` applies it to a request of 100 tokens (the prefill chunks, the last prompt token, the generated
    one: the calls are the port's), at every position; dynamic beyond max_position_embeddings (64) differs per chunk.
    A config with only transformers 5's rope_parameters is plain RoPE at 10000 in both; an unknown type is refused by
    both in mlx-lm's words."""
    n, at = 100, positions(100)
    base = {"model_type": "llama", "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 64, "rms_norm_eps": 1e-5, "max_position_embeddings": 64, "rope_theta": 100000.0}
    checked = {}
    for name, scaling in PORT_CASES.items():
        config = {**base, "rope_scaling": scaling}
        real = mlx_worker.rope_probe(config, n, at.tolist(), prefill_step=prefill_step)
        assert mlx_worker.calls == port.calls(n, prefill_step), name
        fields, rope = port.load_config(config)
        served = port.served(fields, rope, n, prefill_step=prefill_step)
        delta = compare(served, real, n)
        assert delta.identical, (name, delta, served.note)
        checked[name] = (real.note, served.magnitude if served.inv_freq is not None else None)
    assert checked["yarn"] == ("YarnRoPE", pytest.approx(0.1 * math.log(2) + 1))  # attention_factor 1.2 not read
    assert checked["longrope"][0] == "SuScaledRoPE" and checked["dynamic"][0] == "DynamicNTKScalingRoPE"
    # the model_config route: the card's mscale fix reaches mlx-lm's YarnRoPE
    fix = {"rope_scaling": {**PORT_CASES["deepseek_yarn"], "mscale": 2.0, "mscale_all_dim": 0.0}}
    real = mlx_worker.rope_probe({**base, "rope_scaling": None}, n, at.tolist(), model_config=fix,
                                 prefill_step=prefill_step)
    served = port.served(*port.load_config({**base, "rope_scaling": None}, fix), n, prefill_step=prefill_step)
    assert served.magnitude == pytest.approx(0.2 * math.log(2) + 1) and compare(served, real, n).identical
    # transformers 5's rope_parameters alone: plain RoPE at base 10000
    only = {k: v for k, v in base.items() if k != "rope_theta"}
    only["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0}
    real = mlx_worker.rope_probe(only, n, at.tolist(), prefill_step=prefill_step)
    served = port.served(*port.load_config(only), n, prefill_step=prefill_step)
    assert real.note == "RoPE" and compare(served, real, n).identical
    assert not compare(served, port.served(*port.load_config({**base, "rope_scaling": only["rope_parameters"]}), n),
                       n).identical
    # a type mlx-lm does not know
    unknown = {**base, "rope_scaling": {"rope_type": "su", "factor": 2.0}}
    with pytest.raises(MlxRefused, match="ValueError: Unsupported RoPE type su"):
        mlx_worker.rope_probe(unknown, n, at.tolist(), prefill_step=prefill_step)
    refused = port.served(*port.load_config(unknown), n, prefill_step=prefill_step)
    assert isinstance(refused, NotServed) and "ValueError: Unsupported RoPE type su" in refused.reason


# --- the real engine ---------------------------------------------------------------------------------------------------
def test_engines_run_mlx_serves_both_card_routes_as_transformers(mlx_worker, short_window, monkeypatch, capsys):
    """`rope-extend engines SOURCE --method yarn --factor 2 --set attention_factor=1.2 --run mlx --json`: for both
    routes the card lists (this checkpoint and the original model, each loaded with the card's model_config: mlx-lm
    reads no attention_factor, the card's mscale gives it 1.2), a real mlx-lm serves what the port rows say,
    identical to transformers (within LOGPROB_TOL on every token, MEAN_TOL on average) at 256 and 512 tokens."""
    from rope_extend.cli import run

    borrowed = BorrowedWorker(mlx_worker)
    monkeypatch.setattr(MLX, "open", lambda: borrowed)  # the adapter's worker: the session's
    capsys.readouterr()
    assert run(["engines", str(short_window), "--method", "yarn", "--factor", "2", "--set", "attention_factor=1.2",
                "--run", "mlx", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert borrowed.loads == 2  # both routes were served by the real engine
    for route in ROUTES:
        port_row = next(r for r in rows if r["kind"] == "port" and r["engine"] == port.VERSION and r["route"] == route)
        got_row = next(r for r in rows if r["kind"] == "run" and r["engine"].startswith("mlx-lm")
                       and r["route"] == route)
        assert got_row["engine"].startswith("mlx-lm 0.32.2 (mlx 0.32.4, mlx-cpu") and " on cpu, " in got_row["engine"]
        assert port_row["identical"] and got_row["identical"]
        for request in ("short", "long"):
            got = got_row[request]
            assert got["served"] and got["max_abs_dlogprob"] <= LOGPROB_TOL, (route, request, got)
            assert got["mean_abs_dlogprob"] <= MEAN_TOL and got["tokens"] == {"short": WINDOW, "long": 2 * WINDOW}[request]
    assert mlx_worker.rope == "YarnRoPE"
    # the BLAS the rows name is the one the worker computes with (conftest.py's mlx_worker: OpenBLAS unless
    # ROPE_EXTEND_MLX_BLAS is set empty)
    blas = os.environ.get("ROPE_EXTEND_MLX_BLAS")
    maps = Path(f"/proc/{mlx_worker.proc.pid}/maps").read_text()
    if blas:
        assert f"BLAS {Path(blas).parent.name}/{Path(blas).name}) on cpu" in got_row["engine"]
        assert f"/{Path(blas).parent.name}/" in maps  # Debian's openblas-pthread/ (numpy brings its own OpenBLAS)
    else:
        assert "BLAS " not in got_row["engine"] and "/openblas-pthread/" not in maps


def test_a_config_with_only_rope_parameters_is_served_as_plain_rope(mlx_worker, short_window, tmp_path):
    """The trap the card's config avoids: YaRN x2 written only as transformers 5's `rope_parameters` (no top-level
    rope_theta, no rope_scaling) loads in mlx-lm as plain RoPE at base 10000, silently: the port says so, and the
    real mlx-lm's log-probabilities move by more than 0.1 against transformers serving that config.json (YaRN x2 at
    base 100000). The same RoPE written as the card writes it (rope_theta and rope_scaling too) is identical."""
    from rope_extend.engines.reference import reference, reference_model, text_ids

    plan = _plan(short_window, {"method": "yarn", "factor": 2})
    n = 200
    requests = {n: text_ids(short_window, n - 1)}
    truth = reference(reference_model(short_window, plan), plan, requests)
    config = json.loads((short_window / "config.json").read_text())
    scaling = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": WINDOW, "beta_fast": 32.0,
               "beta_slow": 1.0}
    config.update(rope_parameters={**scaling, "rope_theta": 100000.0}, max_position_embeddings=2 * WINDOW)
    card = linked_folder(short_window, {**config, "rope_theta": 100000.0, "rope_scaling": scaling}, tmp_path / "card")
    del config["rope_theta"], config["rope_scaling"]
    trap = linked_folder(short_window, config, tmp_path / "trap")
    fields, rope = port.load_config(config)
    said = port.served(fields, rope, n)
    assert (fields["rope_theta"], rope) == (10000, None) and not compare(said, own_rope(plan, n), n).identical
    mlx_worker.load(trap)
    assert mlx_worker.rope == "RoPE"  # mlx-lm built plain RoPE
    got = compare_logprobs(mlx_worker.prompt_logprobs(requests[n]), truth[n])
    assert not got.identical and got.max_abs > 0.1, got.describe()
    mlx_worker.load(card)
    assert mlx_worker.rope == "YarnRoPE"
    assert compare_logprobs(mlx_worker.prompt_logprobs(requests[n]), truth[n]).identical


def test_dynamic_differs_through_chunked_prefill_as_the_card_says(mlx_worker, short_window, tmp_path):
    """mlx-lm scales dynamic NTK at every forward call by the call's end, and the KV cache keeps earlier chunks' keys:
    the card says "identical up to L only". Served with the card's config and a prefill step of 128 (the card's
    command prefills 2048 at a time: at 512 tokens that is one chunk, so a smaller step shows the chunks here), a
    request of 256 tokens is identical, one of 512 differs by more than 0.1 nats, and the port, given the same step,
    says both; the forward calls are the port's."""
    from rope_extend.engines.reference import reference, reference_model, text_ids

    plan = _plan(short_window, {"method": "dynamic", "factor": 2})
    hint = serving_rule(plan)
    this, warnings = hint.route(COMMAND), hint.warnings
    assert any("identical up to 256 tokens only" in w for w in warnings)
    settings = dataclasses.replace(this.settings, prefill_step=128)
    ids = text_ids(short_window, 2 * WINDOW)
    requests = {WINDOW: ids[: WINDOW - 1], 2 * WINDOW: ids[: 2 * WINDOW - 1]}
    truth = reference(reference_model(short_window, plan), plan, requests)
    from rope_extend.compat import portable_config_dict

    config = portable_config_dict(json.loads((short_window / "config.json").read_text()), plan.slots,
                                  plan.max_position_embeddings, plan.marker)
    folder = linked_folder(short_window, config, tmp_path / "dynamic")
    MLX.load(mlx_worker, folder, settings, route="generate")
    assert mlx_worker.rope == "DynamicNTKScalingRoPE"
    fields, rope = port.load_config(config)
    for n, ids_n in requests.items():
        got = compare_logprobs(mlx_worker.prompt_logprobs(ids_n), truth[n])
        assert mlx_worker.calls == port.calls(n, 128)[:-1]  # the prefill chunks and the last prompt token
        said = compare(port.served(fields, rope, n, prefill_step=128), own_rope(plan, n), n)
        if n == WINDOW:
            assert said.identical and got.identical, got.describe()
        else:
            assert not said.identical and not got.identical and got.max_abs > 0.1, got.describe()


def test_an_unknown_rope_type_is_refused_in_mlx_lm_s_words(mlx_worker, short_window, tmp_path):
    config = json.loads((short_window / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "su", "factor": 2.0}
    folder = linked_folder(short_window, config, tmp_path / "su")
    with pytest.raises(MlxRefused, match="ValueError: Unsupported RoPE type su"):
        mlx_worker.load(folder)
    assert isinstance(port.served(*port.load_config(config), 16), NotServed)


# --- eval --engine mlx -------------------------------------------------------------------------------------------------
def test_eval_engine_mlx_reproduces_the_transformers_eval(mlx_worker, short_window, tmp_path):
    """`rope-extend eval --engine mlx` on the same suite as transformers: every perplexity within 1e-3 (relative),
    every probe answer the same text. mlx-lm has no window limit, so the unpatched model is served beyond its 256
    tokens too, as transformers serves it (plain RoPE): nothing is left out."""
    from rope_extend.eval.options import EvalOptions
    from rope_extend.eval.runner import run_eval

    specs = {"yarn-x2": {"method": "yarn", "factor": 2}}
    borrowed = BorrowedWorker(mlx_worker)
    got = run_eval(short_window, specs, ENGINE_SUITE, tmp_path / "mlx",
                   EvalOptions(engine="mlx", worker=borrowed, plots=False, progress=False))
    assert borrowed.loads == 2  # unpatched and yarn: each served by the real engine
    want = run_eval(short_window, specs, ENGINE_SUITE, tmp_path / "hf", EvalOptions(plots=False, progress=False))
    run = json.loads((tmp_path / "mlx" / "run.json").read_text())
    assert run["engine"].startswith("mlx-lm 0.32.2") and not run["left_out"]
    assert {(r["variant"], r["case_id"]) for r in want} == {(r["variant"], r["case_id"]) for r in got}
    assert_records_match(got, want)
    assert any(r["length"] == 2 * WINDOW and r["variant"] == "unpatched" for r in got)


@pytest.mark.parametrize("spec, why", [
    ({"method": "dynamic", "factor": 2}, "dynamic NTK scaled per forward call"),
    ({"method": "self-extend", "factor": 2}, "acts on attention"),
])
def test_eval_engine_mlx_refuses_what_mlx_lm_serves_otherwise_before_loading(spec, why, short_window, tmp_path,
                                                                            monkeypatch):
    from rope_extend.eval.options import EvalOptions
    from rope_extend.eval.runner import run_eval

    monkeypatch.setattr(MLX, "open", lambda: pytest.fail("an engine was started"))
    with pytest.raises(ValueError, match=f"MLX does not serve .* at \\d+ tokens .*{why}.*--engine transformers"):
        run_eval(short_window, [spec], ENGINE_SUITE, tmp_path / "out",
                 EvalOptions(engine="mlx", plots=False, progress=False))
    assert not (tmp_path / "out").exists()  # refused before anything was written or loaded


def test_the_recorded_runs_are_generated_from_the_records():
    """docs/serving.md's table of real mlx-lm runs and rope_extend/engines/mlx/runs.json are what
    tools/run_engines.py --summarize computes from eval/reports/mlx-engines-*/ today; one verdict is recounted from a
    raw record of `make mlx-check`, and the line a card would quote for it names the engine, its version and the
    date."""
    import importlib.util
    from pathlib import Path

    from rope_extend.engines.serving import runs_lines

    root = Path(__file__).parent.parent
    spec = importlib.util.spec_from_file_location("run_engines", root / "tools" / "run_engines.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    data = tool.summary(engine="mlx")
    stale = "stale: run python tools/run_engines.py --summarize"
    assert json.loads((root / "rope_extend" / "engines" / "mlx" / "runs.json").read_text()) == data, stale
    start, end = tool.markers("mlx")
    assert f"{start}\n{tool.docs_block(data, 'mlx')}\n{end}" in (root / "docs" / "serving.md").read_text(), stale
    records = [json.loads(line) for line in
               (root / "eval" / "reports" / "mlx-engines-tiny" / "results.jsonl").read_text().splitlines()]
    record = next(r for r in records if r["method"] == "dynamic")
    runs = [r for r in record["report"]["rows"] if r.get("kind", r.get("checked")) == "run" and r["engine"].startswith("mlx-lm")]
    assert len(runs) == 2 and {r["route"] for r in runs} == set(ROUTES)
    said = {(r["short"]["identical"], r["long"].get("identical", False)) for r in runs}
    assert said == {(True, False)}  # dynamic: identical up to L only, through both routes
    (mine,) = [r for r in data["methods"]["dynamic"] if r["model"] == "short-window"]
    assert mine["verdict"] == "up to L" == mine["port"] and mine["tokens"] == [WINDOW, 2 * WINDOW]
    (line,) = [line for line in runs_lines(MLX_ROOM, "dynamic") if "first 2 layers" in line]
    assert line.startswith("  - run (not on this checkpoint): mlx-lm 0.32.2 (mlx 0.32.4, mlx-cpu) on cpu served "
                           "`dynamic` x2") and f"on {record['finished'][:10]}: identical up to the original" in line


# --- the audit, run: a model's own RoPE (`rope-extend engines MODEL --run mlx`) -----------------------------------------
def test_audit_run_mlx_serves_llama31s_llama3_as_the_port_says(mlx_worker, tmp_path, monkeypatch, capsys):
    """Llama-3.1-8B's own llama3 RoPE (its real config.json) in a real mlx-lm: a small random-weight model of the
    config served through the audit's route (`mlx_lm.generate --model MODEL`, mlx-lm's prefill chunks) at 512 and
    1024 tokens is identical to transformers running the same config.json, as the port says. A model type the port
    does not cover (Qwen2.5's qwen2, with its YaRN x4) is run all the same: measured identical, the port's cells
    say why it has no verdict, and the verdict stays unchecked (a run at two lengths is not the port's rule)."""
    offline_hub(tmp_path, monkeypatch)
    borrowed = BorrowedWorker(mlx_worker)
    monkeypatch.setattr(MLX, "open", lambda: borrowed)
    code, data, err = run_audit([LLAMA, "--run", "mlx", "--long-tokens", "1024"], capsys)
    assert code == 0 and borrowed.loads == 1, err
    (row,) = [row for row in data["rows"] if row["served_by_engine"]]
    assert row["engine"].startswith("mlx-lm 0.32.2") and row["identical"] and row["agrees_with_port"]
    assert (row["short"]["tokens"], row["long"]["tokens"]) == (512, 1024)
    assert row["short"]["max_abs_dlogprob"] <= LOGPROB_TOL and row["long"]["mean_abs_dlogprob"] <= MEAN_TOL
    (verdict,) = [v for v in data["verdicts"] if v["engine"].startswith("mlx-lm")]
    assert verdict["identical"] and data["contradictions"] == []
    code, data, err = run_audit([QWEN, "--run", "mlx", "--long-tokens", "1024"], capsys)
    (row,) = [row for row in data["rows"] if row["served_by_engine"]]
    assert code == 0 and borrowed.loads == 2 and row["identical"] and row["agrees_with_port"], err
    port = row["port_at_measured_lengths"]["long"]
    assert port["unchecked"] and "covers its models/llama.py, not 'qwen2'" in port["reason"]
    (verdict,) = [v for v in data["verdicts"] if v["engine"].startswith("mlx-lm")]
    assert verdict["identical"] is None and "not 'qwen2'" in verdict["why"]
