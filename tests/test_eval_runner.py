"""Before/after runner on a tiny random checkpoint: outputs, report, and resume after a crash/kill."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rope_extend.eval.options import EvalOptions
from rope_extend.eval.runner import read_results, run_eval, summary_markdown

SUITE = {
    "name": "t",
    "short_context": [200],
    "perplexity": {"lengths": [256, "2x"], "bucket_size": 64, "chunk_size": 100},
    "passkey": {"lengths": [200], "depths": [0.0, 1.0]},
    "needle": {"tasks": ["niah_single", "vt"], "lengths": [300], "num_needles": 2},
}
SPECS = [{"method": "linear", "factor": 2.0}, {"method": "yarn", "factor": 2.0}]


def _lines(path: Path) -> list[str]:
    return [ln for ln in path.read_text().splitlines() if ln.strip()]


def test_outputs(tiny_ckpt, tmp_path):
    recs = run_eval(tiny_ckpt, SPECS, SUITE, tmp_path, EvalOptions(progress=False))
    variants = {r["variant"] for r in recs}
    assert variants == {"unpatched", "linear-x2", "yarn-x2"}
    # the needles at 300 lie beyond the 256-token window: the unpatched model alone also answers them at 256
    ceiling = [r for r in recs if r["length"] == 256 and r["kind"] in ("niah_single", "vt")]
    assert len(ceiling) == 2 and {r["variant"] for r in ceiling} == {"unpatched"}
    per_variant = (len(recs) - len(ceiling)) // 3
    assert len(recs) == 3 * per_variant + 2 == len(_lines(tmp_path / "results.jsonl"))
    ppl_lengths = sorted(r["length"] for r in recs if r["kind"] == "perplexity" and r["variant"] == "unpatched")
    assert ppl_lengths == [200, 256, 512]
    assert all(r["original_length"] == 256 for r in recs)
    patched = [r for r in recs if r["variant"] == "yarn-x2"]
    assert any("patch_report" in r for r in patched)
    report = (tmp_path / "report.md").read_text()
    assert "Short-context regression" in report and "yarn-x2" in report
    for png in ("loss_vs_position.png", "passkey_heatmap.png", "retrieval_accuracy.png", "perplexity_vs_length.png"):
        assert (tmp_path / png).stat().st_size > 1000
    md = summary_markdown(tmp_path)
    assert "| 512 (beyond original)" in md and "passkey" in md
    # the patched model really differs beyond the window
    beyond = {r["variant"]: r["metrics"]["loss"] for r in recs if r["kind"] == "perplexity" and r["length"] == 512}
    assert beyond["unpatched"] != beyond["linear-x2"]


class Boom(RuntimeError):
    pass


def test_prompt_that_does_not_fit_fails_before_any_work(tiny_ckpt, tmp_path):
    bad = dict(SUITE, needle={"tasks": ["niah_multivalue"], "lengths": [120], "num_needles": 4})
    with pytest.raises(ValueError, match="refusing to truncate"):
        run_eval(tiny_ckpt, SPECS, bad, tmp_path, EvalOptions(progress=False))
    assert not (tmp_path / "results.jsonl").exists()


def test_resume_after_crash(tiny_ckpt, tmp_path):
    seen = []

    def crash_after_5(rec):
        seen.append(rec["case_id"])
        if len(seen) == 5:
            raise Boom("simulated crash")

    with pytest.raises(Boom):
        run_eval(tiny_ckpt, SPECS, SUITE, tmp_path, EvalOptions(progress=False, on_record=crash_after_5))
    first = _lines(tmp_path / "results.jsonl")
    assert len(first) == 5

    # a torn, half-written line (process killed mid-write) must be tolerated
    with open(tmp_path / "results.jsonl", "a") as f:
        f.write('{"variant": "unpatched", "fingerp')

    new = []
    recs = run_eval(tiny_ckpt, SPECS, SUITE, tmp_path, EvalOptions(progress=False, on_record=new.append))
    total = len(recs)
    assert len(new) == total - 5  # nothing recomputed ...
    lines = _lines(tmp_path / "results.jsonl")
    assert lines[:5] == first  # ... nothing lost or rewritten
    parsed = read_results(tmp_path)
    keys = [(r["variant"], r["case_id"]) for r in parsed]
    assert len(keys) == len(set(keys)) == total

    # third run: everything done, nothing computed
    again = []
    assert len(run_eval(tiny_ckpt, SPECS, SUITE, tmp_path,
                        EvalOptions(progress=False, on_record=again.append))) == total
    assert again == []

    # changing one variant's spec recomputes only that variant
    changed = []
    run_eval(tiny_ckpt, [SPECS[0], {"method": "yarn", "factor": 3.0}], SUITE, tmp_path,
             EvalOptions(progress=False, on_record=changed.append))
    assert changed and {r["variant"] for r in changed} == {"yarn-x3"}


def test_resume_refuses_records_whose_method_defaults_moved(tiny_ckpt, tmp_path):
    """The fingerprint is the spec as written; when a method's defaults change between runs (dual-chunk's
    local_window L/16 -> L/8 did), the same spec resolves to another model: resuming must refuse, not pool."""
    suite = {"name": "t", "short_context": [200], "passkey": {"lengths": [200], "depths": [0.0, 1.0]}}
    spec = {"method": "dual-chunk", "factor": 2.0}
    run_eval(tiny_ckpt, [spec], suite, tmp_path, EvalOptions(include_baseline=False, progress=False))
    path = tmp_path / "results.jsonl"
    recs = [json.loads(ln) for ln in _lines(path)]
    first = next(r for r in recs if "patch_report" in r)
    resolved = first["patch_report"]["spec"]
    assert resolved["local_window"] == 256 // 8  # dual-chunk's default (L // 8), filled in by the plan
    new = []  # as recorded: the same parameters resume, nothing computed
    run_eval(tiny_ckpt, [spec], suite, tmp_path,
             EvalOptions(include_baseline=False, progress=False, on_record=new.append))
    assert new == []
    resolved["local_window"] = 256 // 16  # as recorded by the release before issue 51 (L // 16)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(ValueError, match=r"dual-chunk-x2.*local_window 16 then, 32 now.*--no-resume"):
        run_eval(tiny_ckpt, [spec], suite, tmp_path, EvalOptions(include_baseline=False, progress=False))
    assert [json.loads(ln) for ln in _lines(path)] == recs  # nothing appended
    redone = []
    run_eval(tiny_ckpt, [spec], suite, tmp_path,
             EvalOptions(include_baseline=False, progress=False, resume=False, on_record=redone.append))
    assert len(redone) == 2


def test_another_seed_is_other_cases_not_a_resume(tiny_ckpt, tmp_path):
    """A suite's seed picks the probes' keys: rerunning a folder with another seed must compute its prompts (with
    other keys), never resume the first seed's records as if they were done, and the seeds' records stay apart."""
    suite = {"name": "t", "short_context": [200], "passkey": {"lengths": [200], "depths": [0.0, 1.0]}}
    first = run_eval(tiny_ckpt, SPECS[:1], suite, tmp_path,
                     EvalOptions(include_baseline=False, progress=False))
    new = []
    second = run_eval(tiny_ckpt, SPECS[:1], suite | {"seed": 1}, tmp_path,
                      EvalOptions(include_baseline=False, progress=False, on_record=new.append))
    assert len(new) == len(second) == len(first) == 2
    assert [r["case_id"] for r in first] == ["passkey/filler/L200/d0/s0", "passkey/filler/L200/d1/s0"]
    assert [r["case_id"] for r in second] == [c + "/seed1" for c in ("passkey/filler/L200/d0/s0",
                                                                       "passkey/filler/L200/d1/s0")]
    assert [r["metrics"]["answers"] for r in first] != [r["metrics"]["answers"] for r in second]  # other keys
    assert len(read_results(tmp_path)) == 4
    again = []
    run_eval(tiny_ckpt, SPECS[:1], suite | {"seed": 1}, tmp_path,
             EvalOptions(include_baseline=False, progress=False, on_record=again.append))
    assert again == []  # and each seed resumes its own records


def test_resume_after_kill(tiny_ckpt, tmp_path):
    """SIGKILL a real run part-way through, then finish it."""
    script = textwrap.dedent(f"""
        import json, time, sys
        from rope_extend.eval.options import EvalOptions
        from rope_extend.eval.runner import run_eval
        suite = json.loads({json.dumps(json.dumps(SUITE))})
        run_eval({str(tiny_ckpt)!r}, None, suite, {str(tmp_path)!r},
                 EvalOptions(progress=False, on_record=lambda r: time.sleep(0.4)))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    results = tmp_path / "results.jsonl"
    deadline = time.time() + 120
    try:
        while time.time() < deadline:
            if results.exists() and len(_lines(results)) >= 2:
                break
            if proc.poll() is not None:
                pytest.fail("runner finished before it could be killed")
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    before = _lines(results)
    assert 2 <= len(before)
    new = []
    recs = run_eval(tiny_ckpt, None, SUITE, tmp_path, EvalOptions(progress=False, on_record=new.append))
    assert len(new) + len(before) == len(recs)
    assert _lines(results)[: len(before)] == before
    assert {r["variant"] for r in recs} == {"unpatched"}


def test_module_cli(tiny_ckpt, tmp_path, capsys):
    """`python -m rope_extend.eval` is `rope-extend eval` (one parser): same options, same errors."""
    from rope_extend.eval.__main__ import main
    from rope_extend.spec import parse_inline_spec as parse_spec_arg

    assert parse_spec_arg("method=yarn,factor=2,beta-fast=16") == {"method": "yarn", "factor": 2, "beta_fast": 16}
    assert parse_spec_arg("specs/a.yaml") == "specs/a.yaml"
    with pytest.raises(ValueError, match="'factor' is not key=value"):
        parse_spec_arg("method=yarn,factor")
    assert main([str(tiny_ckpt), "--suite", "nope", "--out", str(tmp_path)]) == 2
    assert "suite 'nope' not found" in capsys.readouterr().err
    assert main([str(tiny_ckpt), "--spec", "method=linear,factor=2", "--suite", "smoke", "--out", str(tmp_path),
                 "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "linear-x2" in out and (tmp_path / "report.md").is_file()
    assert not list(tmp_path.glob("*.png"))


def test_shared_forward_gives_the_same_numbers(tiny_ckpt, tmp_path):
    """One forward at the longest length serves every shorter length for static variants (same numbers as one
    forward per length), and probe prompts of one length prefill their common start once (same answers); for a
    dynamic method the shorter length really differs, so it is never shared."""
    suite = {"name": "share", "short_context": [128], "perplexity": {"lengths": [200, "2x"], "block_size": 32},
             "passkey": {"lengths": [300], "depths": [0.0, 0.5, 1.0], "samples": 2}}
    specs = [{"method": "yarn", "factor": 2.0}, {"method": "dynamic-yarn", "factor": 2.0}]
    shared = run_eval(tiny_ckpt, specs, suite, tmp_path / "shared", EvalOptions(progress=False, plots=False))
    separate = run_eval(tiny_ckpt, specs, suite, tmp_path / "separate",
                        EvalOptions(progress=False, plots=False, share=False))
    assert [r["case_id"] for r in shared] == [r["case_id"] for r in separate]
    probes = [(a, b) for a, b in zip(shared, separate) if a["kind"] == "passkey"]
    # 3 variants, 128 and 300 tokens, 6 prompts each; the unpatched model's ceiling: the same 6 at 256
    assert len(probes) == 3 * 2 * 6 + 6
    for a, b in probes:  # prompts prefilled from a shared KV prefix answer exactly as when prefilled alone
        assert a["metrics"]["output"] == b["metrics"]["output"] and a["metrics"]["score"] == b["metrics"]["score"]
    for a, b in zip(shared, separate):
        if a["kind"] != "perplexity":
            continue
        assert a["metrics"]["loss"] == pytest.approx(b["metrics"]["loss"], abs=1e-5)
        assert a["metrics"]["block_losses"] == pytest.approx(b["metrics"]["block_losses"], abs=1e-5)
        assert a["metrics"]["ppl_ci"] == pytest.approx(b["metrics"]["ppl_ci"], rel=1e-4)
        assert ("shared_forward" in a) == (a["variant"] != "dynamic-yarn-x2")
    # why dynamic methods need their own forwards: the first 128 tokens of its 512-token forward are scored
    # with the 2x-rescaled frequencies, unlike its own 128-token forward
    dyn = {r["length"]: r["metrics"] for r in shared if r["variant"] == "dynamic-yarn-x2" and r["kind"] == "perplexity"}
    first_block_long, first_block_short = dyn[512]["block_losses"][:4], dyn[128]["block_losses"]
    assert max(abs(x - y) for x, y in zip(first_block_long, first_block_short)) > 1e-4


def test_report_carries_intervals_and_sample_sizes(tiny_ckpt, tmp_path):
    suite = {"name": "rep", "smoke": True, "short_context": [200],
             "perplexity": {"texts": ["pydoc_topics", "debian_licenses"], "lengths": [256], "block_size": 32},
             "passkey": {"lengths": [200], "depths": [0.0, 1.0], "samples": 2}}
    recs = run_eval(tiny_ckpt, [{"method": "linear", "factor": 2.0}], suite, tmp_path,
                    EvalOptions(progress=False))
    ppl = [r for r in recs if r["kind"] == "perplexity"]
    assert {r["metrics"]["text"] for r in ppl} == {"pydoc_topics", "debian_licenses"}
    for r in ppl:
        m = r["metrics"]
        assert m["ppl_ci"][0] < m["ppl"] < m["ppl_ci"][1]
        assert len(m["block_losses"]) == -(-(r["length"] - 1) // 32)
    report = (tmp_path / "report.md").read_text()
    assert "**Smoke test.**" in report
    assert "Text `debian_licenses`" in report and "Text `pydoc_topics`" in report
    # k/n in every retrieval cell (2 tables x 2 variants), plus the ceiling table's all-depths row
    assert len(re.findall(r"\] \d/4 \|", report)) == 2 * 2 + 1
    assert "paired differences" in report and "| loss at 256 on debian_licenses | linear-x2 |" in report
    md = summary_markdown(tmp_path)
    assert "[" in md and "95 %" in md
    # a stopped run's report can be rebuilt from its results: same report, plus how much is missing
    from rope_extend.cli import run

    (tmp_path / "report.md").unlink()
    assert run(["eval-report", str(tmp_path)]) == 0
    assert (tmp_path / "report.md").read_text() == report
    lines = (tmp_path / "results.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "results.jsonl").write_text("".join(lines[:-3]))
    assert run(["eval-report", str(tmp_path), "--no-plots"]) == 0
    assert f"**partial run**: {len(recs) - 3} of {len(recs)} cases" in (tmp_path / "report.md").read_text()
    assert run(["eval-report", str(tmp_path / "nothing")]) == 2


def test_progress_is_one_line_per_job_when_stderr_is_not_a_terminal(tiny_ckpt, tmp_path, capsys):
    """`rope-extend eval ... 2> log` (CI, nohup, a cluster job; here pytest's capture, also not a terminal): one line
    per finished job with the elapsed time and an ETA, and one per model load; the rich bar draws nothing."""
    import warnings

    from rope_extend.cli import run

    suite = {"name": "lines", "smoke": True, "perplexity": {"lengths": [128, 256], "bucket_size": 64},
             "passkey": {"lengths": [200], "depths": [0.0, 1.0]}}
    (tmp_path / "suite.json").write_text(json.dumps(suite))
    assert not sys.stderr.isatty()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run(["eval", str(tiny_ckpt), "--spec", "method=yarn,factor=2", "--suite", str(tmp_path / "suite.json"),
                    "--no-plots", "-o", str(tmp_path / "out")]) == 0
    log = re.sub(r"\n {3,}", " ", capsys.readouterr().err)  # a wrapped line's continuations, under its prefix
    jobs = [ln for ln in log.splitlines() if ln.startswith("rope-extend: eval [") and " loading " not in ln]
    loads = [ln for ln in log.splitlines() if ln.startswith("rope-extend: eval [") and " loading " in ln]
    records = [json.loads(ln) for ln in _lines(tmp_path / "out" / "results.jsonl")]
    # static variants share one forward per text for every length, and the two passkey prompts share a prefix
    assert len(loads) == 2 and 1 < len(jobs) < len(records), log
    n = len(jobs)
    assert [ln.split("]")[0] for ln in jobs] == [f"rope-extend: eval [{k}/{n}" for k in range(1, n + 1)], log
    assert all(re.search(r"\(\d+\.\d s; \d:\d\d:\d\d elapsed, ETA \d:\d\d:\d\d\)$", ln) for ln in jobs), log
    assert jobs[-1].endswith("ETA 0:00:00)") and "\x1b[" not in log  # no rich bar (its redraws are escapes)


def test_demo_ends_with_output_serve_command_and_report(tiny_ckpt, tmp_path, capsys, monkeypatch):
    """`make demo` (`rope-extend demo`) on the tiny checkpoint and a small suite: it ends with where the checkpoint
    is, the one command to serve it, and where the report is."""
    import rope_extend.demo_model
    from rope_extend.demo import run_demo

    monkeypatch.setattr(rope_extend.demo_model, "smollm2_path", lambda: tiny_ckpt)
    suite = {"name": "demo", "smoke": True, "perplexity": {"lengths": [256, "2x"], "bucket_size": 64}}
    out = run_demo(tmp_path / "demo-out", suite)
    printed = capsys.readouterr().out
    assert out == tmp_path / "demo-out" / "smollm2-yarn-x2" and (out / "README.md").is_file()
    report = tmp_path / "demo-out" / "report" / "report.md"
    # wrapped at 80 columns between words, the serve command with shell continuations: read as the shell would
    words = " ".join(printed.replace(" \\\n", " ").split())
    assert words.endswith(f"output: {out} serve: vllm serve {out} --max-model-len 512 report: {report} (the "
                          f"comparison); {out / 'README.md'} (model card: every engine's command)") and report.is_file()


# --- issue 57 §1: the window the model serves; §4: a one-block perplexity interval ---------------------------------
LLAMA3_X8 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
             "original_max_position_embeddings": 64, "rope_theta": 10000.0}


def test_a_shipped_scheme_is_measured_against_the_window_it_serves(tmp_path):
    """A tiny model shipping llama3 x8 over 64 (max_position_embeddings 512): the suite's 1x and 2x are 512 and
    1024 tokens, the report says 512 (naming the pre-scaling 64), and only 1024 is beyond the window (it said
    "original context window: 64 tokens" and "128 (beyond original)")."""
    from rope_extend.eval.toy_models import tiny_llama, tiny_tokenizer

    folder = tmp_path / "llama3-x8"
    tok = tiny_tokenizer()
    model = tiny_llama(len(tok), 512, rope_parameters=dict(LLAMA3_X8))
    assert model.config.max_position_embeddings == 512
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    suite = {"name": "w", "short_context": [], "perplexity": {"lengths": ["1x", "2x"], "bucket_size": 256,
                                                               "chunk_size": 256}}
    recs = run_eval(folder, None, suite, tmp_path / "r", EvalOptions(progress=False, plots=False))
    assert sorted(r["length"] for r in recs) == [512, 1024] and {r["original_length"] for r in recs} == {512}
    meta = json.loads((tmp_path / "r" / "run.json").read_text())
    assert (meta["original_length"], meta["pre_scaling_length"], meta["shipped_scheme"]) == (512, 64, "llama3 x8")
    report = (tmp_path / "r" / "report.md").read_text()
    assert ("original context window: 512 tokens (the window the model serves: llama3 x8 over a pre-scaling 64"
            in report), report
    assert "| 1k (beyond original)" in report and "512 (beyond original)" not in report
    assert "128 (beyond original)" not in report and "64 tokens" not in report


def test_llama_3_1_suite_is_planned_from_its_131072_token_window(tmp_path):
    """The real Llama-3.1-8B config in a Hub-shaped cache (no weights read): the paper suite's 1x/2x perplexity and
    1.5x/2x passkey lengths count from 131072, not llama3's 8192; only lengths above 131072 are labelled beyond the
    original; the ceiling is the window itself."""
    import hubcache

    from rope_extend.eval.report import len_label
    from rope_extend.eval.runner import config_window
    from rope_extend.eval.suite import load_suite

    snapshot = hubcache.build(tmp_path / "hub", "meta-llama/Llama-3.1-8B")
    window = config_window(snapshot)
    assert (window.length, window.pre_scaling, window.scheme) == (131072, 8192, "llama3 x8")
    cases = load_suite("paper").cases(window.length)
    ppl = sorted({c.length for c in cases if c.kind == "perplexity"})
    passkey = sorted({c.length for c in cases if c.kind == "passkey" and not c.ceiling_only})
    assert ppl == [2048, 131072, 262144] and passkey == [2048, 196608, 262144]
    assert {c.length for c in cases if c.ceiling_only} == {131072}
    assert [len_label(n, window.length) for n in (16384, 131072, 262144)] == ["16k", "128k",
                                                                             "256k (beyond original)"]


def test_a_128_token_perplexity_suite_writes_its_report(tiny_ckpt, tmp_path):
    """One 128-token block: no interval (issue 66: a bootstrap of one block gave [ppl, ppl], an interval claiming
    certainty; before that it rounded beside the estimate and matplotlib refused the error bar after all the model
    work: exit 2, no report.md); the plot is drawn without a bar; and a plot that fails for any reason leaves
    report.md written, naming it."""
    suite = {"name": "b", "short_context": [128], "perplexity": {"lengths": [128], "bucket_size": 64,
                                                                  "chunk_size": 64}}
    recs = run_eval(tiny_ckpt, SPECS[:1], suite, tmp_path / "r", EvalOptions(progress=False))
    for r in recs:
        m = r["metrics"]
        assert len(m["block_losses"]) == 1
        assert "loss_ci" not in m and "ppl_ci" not in m and m["ci"] == "n = 1: no interval (one 128-token block)"
    assert (tmp_path / "r" / "perplexity_vs_length.png").stat().st_size > 1000
    assert f"{recs[0]['metrics']['ppl']:.2f} (n = 1: no interval)" in (tmp_path / "r" / "report.md").read_text()

    from rope_extend.eval import plots
    from rope_extend.eval.runner import rebuild_report

    broken = list(plots.PLOTS)
    broken[1] = (broken[1][0], broken[1][1], lambda records: 1 / 0)
    old = plots.PLOTS
    plots.PLOTS = tuple(broken)
    try:
        (tmp_path / "r" / "report.md").unlink()
        rebuild_report(tmp_path / "r")
    finally:
        plots.PLOTS = old
    report = (tmp_path / "r" / "report.md").read_text()
    assert "Perplexity vs context length: not drawn (ZeroDivisionError: division by zero)" in report
    assert "loss_vs_position.png" in report


def test_intervals_hold_their_estimate():
    from rope_extend.eval.stats import bootstrap_mean, paired_bootstrap_interval, wilson_interval

    values = [2.0000001192092896]
    assert bootstrap_mean(values, [128]) == (values[0], None, None)  # one block: no interval, not [x, x]
    est, lo, hi = paired_bootstrap_interval([1.1, 3.0, 0.2], [1.0, 1.0, 1.0], [128, 128, 5])
    assert lo <= est <= hi
    for k, n in ((0, 7), (3, 7), (7, 7), (1, 3)):
        lo, hi = wilson_interval(k, n)
        assert lo <= k / n <= hi


def test_a_model_without_a_tokenizer_is_one_line_naming_the_folder_and_files(tmp_path, capsys):
    """issue 57 §8: transformers' own message ("Couldn't instantiate the backend tokenizer ...") named neither the
    model nor the missing files, and came after run.json was written."""
    from rope_extend.cli import run
    from rope_extend.eval.toy_models import tiny_llama

    folder = tmp_path / "no-tokenizer"
    tiny_llama(1000, 256).save_pretrained(folder)
    capsys.readouterr()  # transformers' save progress
    assert run(["eval", str(folder), "-o", str(tmp_path / "r"), "--suite", "smoke"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"rope-extend: error: {folder}: no tokenizer transformers can load (it "
                                               "has none of tokenizer.json, tokenizer_config.json"), err
    assert "copy the tokenizer files" in err[0] and not (tmp_path / "r").exists()


# --- issue 66 item 4: eval that costs what its prompts cost; item 7: its messages -----------------------------------
def test_jobs_run_on_the_cores_other_processes_leave_free(tiny_ckpt, tmp_path, monkeypatch, capsys):
    """On a 2-core machine whose load average other processes hold at 7.9, torch's threads spin at every barrier of
    every small operation: a probe job cost 78.9 s and 25.8 s of CPU with 2 threads, 10.9 s and 3.7 s with one
    (bench/eval_case_cost.py). Every forward of the run sees one thread; torch's own count is put back after; the
    log says why."""
    import torch

    from rope_extend.eval import cpu_threads
    from rope_extend.eval.variants import load_model

    seen = []

    def loader():
        model, tok = load_model(tiny_ckpt)
        model.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
        return model, tok

    monkeypatch.setattr(cpu_threads.os, "getloadavg", lambda: (7.9, 7.5, 6.1))
    monkeypatch.setattr(cpu_threads, "cpu_share", lambda: 1.0)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    suite = {"name": "t", "perplexity": {"lengths": [128], "bucket_size": 64}, "passkey": {"lengths": [200]}}
    own = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        run_eval(tiny_ckpt, [{"method": "yarn", "factor": 2.0}], suite, tmp_path / "r",
                 EvalOptions(loader=loader, plots=False))
        assert seen and set(seen) == {1}, seen
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(own)
    log = " ".join(capsys.readouterr().err.split())
    assert "torch runs on 1 of 2 CPU threads: other processes keep the other cores busy" in log
    # the rule: the cores the others leave free (this process's own use is not theirs), at least one
    assert cpu_threads.threads_for(2, 0.2, 0.0) == 2 and cpu_threads.threads_for(2, 2.1, 2.0) == 2
    assert cpu_threads.threads_for(2, 7.9, 1.0) == 1 and cpu_threads.threads_for(16, 4.2, 0.0) == 12
    assert cpu_threads.threads_for(2, 30.0, 0.0, share=2 / 64) == 1 and cpu_threads.threads_for(4, 8.0, 0, 4 / 64) == 4


def test_rerunning_a_finished_eval_says_so_at_once(tiny_ckpt, tmp_path, capsys):
    """The new user's rerun of a finished smoke eval sat 45 s in silence: the first line now says that every case is
    done, before torch or transformers load (in a fresh interpreter), and nothing runs."""
    out = tmp_path / "r"
    suite = tmp_path / "s.json"
    suite.write_text(json.dumps({"name": "s", "perplexity": {"lengths": [128], "bucket_size": 64},
                                 "passkey": {"lengths": [200], "depths": [0.0, 1.0]}}))
    args = ["eval", str(tiny_ckpt), "--spec", "method=yarn,factor=2", "--suite", str(suite), "--no-plots", "-o", str(out)]
    from rope_extend.cli import run

    assert run(args) == 0
    before = read_results(out)
    code = ("import sys, json\nfrom rope_extend.cli import run\nimport rope_extend.eval.runner as r\n"
            "said = []\nsay = r.say\n"
            "def first(message, *a):\n    said.append((message, 'torch' in sys.modules))\n    say(message, *a)\n"
            f"r.say = first\ncode = run({args!r})\nprint(json.dumps([code, said]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "80"})
    code, said = json.loads(proc.stdout.strip().splitlines()[-1])
    assert code == 0, proc.stderr[-2000:]
    message, torch_loaded = said[0]
    assert message == f"{len(before)} of {len(before)} cases done in {out / 'results.jsonl'}: nothing to run, rewriting the report"
    assert not torch_loaded
    assert "rope-extend: eval [" not in proc.stderr  # no job ran
    assert read_results(out) == before


@pytest.mark.parametrize("columns", [60, 72, 80])
def test_progress_lines_never_break_inside_a_value(columns, monkeypatch, capsys):
    """A log file's progress lines (stderr not a terminal) wrap between values at $COLUMNS, each continuation under
    the prefix: a variant's name with a space, a case id, "12.3 s", "0:01:02 elapsed" and "ETA 0:00:31" stay whole
    (at 60-80 columns they were cut wherever the terminal cut them)."""
    from rope_extend.eval.jobs import Job
    from rope_extend.eval.runner import LineProgress
    from rope_extend.eval.suite import Suite
    from rope_extend.eval.variants import Variant

    monkeypatch.setenv("COLUMNS", str(columns))
    cases = Suite.from_dict({"needle": {"tasks": ["niah_multivalue"], "lengths": [12288],
                                        "haystacks": ["pydoc_topics"]}}).cases(8192)
    job = Job(Variant("trained yarn-x2", None), tuple(cases[-2:]))
    lines = LineProgress([job, job])
    lines.loading("trained yarn-x2")
    lines.finished(job, 12.345)
    err = capsys.readouterr().err
    physical = err.splitlines()
    assert all(len(line) <= columns for line in physical), physical
    assert all(line.startswith(("rope-extend: eval ", " " * 10)) for line in physical), physical
    values = ["trained yarn-x2:", cases[-2].case_id, "+1 cases", "(12.3 s;"]
    assert all(any(value in line for line in physical) for value in values), physical
    assert re.search(r"\d:\d\d:\d\d elapsed", err) and re.search(r"ETA \d:\d\d:\d\d", err)


@pytest.mark.parametrize("columns", [60, 80])
def test_the_terminal_bar_keeps_every_value_whole(columns):
    """On a terminal, rich's bar at 60-80 columns: the variant, the share done, the elapsed time and the ETA whole
    (rich cut them to "… E…" when the case id did not fit beside a 40-column bar)."""
    import io

    from rich.console import Console

    from rope_extend.eval.runner import progress_bar

    buffer = io.StringIO()
    console = Console(file=buffer, width=columns, force_terminal=True, color_system=None)
    progress = progress_bar(True, len("trained yarn-x2: loading"), console=console)
    progress.start()
    task = progress.add_task("trained yarn-x2", total=10, case="niah_multivalue/pydoc_topics/L12288/s3")
    progress.advance(task, 3)
    progress.refresh()
    progress.stop()
    frame = buffer.getvalue().split("\r")[-1]
    assert "…" not in frame and "trained yarn-x2" in frame and "30%" in frame
    assert re.search(r"\d:\d\d:\d\d ETA (\d:\d\d:\d\d|-:--:--)", frame), frame
