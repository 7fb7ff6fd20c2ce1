"""A real SGLang (sglang 0.5.15 in its own virtualenv, `make sglang`) serving what rope-extend writes.

SGLang's own server (`python -m sglang.launch_server`, CPU engine, torch-native path, float32) is started for every
checkpoint, as the card prints it, and queried on its native `/generate` (a start takes ~20 s on 2 idle cores). The
model is the demo model's first 2 layers with a 256-token window (`short_window`), so the long request (2x) is 512
tokens and a RoPE that differs moves log-probabilities by 0.1 and more. The reference is transformers running
rope-extend's RoPE (`patch_model`) on the same token ids. The rows must say what the port rows (SGLang 0.5.23 source)
say; every method through both routes on the demo model itself runs in `make sglang-check`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
from helpers import (
    ENGINE_SUITE,
    PHI,
    BorrowedWorker,
    SglangRefused,
    assert_engine_eval_matches,
    offline_hub,
    run_audit,
    sglang_server_args,
    sglang_serving_rule,
)

from rope_extend.engines.parity import parity_many
from rope_extend.engines.registry import get_engine
from rope_extend.engines.runs import LOGPROB_TOL, MEAN_TOL, compare_logprobs, lookup

WINDOW = 256
ROUTES = ("this checkpoint", "original model + --json-model-override-args")


SGLANG = lookup("sglang")  # the adapter; the session's worker is conftest.py's `sglang_worker`
SGLANG_CONTEXT = re.compile(r"--context-length (\d+)")  # in the worker's log, the command of each start


# --- without SGLang ----------------------------------------------------------------------------------------------------
def test_the_server_is_started_as_the_card_prints_it():
    """The card's command (`python -m sglang.launch_server --model-path M --context-length N
    --json-model-override-args J`) is what the worker starts, plus the CPU engine's device and dtype and
    `--sleep-on-idle` (it changes nothing served; that the idle server then sleeps: the end of
    test_engines_run_sglang_serves_both_card_routes_as_transformers)."""
    from transformers import LlamaConfig

    from rope_extend.plan import plan_patch
    from rope_extend.spec import load_spec

    config = LlamaConfig(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                         num_hidden_layers=30, max_position_embeddings=8192, rope_theta=100000.0)
    plan = plan_patch(config, load_spec({"method": "yarn", "factor": 4, "attention_factor": 1.2}))
    hint = sglang_serving_rule(plan)
    this, original = hint.routes
    args = sglang_server_args("M", this.settings.context_length, 30000, override_args=this.settings.override_args)
    assert f"--context-length {this.settings.context_length}" in hint.command
    assert this.settings.context_length == 32768 and this.settings.env == {}  # 32768 = the written config's window
    assert hint.command.startswith("python -m sglang.launch_server")
    override = json.loads(args[args.index("--json-model-override-args") + 1])
    assert f"--json-model-override-args '{json.dumps(override, separators=(',', ':'))}'" in hint.command.replace(
        ", ", ",").replace(": ", ":")
    # the checkpoint's whole rope_parameters with the fix: SGLang 0.5.15 replaces the dict with an override's
    # ({"attn_factor": x} alone does not start: "Unknown RoPE scaling type"), 0.5.23 merges it
    assert override["rope_parameters"]["attn_factor"] == pytest.approx(1.2 / (0.1 * math.log(4) + 1))
    assert override["rope_parameters"]["rope_type"] == "yarn" and override["rope_parameters"]["rope_theta"] == 100000.0
    assert args[args.index("--device") + 1] == "cpu" and args[args.index("--dtype") + 1] == "float32"
    assert "--sleep-on-idle" in args and "--sleep-on-idle" not in hint.command  # the worker's, not the card's
    # the original model's overrides carry rope_theta inside rope_parameters (an override written only as
    # rope_scaling makes SGLang 0.5.15 drop it: test_a_rope_scaling_only_override_runs_at_the_wrong_theta)
    assert original.settings.override_args["rope_parameters"]["rope_theta"] == 100000.0


def test_run_names_include_sglang_and_unknown_ones_are_refused_before_anything_loads():
    from rope_extend.engines.runs import eval_engines, run_names

    assert "sglang" in run_names() and "sglang" in eval_engines()
    with pytest.raises(ValueError, match="--run 'sglang-offline'.*sglang"):
        parity_many([], runs=["sglang-offline"])


# --- the real engine -------------------------------------------------------------------------------------------------
def test_sglang_refuses_with_its_own_words(sglang_worker, short_window):
    """A context length beyond the config's window without SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN: SGLang does not
    start, and says why (a request longer than the context length: the end of the eval test, on its server)."""
    with pytest.raises(SglangRefused, match="SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"):
        sglang_worker.load(short_window, 2 * WINDOW)


def test_engines_run_sglang_serves_both_card_routes_as_transformers(sglang_worker, short_window, monkeypatch, capsys):
    """`rope-extend engines SOURCE --method yarn --factor 2 --set attention_factor=1.2 --run sglang --json`: for both
    routes the card lists, a real SGLang serves what the port rows (SGLang 0.5.23 source) say, identical to
    transformers (within LOGPROB_TOL on every token, MEAN_TOL on average) at 256 and 512 tokens. The explicit attention
    factor needs SGLang's attn_factor in both routes' overrides, and the checkpoint's route takes its whole
    rope_parameters (SGLang 0.5.15 replaces the dict: `{"attn_factor": x}` alone does not start). Every other method, dynamic's measured difference
    included, runs in `make sglang-check` and on the demo model (eval/reports/sglang-engines-*); that the run sees a
    RoPE that differs: the Phi-3.5 audit run below (measured DIFFERS where the port says so) and, in `make
    sglang-check`, test_a_rope_scaling_only_override_runs_at_the_wrong_theta."""
    from rope_extend.cli import run

    borrowed = BorrowedWorker(sglang_worker)
    monkeypatch.setattr(SGLANG, "open", lambda: borrowed)  # the adapter's worker: the session's
    capsys.readouterr()
    assert run(["engines", str(short_window), "--method", "yarn", "--factor", "2", "--set", "attention_factor=1.2",
                "--run", "sglang", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert borrowed.loads == 2  # both routes were served by the real engine
    for route in ROUTES:
        port = next(r for r in rows if r["kind"] == "port" and r["engine"] == "SGLang 0.5.23" and r["route"] == route)
        got_row = next(r for r in rows if r["kind"] == "run" and r["engine"].startswith("SGLang")
                       and r["route"] == route)
        assert got_row["engine"] == "SGLang 0.5.15 on cpu, server + native /generate"
        assert port["identical"] and got_row["identical"]
        for request in ("short", "long"):
            got = got_row[request]
            assert got["served"] and got["max_abs_dlogprob"] <= LOGPROB_TOL, (route, request, got)
            assert got["mean_abs_dlogprob"] <= MEAN_TOL and got["tokens"] == {"short": WINDOW, "long": 2 * WINDOW}[request]
    # the server left running (the last route's) sleeps between requests: without --sleep-on-idle SGLang's scheduler
    # polls at a full core (30 CPU-seconds in 30 idle seconds here), beside the reference and every later test
    assert _idle_cpu_seconds(sglang_worker.proc.pid, 3.0) < 0.3


def _idle_cpu_seconds(pid: int, seconds: float) -> float:
    """CPU-seconds a process and its children spend in `seconds` of waiting for a request."""
    import time

    import psutil

    def used() -> float:
        total = 0.0
        root = psutil.Process(pid)
        for proc in (root, *root.children(recursive=True)):
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system + times.children_user + times.children_system
        return total

    before = used()
    time.sleep(seconds)
    return used() - before


@pytest.mark.check  # in `make sglang-check`, with its record (eval/reports/sglang-check-trap/): one SGLang start
def test_a_rope_scaling_only_override_runs_at_the_wrong_theta(sglang_worker, short_window, tmp_path):
    """The trap the card's override avoids: `--json-model-override-args '{"rope_scaling": {yarn x2}}'` alone makes
    SGLang 0.5.15 (transformers 5.12 inside) replace rope_parameters and drop rope_theta (100000 -> 10000): the model
    serves another RoPE, where the card's override (rope_theta inside rope_parameters) serves transformers' numbers
    (the routes test above)."""
    from transformers import AutoConfig

    from rope_extend.engines.reference import reference, reference_model, text_ids
    from rope_extend.plan import plan_patch
    from rope_extend.spec import load_spec

    plan = plan_patch(AutoConfig.from_pretrained(short_window), load_spec({"method": "yarn", "factor": 2}))
    n = 2 * WINDOW
    requests = {n: text_ids(short_window, n - 1)}
    truth = reference(reference_model(short_window, plan), plan, requests)
    _, original = sglang_serving_rule(plan).routes
    # the card's override without rope_parameters: rope_scaling and the window only
    scaling_only = {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": WINDOW},
                    "max_position_embeddings": n}
    assert {k: v for k, v in original.settings.override_args.items() if k != "rope_parameters"} != scaling_only
    SGLANG.load(sglang_worker, short_window, dataclasses.replace(original.settings, override_args=scaling_only),
                route="server")
    trap = compare_logprobs(sglang_worker.prompt_logprobs(requests[n]), truth[n])
    assert not trap.identical and trap.max_abs > 0.1, trap.describe()
    # the card's override itself serves transformers' numbers on the same request: the server route of
    # test_engines_run_sglang_serves_both_card_routes_as_transformers (one SGLang start less here)


# --- eval --engine sglang --------------------------------------------------------------------------------------------


def test_eval_engine_sglang_reproduces_the_transformers_eval(sglang_worker, short_window, tmp_path):
    """`rope-extend eval --engine sglang` on the same suite as transformers: every perplexity within 1e-3 (relative),
    every probe answer the same text; the unpatched model's cases beyond its window (256) are left out."""
    from rope_extend.eval.options import EvalOptions
    from rope_extend.eval.runner import run_eval

    specs = {"yarn-x2": {"method": "yarn", "factor": 2}}
    borrowed = BorrowedWorker(sglang_worker)
    got = run_eval(short_window, specs, ENGINE_SUITE, tmp_path / "sglang",
                   EvalOptions(engine="sglang", worker=borrowed, plots=False, progress=False))
    assert borrowed.loads == 2  # unpatched and yarn: each served by the real engine
    want = run_eval(short_window, specs, ENGINE_SUITE, tmp_path / "hf",
                    EvalOptions(plots=False, progress=False))
    run = json.loads((tmp_path / "sglang" / "run.json").read_text())
    assert_engine_eval_matches(got, want, run, "SGLang 0.5.15 on cpu", WINDOW)

    # a request longer than the served context length (yarn-x2's, still loaded): refused with SGLang's message, and
    # the server keeps serving (here, not in a server of its own: one SGLang start less)
    from rope_extend.engines.reference import text_ids

    context = SGLANG_CONTEXT.search(sglang_worker.log_path.read_text().rsplit("=== ", 1)[-1])
    assert context and int(context.group(1)) >= 2 * WINDOW
    ids = text_ids(short_window, int(context.group(1)) + 10)
    with pytest.raises(SglangRefused, match=f"longer than the model's context length \\({context.group(1)} tokens\\)"):
        sglang_worker.prompt_logprobs(ids)
    assert len(sglang_worker.prompt_logprobs(ids[:100])) == 99


@pytest.mark.parametrize("spec, why", [
    ({"method": "dynamic", "factor": 2}, "SGLang 0.5.23 builds cos/sin .* static NTK"),
    ({"method": "self-extend", "factor": 2}, "acts on attention"),
])
def test_eval_engine_sglang_refuses_what_sglang_serves_otherwise_before_loading(spec, why, short_window, tmp_path,
                                                                                monkeypatch):
    from rope_extend.eval.options import EvalOptions
    from rope_extend.eval.runner import run_eval

    monkeypatch.setattr(SGLANG, "open", lambda: pytest.fail("an engine was started"))
    with pytest.raises(ValueError, match=f"SGLang does not serve .* at \\d+ tokens .*{why}.*--engine transformers"):
        run_eval(short_window, [spec], ENGINE_SUITE, tmp_path / "out",
                 EvalOptions(engine="sglang", plots=False, progress=False))
    assert not (tmp_path / "out").exists()  # refused before anything was written or loaded



def test_the_recorded_runs_are_generated_from_the_records():
    """docs/serving.md's table of real SGLang runs and rope_extend/engines/sglang/runs.json (what the card quotes) are
    what tools/run_engines.py --summarize computes from eval/reports/sglang-engines-*/ today; the card of a checkpoint
    of a recorded method names the run with the version it was checked on (0.5.15, the port follows 0.5.23)."""
    import importlib.util
    from pathlib import Path

    from rope_extend.engines.serving import runs_lines

    root = Path(__file__).parent.parent
    spec = importlib.util.spec_from_file_location("run_engines", root / "tools" / "run_engines.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    data = tool.summary(engine="sglang")
    stale = "stale: run python tools/run_engines.py --summarize"
    assert json.loads((root / "rope_extend" / "engines" / "sglang" / "runs.json").read_text()) == data, stale
    start, end = tool.markers("sglang")
    assert f"{start}\n{tool.docs_block(data, 'sglang')}\n{end}" in (root / "docs" / "serving.md").read_text(), stale
    record = next(json.loads(line) for line in
                  (root / "eval" / "reports" / "sglang-engines-smollm2" / "results.jsonl").read_text().splitlines())
    runs = [r for r in record["report"]["rows"] if r.get("kind", r.get("checked")) == "run" and r["engine"].startswith("SGLang")]
    assert len(runs) == 2 and {r["route"] for r in runs} == set(ROUTES)
    (line,) = [line for line in runs_lines(get_engine("sglang"), record["method"]) if "SmolLM2-135M through" in line]
    assert line.startswith(f"  - run (not on this checkpoint): SGLang 0.5.15 on cpu served `{record['method']}` x2")
    assert f"8192 and 16384 tokens, on {record['finished'][:10]}:" in line


# --- the audit, run: a model's own RoPE (`rope-extend engines MODEL --run sglang`) -------------------------------------
@pytest.fixture
def audited_hub(tmp_path, monkeypatch):
    return offline_hub(tmp_path, monkeypatch)


def test_audit_run_sglang_switches_phi35s_longrope_per_prefill_chunk_as_the_port_says(sglang_worker, audited_hub,
                                                                                      monkeypatch, capsys):
    """Phi-3.5's LongRoPE in a real SGLang at --context-length 131072: it picks the factors per prefill chunk (2048
    tokens on the CPU), so a 4608-token prompt keeps the short factors in its first two chunks where transformers
    rotates the whole prompt with the long ones: DIFFERS (> 0.1 nats), as the port says; a 2304-token request
    (short factors in both) is identical. With --chunked-prefill-size -1 the prompt is one batch: identical at both,
    the audit's verdict and its command (vLLM's rule differs: tests/test_vllm_engine.py)."""
    borrowed = BorrowedWorker(sglang_worker)
    monkeypatch.setattr(SGLANG, "open", lambda: borrowed)
    code, data, err = run_audit([PHI, "--run", "sglang", "--long-tokens", "4608"], capsys)
    assert code == 0 and borrowed.loads == 2, err
    runs = {row["route"]: row for row in data["rows"] if row["served_by_engine"]}
    as_is, one_batch = runs["this checkpoint"], runs["+ --chunked-prefill-size -1"]
    assert as_is["engine"].startswith("SGLang 0.5.15 on cpu") and as_is["short"]["tokens"] == 2304
    assert as_is["short"]["identical"] and not as_is["long"]["identical"] and as_is["long"]["max_abs_dlogprob"] > 0.1
    assert "chunks" in as_is["port_at_measured_lengths"]["long"]["reason"]
    assert one_batch["identical"] and one_batch["long"]["tokens"] == 4608
    assert all(row["agrees_with_port"] for row in runs.values()) and data["contradictions"] == []
    (verdict,) = [v for v in data["verdicts"] if v["engine"] == "SGLang 0.5.23"]
    assert verdict["identical"] and verdict["command"].endswith("--context-length 131072 --chunked-prefill-size -1")


