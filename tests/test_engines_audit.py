"""`rope-extend engines MODEL` on a model rope-extend did not write: the audit of the model's own RoPE per engine.

Fixtures: the models' real config.json files in Hub-shaped caches (tests/hubcache.py; config.json only, as
`hf_hub_download` leaves it). Every verdict is checked against numbers computed here from transformers' own rotary
classes (the model's `...RotaryEmbedding` built from the config and called at the request's positions), never
against the report's own reference.
"""

from __future__ import annotations

import json
import math
import warnings

import hubcache
import numpy as np
import pytest
import torch
from helpers import LLAMA, PHI, QWEN, offline_hub
from transformers import AutoConfig

from rope_extend.cli import run
from rope_extend.engines.audit import audit
from rope_extend.engines.served import positions, tolerance
from rope_extend.engines.sglang import port as sglang
from rope_extend.engines.vllm import port as vllm

GEMMA = "google/gemma-3-4b-it"
VLLM, SGLANG, LLAMA_CPP = vllm.VERSION, sglang.VERSION, "llama.cpp (llama-cpp-python 0.3.36)"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A Hub cache with the real configs (Qwen2.5 with the YaRN x4 its model card tells users to add), offline."""
    return offline_hub(tmp_path, monkeypatch, GEMMA)


def rows(report, engine):
    return [row for row in report.rows if row.engine == engine]


def verdict(report, engine):
    return next(v for v in report.verdicts() if v.engine == engine)


def snapshot(hub, repo):
    return hub / f"models--{repo.replace('/', '--')}" / "snapshots" / hubcache.commit_of(repo)


def hf_cos_sin(folder, at, last=None, layer_type=None):
    """transformers' own rotary embedding of the config.json in `folder` at positions `at` (in a batch whose last
    position is `last`: dynamic schemes switch on it), as (cos, sin) [len(at), rotary_dim / 2] in float64."""
    from rope_extend.engines.transformers.hf_probe import rotary_module

    config = AutoConfig.from_pretrained(folder).get_text_config()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = rotary_module(config)
    ids = list(at) + ([last] if last is not None else [])
    kwargs = {"layer_type": layer_type} if layer_type else {}
    with torch.no_grad():
        cos, sin = module(torch.zeros(1), torch.tensor(ids)[None, :], **kwargs)
    half = cos.shape[-1] // 2
    return cos[0, : len(at), :half].double().numpy(), sin[0, : len(at), :half].double().numpy()


def test_qwen25_yarn_x4_is_served_identically_with_the_printed_flags(hub):
    report = audit(QWEN)
    assert (report.short, report.long) == (32768, 131072)  # L = original_max_position_embeddings, window = 4 L
    assert "yarn x4" in report.scheme and [g.layer_type for g in report.groups] == [None]
    v = verdict(report, VLLM)
    assert v.identical and v.command == ("VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 vllm serve Qwen/Qwen2.5-7B-Instruct "
                                         "--max-model-len 131072")
    g = verdict(report, SGLANG)
    assert g.identical and g.command.startswith("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 python -m "
                                                "sglang.launch_server") and "--context-length 131072" in g.command
    assert verdict(report, LLAMA_CPP).identical is None  # qwen2 is not the LLaMA architecture the port models
    # the evidence: transformers' YaRN magnitude 0.1 ln 4 + 1 at position 0, which both ports serve
    cos, _ = hf_cos_sin(snapshot(hub, QWEN), [0])
    assert cos[0, 0] == pytest.approx(0.1 * math.log(4) + 1, rel=1e-6)
    for row in rows(report, VLLM) + rows(report, SGLANG):
        assert row.short.max_cos < 2e-3 and row.short.first_position is None


def test_llama31_llama3_scaling_is_identical_in_every_engine(hub):
    report = audit(LLAMA)
    assert (report.short, report.long) == (8192, 131072) and "llama3 x8" in report.scheme
    assert all(verdict(report, e).identical for e in (VLLM, SGLANG, LLAMA_CPP))
    assert verdict(report, VLLM).command == "vllm serve meta-llama/Llama-3.1-8B --max-model-len 131072"
    assert verdict(report, LLAMA_CPP).command.endswith(
        "llama-server -m model.gguf -c 131072 (the GGUF's RoPE keys: llama.context_length 131072, "
        "llama.rope.dimension_count 128, llama.rope.freq_base 500000, rope_freqs tensor (64 factors))")


def test_phi3_longrope_vllm_serves_long_factors_on_short_requests(hub):
    """transformers picks LongRoPE's short factors up to L = 4096 tokens and the long ones beyond; vLLM picks by
    --max-model-len, so with the window it rotates a 4096-token request with the long factors."""
    report = audit(PHI)
    L, n = 4096, report.long
    assert (report.short, report.long) == (L, 131072) and "longrope" in report.scheme
    as_is = next(row for row in rows(report, VLLM) if row.route == "this checkpoint")
    assert not as_is.short.identical and as_is.long.identical
    # independently: transformers' own classes, the same positions 0..4095 in a batch up to 4095 (short factors)
    # and in one reaching past L (long factors): the difference is what vLLM serves wrong
    at = np.arange(L)
    short_cos, short_sin = hf_cos_sin(snapshot(hub, PHI), at)
    long_cos, long_sin = hf_cos_sin(snapshot(hub, PHI), at, last=L + 1)
    expected = np.abs(long_cos - short_cos).max()
    assert expected > 1.0  # a real difference, not rounding
    assert as_is.short.max_cos == pytest.approx(expected, abs=1e-3)
    diff = np.maximum(np.abs(long_cos - short_cos), np.abs(long_sin - short_sin))
    freqs = torch.from_numpy(np.abs(np.arctan2(short_sin[1], short_cos[1])))
    first = int(np.flatnonzero((diff > tolerance(freqs, L)[None, :]).any(axis=1))[0])
    assert as_is.short.first_position == first
    # the verdict: no route serves both; --max-model-len 4096 serves up to L with the short factors
    v = verdict(report, VLLM)
    assert v.identical is False and v.up_to == L
    assert v.command == "vllm serve microsoft/Phi-3.5-mini-instruct --max-model-len 4096"
    assert "position" in v.why and "rotary frequency" in v.why
    # SGLang picks per batch (long once a position exceeds L): identical at 4096 and 131072 tokens
    assert verdict(report, SGLANG).identical
    assert positions(n)[-1] == n - 1


def test_gemma3_sliding_layers_use_the_local_rope_and_full_layers_the_scaled_one(hub):
    report = audit(GEMMA)
    config = AutoConfig.from_pretrained(snapshot(hub, GEMMA)).get_text_config()
    sliding = tuple(i for i, t in enumerate(config.layer_types) if t == "sliding_attention")
    assert sliding == tuple(i for i in range(34) if i % 6 != 5)  # Gemma 3's 5:1 pattern
    groups = {g.layer_type: g.layers for g in report.groups}
    assert groups == {"full_attention": (5, 11, 17, 23, 29), "sliding_attention": sliding}
    assert "sliding layers default (θ 10000)" in report.scheme and "full layers linear x8 (θ 1e+06)" in report.scheme
    for engine in (VLLM, SGLANG):
        assert verdict(report, engine).identical
        assert {row.layers for row in rows(report, engine)} == {"full 5, 11, 17, 23, 29",
                                                                 "sliding 0-4, 6-10, 12-16, 18-22, 24-28, 30-33"}
    # the check can fail: the sliding layers' RoPE (θ 1e4, unscaled) is far from the full layers' (θ 1e6, /8)
    at = np.arange(1024)
    full, _ = hf_cos_sin(snapshot(hub, GEMMA), at, layer_type="full_attention")
    local, _ = hf_cos_sin(snapshot(hub, GEMMA), at, layer_type="sliding_attention")
    assert np.abs(full - local).max() > 1.0
    inv = 1.0 / 10000 ** (torch.arange(0, 256, 2, dtype=torch.float64) / 256)  # default RoPE, θ = 1e4
    assert np.abs(local - np.cos(at[:, None] * inv.numpy()[None, :])).max() < 1e-3


def test_ministral3_yarn_mscale_ratio_is_one_in_both_ports(tmp_path):
    """sgl-project/sglang#22711: SGLang ignored mscale / mscale_all_dim and scaled Ministral 3's cos/sin by
    0.1 ln 16 + 1 = 1.277 instead of transformers' 1.0 (vLLM 0.25.0 the same: vllm#48621, PR #48623). What the
    ports say for the versions they follow (their docstrings): SGLang 0.5.23's yarn reads mscale, mscale_all_dim;
    vLLM 0.34.0's attention_factor > mscale/mscale_all_dim > 0.1 ln s + 1."""
    folder = tmp_path / "ministral3"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "ministral3",
                                                    "architectures": ["Ministral3ForCausalLM"]}))
    report = audit(folder)  # transformers' Ministral3Config defaults: Ministral 3's YaRN x16 from 16384
    assert (report.short, report.long) == (16384, 262144)
    cos, _ = hf_cos_sin(folder, [0])
    assert cos[0, 0] == pytest.approx(1.0, abs=1e-6)  # transformers: get_mscale(16, 1) / get_mscale(16, 1)
    assert 0.1 * math.log(16) + 1 == pytest.approx(1.277, abs=1e-3)  # what the unfixed engines served
    for engine in (VLLM, SGLANG):
        v = verdict(report, engine)
        assert v.identical and "this checkpoint" == v.route
        assert all(row.short.max_cos < 1e-3 for row in rows(report, engine))
    assert "mscale" in sglang.__doc__ and "mscale_all_dim" in vllm.__doc__


def test_an_explicit_yarn_attention_factor_needs_sglangs_override(tmp_path):
    """SGLang reads no attention_factor (its magnitude is 0.1 ln s + 1 times attn_factor): the checkpoint as it
    is differs by exactly that at position 0, and the override attn_factor = attention_factor / (0.1 ln s + 1),
    written as rope_parameters with rope_theta, makes it identical (copying attention_factor into attn_factor
    would square the scale: sgl-project/sglang#33558)."""
    folder = tmp_path / "qwen-af"
    folder.mkdir()
    config = json.loads(hubcache.config_path(QWEN).read_text())
    config["rope_scaling"] = {**hubcache.QWEN_YARN["rope_scaling"], "attention_factor": 1.0}
    (folder / "config.json").write_text(json.dumps(config))
    report = audit(folder)
    own = 0.1 * math.log(4) + 1
    as_is, fixed = rows(report, SGLANG)
    assert as_is.route == "this checkpoint" and not as_is.identical
    assert as_is.short.max_cos == pytest.approx(own - 1.0, abs=1e-4) and as_is.short.first_position == 0
    assert fixed.identical and fixed.route == "+ --json-model-override-args"
    override = json.loads(fixed.command.split("--json-model-override-args ")[1].strip("'"))
    assert override["rope_parameters"]["attn_factor"] == pytest.approx(1.0 / own)
    assert override["rope_parameters"]["rope_theta"] == 1e6  # rope_theta written with it
    assert verdict(report, SGLANG).command == fixed.command
    assert verdict(report, VLLM).identical  # vLLM 0.33 reads attention_factor


def test_cli_audit_prints_verdicts_and_json_and_keeps_rope_extend_outputs_on_parity(hub, capsys, tmp_path):
    assert run(["engines", PHI]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "transformers 5" in printed and "own rotary embedding of this config.json" in printed
    assert ("vLLM 0.34.0: identical only up to 4096 tokens, with: vllm serve microsoft/Phi-3.5-mini-instruct "
            "--max-model-len 4096") in printed
    assert run(["engines", GEMMA, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["audit"] and data["identical"] is True
    assert {row["layers"] for row in data["rows"]} >= {"full 5, 11, 17, 23, 29"}
    assert all("worst_position" in row["short"] for row in data["rows"] if row["short"]["served"])
    evidence = [row["evidence"] for row in data["rows"] if row["engine"] == VLLM]
    assert evidence and all(e["measure"].startswith("cos/sin against transformers' own") for e in evidence)
    assert run(["engines", PHI, "--run", "tgi"]) == 2  # a run engine's name is checked before anything loads
    assert "--run 'tgi'" in capsys.readouterr().err


def test_docs_serving_audit_example_is_current(tmp_path, monkeypatch, capsys):
    """docs/serving.md's worked example is what the audit prints today (at 100 columns, the transformers version
    aside: the suite also runs under the 4.x line)."""
    import re
    from pathlib import Path

    cache = tmp_path / "hub"
    hubcache.build_config(cache, QWEN, hubcache.QWEN_YARN)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("ROPE_EXTEND_OTHER_PYTHON", raising=False)
    monkeypatch.setenv("COLUMNS", "100")
    assert run(["engines", QWEN]) == 0
    printed = capsys.readouterr().out.rstrip("\n")
    text = (Path(__file__).parent.parent / "docs" / "serving.md").read_text()
    block = text.split("<!-- AUDIT-EXAMPLE:BEGIN -->\n")[1].split("<!-- AUDIT-EXAMPLE:END -->")[0]
    shown = block.split("\n", 2)[2].rsplit("\n```", 1)[0]  # after the fence and the command line

    def versionless(s):
        return re.sub(r"transformers \d+\.\d+\.\d+\S*", "transformers X", s)

    assert versionless(shown) == versionless(printed), "rerun the command in docs/serving.md and paste its output"


# --- a GGUF's own RoPE (issue 66 item 6) --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def yarn_gguf(demo_gguf, tmp_path_factory):
    """The demo GGUF patched with YaRN x2 by rope-extend (its rope.scaling.* keys written)."""
    out = tmp_path_factory.mktemp("gguf") / "yarn2.gguf"
    assert run(["patch", str(demo_gguf), "--method", "yarn", "--factor", "2", "-o", str(out)]) == 0
    return out


def test_a_gguf_is_audited_against_llama_cpps_reading_of_its_metadata(demo_gguf, yarn_gguf, monkeypatch):
    """`rope-extend engines model.gguf`: llama.cpp's RoPE of the file's metadata (its port) is the reference; the GGUF
    loaded back through transformers' GGUF reader (what vLLM and SGLang read for a .gguf) is compared with it. The
    demo GGUF (plain RoPE) is identical everywhere; a YaRN x2 GGUF is not: transformers' reader carries no
    rope.scaling.* key (its GGUF_CONFIG_MAPPING), so every engine that loads it back serves the original RoPE, which
    the rows measure (|Δcos| up to 2 at the long request's end) and the note names."""
    from rope_extend.engines.audit import audit_gguf
    from rope_extend.engines.llama_cpp import port as llama_cpp
    from rope_extend.gguf.info import read_gguf_info

    monkeypatch.delenv("ROPE_EXTEND_OTHER_PYTHON", raising=False)
    plain = audit_gguf(demo_gguf)
    assert plain.measured_against.startswith("llama.cpp's RoPE of this GGUF's metadata")
    ran = [v for v in plain.verdicts() if v.identical is not None]
    assert {v.engine.split()[0] for v in ran} == {"transformers", "vLLM", "SGLang"} and all(v.identical for v in ran)
    info = read_gguf_info(yarn_gguf)
    assert info.scaling["type"] == "yarn" and info.scaling["factor"] == 2.0
    scaled = audit_gguf(yarn_gguf)
    assert (scaled.short, scaled.long) == (8192, 16384) and "yarn x2" in scaled.scheme
    rows = [r for r in scaled.rows if r.label != "not run"]
    assert rows and all(not r.identical and r.long.max_cos > 1 for r in rows)
    (note,) = scaled.notes
    assert "no rope.scaling.* key" in note and '"rope_type": "default"' in note and "serve it in llama.cpp" in note
    # the reference is the port's reading of the file: llama.cpp serves YaRN's magnitude 1 + 0.1 ln 2 from the keys
    meta = {"context_length": 16384, "rope.dimension_count": 64, "rope.freq_base": info.freq_base,
            **{f"rope.scaling.{k}": v for k, v in info.scaling.items()}}
    assert llama_cpp.served(meta, "", 16384).magnitude == pytest.approx(0.1 * math.log(2) + 1, rel=1e-6)


def test_engines_takes_a_gguf_and_says_so_in_its_json(yarn_gguf, capsys, monkeypatch):
    monkeypatch.delenv("ROPE_EXTEND_OTHER_PYTHON", raising=False)
    capsys.readouterr()
    assert run(["engines", str(yarn_gguf), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model_type"] == "GGUF llama" and not report["identical"] and report["notes"]


# --- the audit, run (`--run`): the small model the real engines serve ------------------------------------------------
def small_of(hub, repo, tmp_path):
    """The run's small model of `repo`'s config.json in the Hub cache (`audit_run.small_model`)."""
    from rope_extend import compat
    from rope_extend.engines.audit_run import small_model

    folder = snapshot(hub, repo)
    raw = json.loads((folder / "config.json").read_text())
    text = AutoConfig.from_pretrained(folder).get_text_config()
    return small_model(raw, compat.text_config(text), tmp_path / "small", 131072), raw


def test_run_lengths_fit_the_budget_and_straddle_longropes_switch():
    from rope_extend.engines.audit_run import RUN_TOKENS, run_lengths

    assert RUN_TOKENS == 8192
    assert run_lengths(32768, 131072, 8192) == (4096, 8192)  # Qwen2.5 YaRN x4: both inside L, the long one longer
    assert run_lengths(4096, 131072, 8192) == (4096, 8192)  # Phi-3.5: the short one at L, the long one beyond it
    assert run_lengths(4096, 131072, 4608) == (2304, 4608)
    assert run_lengths(256, 512, 8192) == (256, 512)  # a small window: the audited lengths themselves
    with pytest.raises(ValueError, match="--long-tokens 32: .*64 or more"):
        run_lengths(4096, 131072, 32)


@pytest.mark.parametrize("repo", [QWEN, PHI])
def test_the_small_model_carries_the_audited_rope_as_written(repo, hub, tmp_path):
    """The run's model: config.json's RoPE keys exactly as the user's file writes them (Qwen2.5's `rope_scaling`
    with "type": "yarn", Phi-3.5's 48 short / long factors), head_dim and the window kept, the width shrunk; the
    rotary embedding transformers builds from it is the audited model's, position for position; the tokenizer
    loads with one token per id."""
    from transformers import AutoTokenizer

    small, raw = small_of(hub, repo, tmp_path)
    written = json.loads((small.folder / "config.json").read_text())
    for key in ("rope_scaling", "rope_theta", "max_position_embeddings", "original_max_position_embeddings"):
        assert written.get(key) == raw.get(key), key
    heads, width = raw["num_attention_heads"], raw["hidden_size"]
    assert small.head_dim == width // heads and written["hidden_size"] < width and small.vocab_size == 256
    assert written["architectures"] == raw["architectures"] and written["dtype"] == "float32"
    at = np.arange(0, 131072, 997)
    for last in (None, 131071):  # Phi's short factors (a batch inside L) and long ones
        mine = hf_cos_sin(small.folder, at, last)
        theirs = hf_cos_sin(snapshot(hub, repo), at, last)
        assert np.array_equal(mine[0], theirs[0]) and np.array_equal(mine[1], theirs[1])
    words = AutoTokenizer.from_pretrained(small.folder).convert_ids_to_tokens(list(range(small.vocab_size)))
    assert words[:4] == ["<unk>", "<s>", "</s>", "t3"] and words[-1] == f"t{small.vocab_size - 1}"
    ids = small.request_ids(500)
    assert ids == small.request_ids(500) and min(ids) >= 3 and max(ids) < 256  # seeded, specials left out


def test_sharpen_scales_queries_and_keys_through_what_produces_them_last(tmp_path):
    """q_proj / k_proj (Llama), a fused qkv_proj's q and k rows (Phi-3), and a q/k norm (Gemma 3's (1 + weight)·x̂:
    a projection's scale would be normalised away) each give queries and keys `scale` times larger, values
    untouched."""
    from transformers import AutoModelForCausalLM

    from rope_extend.engines.audit_run import sharpen

    def attention_of(model):
        return next(m for m in model.modules() if type(m).__name__.endswith("Attention"))

    cases = {
        "llama": dict(model_type="llama", hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16),
        "phi3": dict(model_type="phi3", hidden_size=64, num_attention_heads=4, num_key_value_heads=2),
        "gemma3_text": dict(model_type="gemma3_text", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=16, layer_types=["full_attention"]),
    }
    for fields in cases.values():
        config = AutoConfig.for_model(**{**fields, "num_hidden_layers": 1, "intermediate_size": 32, "vocab_size": 32,
                                         "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0})
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
        attn = attention_of(model)
        x = torch.randn(3, 64)
        before = {name: p.detach().clone() for name, p in model.named_parameters()}
        norm_in = torch.randn(3, 16)
        q_norm_before = attn.q_norm(norm_in).detach() if hasattr(attn, "q_norm") else None
        said = sharpen(model, 4.0)
        assert "x4" in said and "in 1 of 1 attention layers" in said, said
        if q_norm_before is not None:
            assert "q_norm/k_norm" in said
            assert torch.allclose(attn.q_norm(norm_in), 4 * q_norm_before, rtol=1e-5)
        elif hasattr(attn, "qkv_proj"):
            q_rows = (4 + 2) * 16
            new = attn.qkv_proj.weight
            assert torch.allclose(new[:q_rows], 4 * before[next(k for k in before if "qkv_proj" in k)][:q_rows])
            assert torch.equal(new[q_rows:], before[next(k for k in before if "qkv_proj" in k)][q_rows:])  # v
        else:
            assert torch.allclose(attn.q_proj(x), 4 * (x @ before[next(k for k in before if "q_proj" in k)].T))
            assert torch.equal(attn.v_proj.weight, before[next(k for k in before if "v_proj" in k)])


def test_the_run_can_see_a_wrong_rope_at_its_lengths(hub, tmp_path):
    """Why queries and keys are scaled: on the small model of Qwen2.5's config, transformers itself with a RoPE a
    little off (the YaRN factor 4 -> 4.1, 2.5 %) moves the prompt log-probabilities of a 2048-token request beyond
    the run's tolerance; the same model with the audited config reloaded is identical to the last bit. What a real
    engine serving a wrong override measures is in tests/test_vllm_engine.py and tests/test_sglang_engine.py."""
    from rope_extend.engines.audit_run import reference
    from rope_extend.engines.runs import compare_logprobs

    small, _ = small_of(hub, QWEN, tmp_path)
    requests = {2048: small.request_ids(2047)}
    truth = reference(small.folder, requests)[2048]
    assert compare_logprobs(reference(small.folder, requests)[2048], truth).max_abs == 0.0

    def off(**change):
        config = json.loads((small.folder / "config.json").read_text())
        config["rope_scaling"] = {**config["rope_scaling"], **change}
        folder = tmp_path / "-".join(map(str, change.values()))
        folder.mkdir()
        for item in small.folder.iterdir():
            (folder / item.name).symlink_to(item)
        (folder / "config.json").unlink()
        (folder / "config.json").write_text(json.dumps(config))
        return compare_logprobs(reference(folder, requests)[2048], truth)

    slightly = off(factor=4.1)
    assert not slightly.identical and slightly.mean_abs > 1e-3, slightly.describe()
    assert not off(attention_factor=1.0).identical


def test_at_the_initial_scale_a_small_rope_difference_hides_under_the_tolerance(hub, tmp_path, monkeypatch):
    """The same 2.5 % YaRN factor error on the same small model with queries and keys left at their initial scale
    (attention almost uniform): within the tolerance, so a run there could not have seen it."""
    from rope_extend.engines import audit_run
    from rope_extend.engines.runs import compare_logprobs

    monkeypatch.setattr(audit_run, "QK_SCALE", 1.0)
    small, _ = small_of(hub, QWEN, tmp_path)
    requests = {2048: small.request_ids(2047)}
    config = json.loads((small.folder / "config.json").read_text())
    config["rope_scaling"] = {**config["rope_scaling"], "factor": 4.1}
    folder = tmp_path / "off"
    folder.mkdir()
    for item in small.folder.iterdir():
        if item.name != "config.json":
            (folder / item.name).symlink_to(item)
    (folder / "config.json").write_text(json.dumps(config))
    truth = audit_run.reference(small.folder, requests)[2048]
    hidden = compare_logprobs(audit_run.reference(folder, requests)[2048], truth)
    assert hidden.identical and "x1 " in small.sharpened, hidden.describe()
