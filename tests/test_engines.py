"""The engine ports against independent references, every method x engine row of the parity report, the serving
hints, `rope-extend engines`, the model card section and the table in docs/serving.md.

References: transformers' own `ROPE_INIT_FUNCTIONS` (via the config stock transformers builds from the written
config.json) and closed-form formulas from the engines' sources (llama.cpp's magnitude rule, SGLang's static NTK).
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from pathlib import Path

import pytest
import tiny
import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from rope_extend import compat
from rope_extend.cli import run
from rope_extend.engines.hint import COMMAND, ORIGINAL
from rope_extend.engines.llama_cpp import port as llama_cpp
from rope_extend.engines.parity import parity_many, serving_table
from rope_extend.engines.registry import ported_engines
from rope_extend.engines.served import NotServed, Served, compare, default_inv_freq
from rope_extend.engines.serving import engine_hints, serving_hints
from rope_extend.engines.sglang import port as sglang
from rope_extend.engines.vllm import port as vllm
from rope_extend.plan import plan_patch

L, S = tiny.ORIGINAL, tiny.FACTOR
TARGET = L * S
OTHER = os.environ.get("ROPE_EXTEND_OTHER_PYTHON")


def planned(arch="llama", **spec):
    """(plan, written config.json dict, original config.json dict, the config stock transformers builds from it)."""
    config = tiny.make_config(arch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = plan_patch(config, **spec)
        stock = compat.stock_config(config, plan.slots, plan.max_position_embeddings, plan.marker)
    written = compat.portable_config_dict(config.to_dict(), plan.slots, plan.max_position_embeddings, plan.marker)
    return plan, written, config.to_dict(), stock


def hf_rope(stock, seq_len=None):
    """transformers' ROPE_INIT_FUNCTIONS for the config stock transformers loaded (the independent reference)."""
    slot = compat.read_slots(stock)
    rope_type = slot[None]["rope_type"]
    if rope_type == "default":
        return compat.stock_rope(stock, None)
    fn = ROPE_INIT_FUNCTIONS[rope_type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(stock, None, seq_len=seq_len) if seq_len is not None else fn(stock, None)


def served_ref(stock, seq_len=None) -> Served:
    inv, attention = hf_rope(stock, seq_len)
    return Served(inv_freq=inv, magnitude=float(attention))


def assert_same(served, reference: Served, n=TARGET):
    assert isinstance(served, Served), served
    delta = compare(served, reference, n)
    assert delta.identical, delta


STATIC_CASES = {
    "linear": {"method": "linear", "factor": S},
    "ntk": {"method": "ntk", "factor": S},
    "llama3": {"method": "llama3", "factor": S},
    "yarn": {"method": "yarn", "factor": S},
    "yarn-truncate-false": {"method": "yarn", "factor": S, "truncate": False},
    "yarn-mscale": {"method": "yarn", "factor": S, "mscale": 0.707, "mscale_all_dim": 1.0},
    "yarn-betas": {"method": "yarn", "factor": S, "beta_fast": 64, "beta_slow": 2},
    "ntk-by-parts": {"method": "ntk-by-parts", "factor": S},
    "yarn-attention-factor": {"method": "yarn", "factor": S, "attention_factor": 1.3},
}


# --- the tolerance ---------------------------------------------------------------------------------------------------
def test_tolerance_admits_float32_noise_and_catches_real_differences():
    ref = Served(inv_freq=default_inv_freq(64, 1e5), magnitude=1.1)
    n = 32768
    noisy = Served(inv_freq=(ref.inv_freq.double() * (1 + 2e-7)), magnitude=1.1 + 1e-7)  # ~2 float32 ulps
    assert compare(noisy, ref, n).identical
    assert not compare(Served(inv_freq=ref.inv_freq, magnitude=1.1 + 1e-4), ref, n).identical
    shifted = ref.inv_freq.double().clone()
    shifted[20] *= 1 + 2e-5
    delta = compare(Served(inv_freq=shifted, magnitude=1.1), ref, n)
    assert not delta.identical and delta.worst_dim == 20


# --- vLLM ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(STATIC_CASES))
def test_vllm_port_serves_what_transformers_builds(case):
    plan, written, _, stock = planned(**STATIC_CASES[case])
    fields, rope = vllm.load_config(written)
    assert_same(vllm.served(fields, rope, TARGET, TARGET), served_ref(stock))


def test_vllm_longrope_uses_long_factors_at_every_position_once_max_model_len_exceeds_L():
    plan, written, _, stock = planned(**tiny.spec_kwargs("longrope", "llama"))
    fields, rope = vllm.load_config(written)
    long_ref, short_ref = served_ref(stock, seq_len=TARGET), served_ref(stock, seq_len=L)
    assert not torch.equal(long_ref.inv_freq, short_ref.inv_freq)
    assert_same(vllm.served(fields, rope, TARGET, L), long_ref, n=L)  # a short request gets the long factors
    assert_same(vllm.served(fields, rope, L, L), short_ref, n=L)  # only --max-model-len <= L keeps the short ones


def test_vllm_dynamic_is_the_unscaled_rope_with_an_L_row_cache():
    plan, written, original, stock = planned(method="dynamic", factor=S)
    fields, rope = vllm.load_config(written)
    assert vllm.derived_max_model_len(fields, rope) == TARGET  # vLLM accepts --max-model-len s·L ...
    short = vllm.served(fields, rope, TARGET, L)
    assert_same(short, served_ref(stock, seq_len=L), n=L)  # ... serves the original RoPE (transformers below L)
    assert torch.equal(short.inv_freq, default_inv_freq(16, 10000.0))
    assert isinstance(vllm.served(fields, rope, TARGET, L + 1), NotServed)  # ... and has no row beyond L


def test_vllm_top_level_rope_theta_override_is_ignored_and_rope_parameters_is_read():
    plan, written, original, stock = planned(method="ntk", factor=S)
    new_base = plan.slots[None]["rope_theta"]
    _, rope = vllm.load_config(original, {"rope_theta": new_base})
    assert rope["rope_theta"] == 10000.0  # the issue's finding: only the top-level form is lost
    hint = next(h for h in engine_hints(plan, "OUT") if h.engine == "vllm")
    _, rope = vllm.load_config(original, hint.route(ORIGINAL).settings.hf_overrides)
    assert rope["rope_theta"] == new_base
    _, rope = vllm.load_config(original, {"rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    assert isinstance(vllm.served({**original}, rope, TARGET, 4), NotServed)  # rope_scaling alone loses the base


# --- SGLang ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(set(STATIC_CASES) - {"ntk-by-parts", "yarn-attention-factor"}))
def test_sglang_port_serves_what_transformers_builds(case):
    plan, written, _, stock = planned(**STATIC_CASES[case])
    fields, rope = sglang.load_config(written)
    assert_same(sglang.served(fields, rope, TARGET), served_ref(stock))


@pytest.mark.parametrize("case", ["ntk-by-parts", "yarn-attention-factor"])
def test_sglang_ignores_attention_factor_and_the_hint_sets_attn_factor(case):
    plan, written, _, stock = planned(**STATIC_CASES[case])
    fields, rope = sglang.load_config(written)
    served = sglang.served(fields, rope, TARGET)
    assert served.magnitude == pytest.approx(0.1 * math.log(S) + 1, rel=1e-9)  # its own 0.1 ln s + 1
    assert served.magnitude != pytest.approx(plan.attention_factor)
    hint = next(h for h in engine_hints(plan, "OUT") if h.engine == "sglang")
    fields, rope = sglang.load_config(written, hint.route(COMMAND).settings.override_args)
    assert_same(sglang.served(fields, rope, TARGET), served_ref(stock))


def test_sglang_dynamic_is_transformers_dynamic_ntk_at_the_target_length_for_every_request():
    plan, written, _, stock = planned(method="dynamic", factor=S)
    fields, rope = sglang.load_config(written)
    at_target = served_ref(stock, seq_len=TARGET)
    assert_same(sglang.served(fields, rope, TARGET), at_target)
    assert_same(sglang.served(fields, rope, L), at_target, n=L)  # short requests too
    assert not compare(sglang.served(fields, rope, L), served_ref(stock, seq_len=L), L).identical


# --- llama.cpp -------------------------------------------------------------------------------------------------------
def test_llama_cpp_yarn_magnitude_is_the_attn_factor_key_times_its_own_mscale():
    """The design notes' measurements (llama-perplexity on SmolLM2), as the ported rule must reproduce them."""
    meta = llama_cpp.convert(tiny.make_config("llama").to_dict())
    flags = f"--rope-scaling yarn --rope-scale {S} --yarn-orig-ctx {L}"
    own = 0.1 * math.log(S) + 1
    assert llama_cpp.served(meta, flags, TARGET).magnitude == pytest.approx(own, rel=1e-6)
    assert llama_cpp.served(meta, flags + " --yarn-attn-factor 0.5", TARGET).magnitude == pytest.approx(own, rel=1e-6)
    kv = " --override-kv llama.rope.scaling.attn_factor=float:0.5"
    assert llama_cpp.served(meta, flags + kv, TARGET).magnitude == pytest.approx(0.5 * own, rel=1e-6)
    # frequencies: transformers' YaRN (truncate true), float32 iterated θ_i included
    plan, written, _, stock = planned(method="yarn", factor=S)
    assert_same(llama_cpp.served(meta, flags, TARGET), served_ref(stock))


def test_llama_cpp_converted_gguf_as_the_converter_writes_it():
    for spec in ({"method": "llama3", "factor": S}, {"method": "linear", "factor": S}):
        plan, written, _, stock = planned(**spec)
        assert_same(llama_cpp.served(llama_cpp.convert(written), f"-c {TARGET}", TARGET), served_ref(stock))
    plain = Served(inv_freq=default_inv_freq(16, 10000.0), magnitude=1.0)
    for spec in (tiny.spec_kwargs("longrope", "llama"), {"method": "dynamic", "factor": S}):
        plan, written, _, _ = planned(**spec)
        meta = llama_cpp.convert(written)
        assert "rope_freqs" not in meta and meta.get("rope.scaling.factor") is None
        assert_same(llama_cpp.served(meta, "", TARGET), plain)  # plain RoPE: the scaling is gone
    plan, written, _, _ = planned(method="ntk-by-parts", factor=S)
    meta = llama_cpp.convert(written)
    assert meta["rope.scaling.yarn_attn_factor"] == 1.0  # written, but the LLaMA architecture does not read it
    assert llama_cpp.served(meta, "", TARGET).magnitude == pytest.approx(0.1 * math.log(S) + 1, rel=1e-6)


def test_old_llama_cpp_attn_factor_hint_served_the_wrong_magnitude():
    plan, written, original, stock = planned(method="ntk-by-parts", factor=S)
    old = f"--rope-scaling yarn --rope-scale {S} --yarn-orig-ctx {L} --yarn-attn-factor {1 / (0.1 * math.log(S) + 1):.6g}"
    served = llama_cpp.served(llama_cpp.convert(original), old, TARGET)
    delta = compare(served, served_ref(stock), TARGET)
    assert not delta.identical and delta.max_cos == pytest.approx(0.1 * math.log(S), rel=1e-5)  # |m - 1| at p = 0


# --- every method x engine row ---------------------------------------------------------------------------------------
VARIANTS = [(m, tiny.spec_kwargs(m, "llama")) for m in tiny.METHODS] + [
    ("yarn-truncate-false", STATIC_CASES["yarn-truncate-false"]),
    ("yarn-mscale", STATIC_CASES["yarn-mscale"]),
    ("yarn-betas-attention", {**STATIC_CASES["yarn-betas"], "attention_factor": 1.3}),
    ("longrope-attention", {**tiny.spec_kwargs("longrope", "llama"), "attention_factor": 1.3}),
]
ENGINE_WORDS = {"transformers": "transformers", "vLLM": "vLLM", "SGLang": "SGLang", "mlx-lm": "mlx-lm",
                "llama.cpp": "llama.cpp"}
# The rows of one report: the two transformers lines, then every route of every ported engine.
ROWS = 2 + sum(len(engine.routes) for engine in ported_engines())


@pytest.fixture(scope="module")
def reports():
    config = tiny.make_config("llama").to_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dict(zip([name for name, _ in VARIANTS], parity_many([(config, spec) for _, spec in VARIANTS], other_python=OTHER)))


def _row(report, engine, route):
    return next(r for r in report.rows if r.engine.startswith(engine) and r.route.startswith(route))


def test_every_row_is_identical_or_warned_with_the_engine_and_the_reason(reports):
    assert len(reports) == len(VARIANTS)
    for name, report in reports.items():
        assert len(report.rows) == ROWS, name
        for row in report.rows:
            assert not row.unchecked, (name, row.engine, row.route)  # every engine's rules cover a LLaMA checkpoint
            if row.identical or row.skipped:
                continue
            word = next(w for key, w in ENGINE_WORDS.items() if row.engine.startswith(key))
            assert row.warnings and all(word in w for w in row.warnings), (name, row.engine, row.route)
            assert row.reasons(), (name, row.engine)
    for name in ("linear", "ntk", "yarn", "ntk-by-parts", "yarn-mscale", "yarn-betas-attention"):
        bad = [(r.engine, r.route, r.reasons()) for r in reports[name].rows if not r.identical and not r.skipped]
        assert not bad, (name, bad)


@pytest.mark.parametrize("arch", ["gemma3_text", "gpt_neox", "qwen3", "phi3", "llama_head_dim"])
def test_every_row_on_the_architecture_matrix_is_identical_or_warned(arch):
    config = tiny.make_config(arch).to_dict()
    methods = [m for m in tiny.METHODS if (arch, m) not in tiny.REFUSED]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reports = parity_many([(config, tiny.spec_kwargs(m, arch)) for m in methods], other_line=False)
    for method, report in zip(methods, reports):
        for row in report.rows:
            if row.unchecked:  # llama.cpp's and mlx-lm's ports cover the LLaMA family only: said, never "identical"
                assert row.engine.startswith(("llama.cpp", "mlx-lm")) and arch != "llama_head_dim", (arch, row.engine)
                assert "covers" in row.short.reason and not row.identical
                continue
            if method in ("linear", "ntk", "yarn", "ntk-by-parts") and not row.skipped:
                assert row.identical, (arch, method, row.engine, row.route, row.reasons())
            if not (row.identical or row.skipped):
                word = next(w for key, w in ENGINE_WORDS.items() if row.engine.startswith(key))
                assert row.warnings and all(word in w for w in row.warnings), (arch, method, row.engine, row.route)


def test_rows_the_issue_names(reports):
    dynamic = reports["dynamic"]
    for route in ("this checkpoint", "original"):
        row = _row(dynamic, "vLLM", route)
        assert row.short.identical and isinstance(row.long, NotServed)
    assert not _row(dynamic, "SGLang", "this").short.identical and _row(dynamic, "SGLang", "this").long.identical
    longrope = reports["longrope"]
    row = _row(longrope, "vLLM", "this")
    assert not row.short.identical and row.long.identical
    assert not _row(longrope, "llama.cpp", "GGUF converted").identical
    assert _row(longrope, "SGLang", "this").identical
    longrope_attention = reports["longrope-attention"]  # engines read short/long_mscale, not attention_factor
    assert _row(longrope_attention, "vLLM", "this").long.identical
    assert _row(longrope_attention, "SGLang", "this").identical and _row(longrope_attention, "SGLang", "original").identical
    llama3 = reports["llama3"]
    assert _row(llama3, "llama.cpp", "GGUF converted").identical
    assert isinstance(_row(llama3, "llama.cpp", "original").short, NotServed)
    truncate = reports["yarn-truncate-false"]
    assert not _row(truncate, "llama.cpp", "original").identical and _row(truncate, "vLLM", "this").identical
    dynamic_yarn = reports["dynamic-yarn"]
    for row in dynamic_yarn.rows:
        if not row.skipped:
            assert not row.short.identical and row.long.identical, (row.engine, row.route)
    transformers_rows = [r for r in reports["yarn"].rows if r.engine.startswith("transformers")]
    assert len(transformers_rows) == 2 and transformers_rows[0].identical
    if OTHER:
        assert transformers_rows[1].identical and not transformers_rows[1].skipped


def test_the_card_lists_no_route_its_own_check_contradicts(reports):
    """Every variant: the Serving lines the card writes (serving_hints with the report's unbacked routes) hold a
    route's command only where its port row is identical, or not checked; a row served and DIFFERS, or not served
    at the target length, is named with the check's reason and no command. The terminal's hints keep them all."""
    from rope_extend.engines.parity import unbacked_routes

    config = tiny.make_config("llama")
    seen = set()
    for name, spec in VARIANTS:
        report = reports[name]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = plan_patch(config, **spec)
        hints = {hint.title: hint for hint in engine_hints(plan, "OUT")}
        unbacked = unbacked_routes(report)
        card, _ = serving_hints(plan, "OUT", unbacked)
        terminal, _ = serving_hints(plan, "OUT")
        for row in report.rows:
            if row.serves is None:  # the reference's rows: no card line
                continue
            engine, which = row.serves
            command = hints[engine].route(which).command
            served = [not isinstance(r, NotServed) for r in (row.short, row.long)]
            if command is None:  # the card has no command for this route (e.g. llama.cpp: no flags)
                continue
            if row.identical or row.skipped or not any(served):
                assert (engine, which) not in unbacked and f"`{command}`" in card, (name, row.engine, row.route)
                continue
            seen.add((name, row.engine, row.route))
            assert f"`{command}`" not in card and f"`{command}`" in terminal, (name, row.engine, row.route)
            why = unbacked[engine, which]
            assert f": none listed: {why}" in card and ("DIFFERS" in why) == all(served), (name, row.route, why)
            assert why.endswith(")") and all(reason in why for reason in row.reasons())
    # the contradicted routes this suite meets: dynamic in vLLM (L rows), longrope and dynamic-yarn inside the window
    assert {("dynamic", vllm.VERSION, "this checkpoint"), ("longrope", vllm.VERSION, "this checkpoint"),
            ("dynamic-yarn", vllm.VERSION, "this checkpoint")} <= seen


# --- hints ------------------------------------------------------------------------------------------------------------
def test_hints_print_exact_bases_versions_and_the_fixes():
    plan, *_ = planned(method="ntk", factor=S)
    text, _ = serving_hints(plan, "OUT")
    base = plan.slots[None]["rope_theta"]
    printed = re.search(r"--rope-freq-base (\S+)`", text).group(1)
    assert len(printed.replace(".", "").lstrip("0")) >= 9 and float(printed) == pytest.approx(base, rel=1e-9)
    overrides = json.loads(re.search(r"--hf-overrides '([^']+)'", text).group(1))
    assert overrides["rope_parameters"]["rope_theta"] == overrides["rope_theta"] == base
    for version in ("vLLM 0.34.0", "SGLang 0.5.23", "llama-cpp-python 0.3.36"):
        assert version in text

    plan, *_ = planned(method="ntk-by-parts", factor=S)
    text, _ = serving_hints(plan, "OUT")
    key = 1 / (0.1 * math.log(S) + 1)
    assert f"--override-kv llama.rope.scaling.attn_factor=float:{key:.10g}" in text
    assert not re.search(r"--yarn-attn-factor [0-9]", text) and '"attn_factor"' in text  # the flag has no effect

    plan, *_ = planned(method="dynamic", factor=S)
    text, warnings_ = serving_hints(plan, "OUT")
    assert f"vllm serve OUT --max-model-len {L}`" in text and f"-c {L}" in text
    assert "convert the patched checkpoint to GGUF instead" not in text
    assert any("vLLM" in w and f"{L} rows" in w for w in warnings_)
    assert any("llama.cpp" in w and "drops 'dynamic'" in w for w in warnings_)

    plan, *_ = planned(**tiny.spec_kwargs("longrope", "llama"))
    _, warnings_ = serving_hints(plan, "OUT")
    assert any("vLLM" in w and "long factors at every position" in w for w in warnings_)
    assert any("llama.cpp" in w and "no factor tensors" in w for w in warnings_)

    plan, *_ = planned(**STATIC_CASES["yarn-truncate-false"])
    _, warnings_ = serving_hints(plan, "OUT")
    assert any("llama.cpp" in w and "truncate=false" in w for w in warnings_)


# --- CLI, card, docs ----------------------------------------------------------------------------------------------------
def test_engines_command_and_model_card(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ROPE_EXTEND_OTHER_PYTHON", raising=False)  # the other line's row is covered by `reports`
    source = tmp_path / "src"
    tiny.make_model("llama").save_pretrained(source)
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run(["patch", str(source), "--method", "ntk-by-parts", "--factor", str(S), "-o", str(out)]) == 0
    card = (out / "README.md").read_text()
    assert "## Where it serves identically" in card and "llama.cpp (llama-cpp-python 0.3.36)" in card
    ported = "rows run rope-extend's ports of those engines' RoPE code (vLLM 0.34.0, SGLang 0.5.23, mlx-lm 0.32.2, llama.cpp"
    assert ported in card  # said where "identical" is claimed, with the versions ported
    capsys.readouterr()
    assert run(["engines", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["method"] == "ntk-by-parts" and len(report["rows"]) == ROWS
    assert all(row["identical"] for row in report["rows"] if not row["reasons"] or "not run" not in row["reasons"][0])
    assert run(["engines", str(source), "--method", "longrope", "--factor", "4"]) == 2  # needs factor lists
    assert capsys.readouterr().err.count("\n") == 1
    assert run(["engines", str(source)]) == 0  # not a rope-extend checkpoint: its own RoPE audited
    assert "own rotary embedding of this config.json" in " ".join(capsys.readouterr().out.split())
    assert run(["engines", str(source), "--method", "dynamic", "--factor", "4"]) == 0
    printed = capsys.readouterr().out
    assert "differs" in printed and "warning" in printed
    assert ported in " ".join(printed.split())  # the table says it too


def test_engines_table_is_readable_at_80_columns(tmp_path):
    """Nothing is cut at 80 columns: long words wrap, and the reason a request was not run (the instruction naming
    ROPE_EXTEND_OTHER_PYTHON) is printed in full below the table, the table's cells pointing to it."""
    import subprocess
    import sys

    source = tmp_path / "src"
    tiny.make_model("llama").save_pretrained(source)
    env = {k: v for k, v in os.environ.items() if k != "ROPE_EXTEND_OTHER_PYTHON"} | {"COLUMNS": "80"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shown = subprocess.run([sys.executable, "-m", "rope_extend", "engines", str(source), "--method", "dynamic",
                                "--factor", str(S)], env=env, capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in shown.stdout, shown.stdout
    start = next(i for i, line in enumerate(lines) if line.startswith("engine "))
    end = next(i for i, line in enumerate(lines) if line.startswith("The transformers rows"))
    table = lines[start:end]
    for word in ("--json-model-override-args", "(llama-cpp-python", "--hf-overrides"):  # whole, never cut
        assert any(word in line.split() for line in table), (word, table)
    # a note: "[n] reason", wrapped onto lines indented by 4
    notes = [note.strip() for note in re.split(r"(?=\[\d+\] )", " ".join(" ".join(lines[end:]).split()))
             if re.match(r"\[\d+\] ", note)]
    assert notes[0].startswith("[1] not run: set ROPE_EXTEND_OTHER_PYTHON to a Python with the other transformers "
                               "line"), notes
    assert "".join(table).count("[1]") == 2, table  # the other line's short and long requests, "not run [1]"
    # every other reason too (vLLM's capped cache, llama.cpp's -c), each once, each referenced from the table
    assert len(notes) >= 3 and len(set(notes)) == len(notes)
    for number in range(1, len(notes) + 1):
        assert f"[{number}]" in "".join(table)


def test_docs_serving_table_is_current():
    """docs/serving.md's table is what the engine ports compute today (regenerate with
    `python -m rope_extend.engines.parity docs/serving.md`)."""
    from rope_extend.engines.parity import TABLE_END, TABLE_START

    text = (Path(__file__).parent.parent / "docs" / "serving.md").read_text()
    current = text.split(TABLE_START + "\n", 1)[1].split("\n" + TABLE_END, 1)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert current == serving_table()


# --- the current releases (issue 64 item 3): the ports' facts, each against its source's behaviour ------------------
def test_vllm_serves_transformers_backend_architectures_with_transformers_rope_and_dynamic_per_batch():
    """GPT-NeoX and OLMo 2 go through vLLM's Transformers backend (0.34 registry.py:782-824): static methods are
    transformers' own RoPE (identical), dynamic is recomputed per batch (not claimed, the measured numbers said);
    Llama keeps vLLM's own get_rope (its dynamic cache of L rows)."""
    for arch in ("gpt_neox", "olmo2"):
        config = tiny.make_config(arch).to_dict()
        assert vllm.through_transformers(config)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yarn, dynamic = parity_many([(config, tiny.spec_kwargs("yarn", arch)),
                                         (config, tiny.spec_kwargs("dynamic", arch))], other_line=False)
        assert all(r.identical for r in yarn.rows if r.engine == vllm.VERSION)
        rows = [r for r in dynamic.rows if r.engine == vllm.VERSION]
        assert rows and all(isinstance(r.short, NotServed) and "depends on the requests batched with it" in
                            r.short.reason for r in rows)
        hint = next(h for h in engine_hints(plan_patch(tiny.make_config(arch), method="dynamic", factor=S), "OUT",
                                            config) if h.engine == "vllm")
        assert any("0.021 nats batched with a 250-token request" in w for w in hint.warnings)
        assert any("Transformers backend" in n for n in hint.notes)
    assert not vllm.through_transformers(tiny.make_config("llama").to_dict())


def test_overrides_reach_a_composite_models_text_config_in_both_engines():
    """A multimodal config (the text model under text_config): vLLM merges a `text_config` override recursively and
    puts a top-level key on the parent; SGLang 0.5.23 updates text_config one level, so a nested `rope_parameters`
    replaces the text model's whole dict (sgl-project/sglang#33505: the documented `{"text_config":
    {"rope_parameters": {yarn...}}}` loses rope_theta). The card's overrides carry the whole dict under text_config,
    and both original-model routes serve the checkpoint's RoPE."""
    config = tiny.make_multimodal_model().config.to_dict()
    theta = config["text_config"]["rope_parameters"]["rope_theta"]
    yarn = {"rope_type": "yarn", "factor": S, "original_max_position_embeddings": L}
    _, rope = vllm.load_config(config, {"rope_parameters": yarn})  # on the parent: no effect
    assert rope["rope_type"] == "default"
    _, rope = vllm.load_config(config, {"text_config": {"rope_parameters": yarn}})  # recursive: keeps rope_theta
    assert rope["rope_type"] == "yarn" and rope["rope_theta"] == theta
    _, rope = sglang.load_config(config, {"text_config": {"rope_parameters": yarn}})  # one level: loses it
    assert rope["rope_type"] == "yarn" and rope.get("rope_theta") is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (report,) = parity_many([(config, {"method": "yarn", "factor": S})], other_line=False)
    for engine in (vllm.VERSION, sglang.VERSION):
        rows = [r for r in report.rows if r.engine == engine]
        assert len(rows) == 2 and all(r.identical for r in rows), [(r.route, r.reasons()) for r in rows]
    hints = {h.engine: h for h in report.hints}
    for name in ("vllm", "sglang"):
        settings = hints[name].route(ORIGINAL).settings
        overrides = settings.hf_overrides if name == "vllm" else settings.override_args
        assert list(overrides) == ["text_config"] and overrides["text_config"]["rope_parameters"]["rope_theta"] == theta


def test_a_layer_typed_override_replaces_the_layer_types_dict_whole():
    """Gemma 3's rope_parameters per layer type: the original-model overrides carry every layer type (a top-level
    `rope_parameters` replaces vLLM's dict; SGLang merges one level, replacing a layer type's dict whole)."""
    config = tiny.make_config("gemma3_text").to_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = plan_patch(tiny.make_config("gemma3_text"), method="yarn", factor=S)
    hints = {h.engine: h for h in engine_hints(plan, "OUT", config)}
    for name, key in (("vllm", "hf_overrides"), ("sglang", "override_args")):
        rope = getattr(hints[name].route(ORIGINAL).settings, key)["rope_parameters"]
        assert set(rope) == {"full_attention", "sliding_attention"} and rope["full_attention"]["rope_type"] == "yarn"
    full = {"rope_type": "linear", "factor": 2.0}
    _, rope = sglang.load_config(config, {"rope_parameters": {"full_attention": full}})
    assert rope == full  # the layer type's dict replaced whole: its rope_theta is gone
    fields, rope = vllm.load_config(config, {"rope_parameters": {"full_attention": full}})
    assert rope == full and "sliding_attention" not in fields["rope_parameters"]


@pytest.mark.parametrize("name", ["gemma4_text-e2b", "lfm3-1.7b"])
def test_proportional_rope_linear_is_served_as_the_original_where_factor_is_ignored_and_ntk_everywhere(name):
    """Gemma 4 and LFM3 (proportional RoPE, real-shaped configs): vLLM 0.34 and SGLang 0.5.23 never read the slot's
    `factor` (vLLM gemma4_rope.py; SGLang gemma4_causal.py hands get_rope rope_type and rope_theta only), so `linear`
    differs there with a warning naming the ntk route; `ntk` (a rope_theta change) is identical in both. SGLang has
    no LFM3 model: unchecked. The independent reference: the installed transformers' own rotary module."""
    config = json.loads((Path(__file__).parent / "real_configs" / f"{name}.json").read_text())
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        linear, ntk = parity_many([(config, {"method": "linear", "factor": 2}), (config, {"method": "ntk", "factor": 2})],
                                  other_line=False)
    here = [r for r in linear.rows + ntk.rows if r.engine.startswith("transformers 5")]
    assert len(here) == 2 and all(r.identical for r in here)
    sglang_loads = not name.startswith("lfm3")
    for report, identical in ((linear, False), (ntk, True)):
        for engine, loads in ((vllm.VERSION, True), (sglang.VERSION, sglang_loads)):
            rows = [r for r in report.rows if r.engine == engine]
            assert len(rows) == 2, (engine, rows)
            if not loads:
                assert all(r.unchecked and "no LFM3 model" in r.short.reason for r in rows)
                continue
            assert all(r.identical is identical for r in rows), (report.method, engine, [r.reasons() for r in rows])
            if not identical:
                assert all(any("ignores `factor` for proportional RoPE" in w and "--method ntk" in w
                               for w in r.warnings) for r in rows)


# --- the transformers probe reads every rotary layout (found by docs/engine-matrix.md) -------------------------------
@pytest.mark.parametrize("model_type", ["llama", "cohere", "gpt_oss", "deepseek_v2"])
def test_the_transformers_probe_reads_every_rotary_layout(model_type, tmp_path):
    """rotate_half (Llama), each frequency twice in a row (Cohere), one column per frequency (GPT-OSS) and a complex
    freqs_cis (DeepSeek-V2): the probe's cos/sin have one column per rotary frequency, the formula's cos(p·θ_i) and
    sin(p·θ_i) with θ_i = base^(-2i/d) (d = the tiny config's head_dim, 16). Read as rotate_half, Cohere's columns
    were θ_0, θ_0, θ_1, θ_1, ... and GPT-OSS's the first half of its frequencies."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from rope_extend.engines.transformers import hf_probe

    if model_type not in CONFIG_MAPPING_NAMES:
        pytest.skip(f"this transformers has no {model_type}")
    config = tiny.zoo_config(model_type)
    config.save_pretrained(tmp_path)
    text = config.get_text_config()
    params = getattr(text, "rope_parameters", None) or {}
    base = float(params.get("rope_theta") or text.rope_theta)
    dim = tiny.ZOO_TEXT["head_dim"]
    positions = list(range(40))
    cos, sin = hf_probe.probe(str(tmp_path), {40: positions})["requests"][40]
    angles = torch.tensor(positions, dtype=torch.float64)[:, None] * base ** (-torch.arange(0, dim, 2) / dim)
    assert cos.shape == sin.shape == angles.shape
    torch.testing.assert_close(cos.double(), angles.cos(), rtol=0, atol=1e-5)
    torch.testing.assert_close(sin.double(), angles.sin(), rtol=0, atol=1e-5)
