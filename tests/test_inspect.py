"""`inspect`: the per-disk table against its formulas, regimes at YaRN's ramp ends, recommend, plot, CLI."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest
from tiny import ORIGINAL, make_config
from transformers import AutoConfig

from rope_extend import NoExtensionError
from rope_extend.cli import run
from rope_extend.inspect import classify, inspect_rope, load_config, plot_methods, recommend
from rope_extend.methods import RopeContext, compute, default_inv_freq
from rope_extend.methods.yarn import correction_range

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    make_config("llama").save_pretrained(path)  # head_dim 16, rope_theta 10000, max_position_embeddings 32
    return path


def big_config(**kwargs):
    """Config only (no weights): a Llama-2-like RoPE, head_dim 64, L = 2048."""
    defaults = {"hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 1, "intermediate_size": 64,
                "vocab_size": 32, "max_position_embeddings": 2048, "head_dim": 64}
    return AutoConfig.for_model("llama", **{**defaults, **kwargs})


def test_table_matches_formulas_without_spec(tiny_dir):
    view = inspect_rope(load_config(tiny_dir))
    assert (view.rotary_dim, view.base, view.original_length, view.method) == (16, 10000.0, ORIGINAL, None)
    assert view.attention_factor == 1.0 and len(view.rows) == 8
    for row in view.rows:
        theta = 10000.0 ** (-2 * row.index / 16)
        assert row.old_inv_freq == pytest.approx(theta, rel=1e-6)
        assert row.new_inv_freq == row.old_inv_freq
        assert row.wavelength == pytest.approx(2 * math.pi / theta, rel=1e-6)
        assert row.rotations == pytest.approx(ORIGINAL * theta / (2 * math.pi), rel=1e-6)
        assert row.regime == "unchanged"
    assert any("less than one turn" in note and "angles never seen in pretraining" in note for note in view.notes)
    # an attention-level method keeps every distance inside the window: no unseen angle is claimed
    view = inspect_rope(load_config(tiny_dir), method="self-extend", factor=2)
    slow = [note for note in view.notes if "less than one turn" in note]
    assert len(slow) == 1 and "never seen" not in slow[0] and f"into {ORIGINAL} tokens" in slow[0]


def test_table_with_yarn_matches_method(tiny_dir):
    config = load_config(tiny_dir)
    view = inspect_rope(config, method="yarn", factor=4)
    ctx = RopeContext(rotary_dim=16, base=10000.0, original_max_position_embeddings=ORIGINAL, factor=4.0)
    inv_freq, attention = compute("yarn", ctx)
    assert view.attention_factor == pytest.approx(0.1 * math.log(4) + 1)
    assert view.attention_factor == pytest.approx(attention)
    assert view.target_length == 4 * ORIGINAL and view.factor == 4.0
    for row in view.rows:
        assert row.new_inv_freq == pytest.approx(float(inv_freq[row.index]), rel=1e-7)
        assert row.ratio == pytest.approx(row.new_inv_freq / row.old_inv_freq, rel=1e-6)
        assert row.new_wavelength == pytest.approx(2 * math.pi / row.new_inv_freq, rel=1e-6)
        assert row.rotations_at_target == pytest.approx(4 * ORIGINAL / row.new_wavelength, rel=1e-6)


@pytest.mark.parametrize("truncate", [True, False])
def test_yarn_regimes_at_ramp_boundaries(truncate):
    config = big_config()
    view = inspect_rope(config, method="yarn", factor=8, truncate=truncate)
    low, high = correction_range(32.0, 1.0, 64, 10000.0, 2048, truncate)
    regimes = [row.regime for row in view.rows]
    for i, regime in enumerate(regimes):
        if i <= low:
            assert regime == "extrapolated", (i, low, high)
        elif i >= high:
            assert regime == "interpolated", (i, low, high)
        else:
            assert regime == "blended", (i, low, high)
    assert {"extrapolated", "blended", "interpolated"} <= set(regimes)
    if truncate:  # integer ramp ends: the last extrapolated and first interpolated disks are exactly the bounds
        assert regimes[int(low)] == "extrapolated" and regimes[int(low) + 1] == "blended"
        assert regimes[int(high)] == "interpolated" and regimes[int(high) - 1] == "blended"


def test_regimes_of_other_methods():
    config = big_config()
    assert {r.regime for r in inspect_rope(config, method="linear", factor=4).rows} == {"interpolated"}
    ntk = [r.regime for r in inspect_rope(config, method="ntk", factor=4).rows]
    assert ntk[0] == "extrapolated" and ntk[-1] == "interpolated" and set(ntk[1:-1]) == {"blended"}
    assert {r.regime for r in inspect_rope(config).rows} == {"unchanged"}  # the bare model
    with pytest.raises(NoExtensionError, match="yarn x1: 2048 -> 2048 tokens extends nothing"):
        inspect_rope(config, method="yarn", factor=1)  # refused as patch refuses it (issue 57)
    assert classify(1.5, 4) == "other" and classify(0.1, 4) == "other"
    # dynamic methods are shown at the target length: dynamic-yarn there is static yarn
    dyn = inspect_rope(config, method="dynamic-yarn", factor=4)
    static = inspect_rope(config, method="yarn", factor=4)
    assert [r.new_inv_freq for r in dyn.rows] == [r.new_inv_freq for r in static.rows]
    assert any("dynamic" in note for note in dyn.notes)


def llama3_config():
    return big_config(
        max_position_embeddings=16384,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 2048},
    )


def test_model_that_ships_llama3():
    config = llama3_config()
    view = inspect_rope(config)
    assert view.current_rope_type == "llama3" and view.original_length == 2048 and view.factor == 8.0
    expected = compute("llama3", RopeContext(64, 500000.0, 2048, 8.0))[0]
    assert [r.new_inv_freq for r in view.rows] == pytest.approx(expected.tolist(), rel=1e-6)
    assert [r.old_inv_freq for r in view.rows] == pytest.approx(default_inv_freq(64, 500000.0).tolist(), rel=1e-6)
    assert {"extrapolated", "blended", "interpolated"} <= {r.regime for r in view.rows}
    # a spec on it is re-derived from the original length rather than refused
    again = inspect_rope(config, method="yarn", factor=16)
    assert again.original_length == 2048 and any("re-derived" in n for n in again.notes)
    advice = recommend(config, 65536)
    assert advice.method == "llama3" and advice.factor == 65536 / 2048
    assert recommend(config, 16384).method is None  # it already serves 16k


def test_recommend_minimal_factor_and_method():
    config = big_config()
    advice = recommend(config, 12288)
    assert advice.factor == 12288 / 2048 and advice.original_length == 2048
    assert advice.method == "yarn"
    assert {"dynamic-yarn", "dynamic"} <= set(advice.alternatives)
    assert advice.reasons[0].startswith("minimal factor = target / original length = 12288 / 2048 = 6")
    assert any("slowest disk" in line for line in advice.reasons)
    costs = advice.costs
    assert costs["linear"]["changed"] == 1.0 and costs["linear"]["high_shift"] == pytest.approx(math.log2(6))
    assert costs["yarn"]["changed"] < 1.0 and costs["yarn"]["high_shift"] < costs["linear"]["high_shift"]
    assert recommend(config, 1024).method is None
    assert "ntk" in recommend(config, 3072).alternatives  # factor 1.5


def test_recommend_names_self_extend_and_says_what_a_disk_is():
    """The alternatives follow the README's "Which method when": yarn for engines (the recommendation), self-extend
    in-process for retrieval beyond the window without training, with log_n beyond 2x; a "disk" is defined where
    the reasons first use the word."""
    readme = (Path(__file__).parent.parent / "README.md").read_text().split("## Which method when", 1)[1]
    assert "`self-extend`, in-process" in readme and "log_n=true" in readme.split("##", 1)[0]
    config = big_config()
    at_6x, at_1_5x = recommend(config, 12288), recommend(config, 3072)
    assert at_6x.method == at_1_5x.method == "yarn"
    for advice in (at_6x, at_1_5x):
        why = advice.alternatives["self-extend"]
        assert "in-process" in why and "rope_extend.patch_model" in why and "serve yarn" in why
        first = next(line for line in advice.reasons if "disk" in line)
        assert "rotary pair of query/key dimensions (a \"disk\")" in first
    assert "beyond 2x add --set log_n=true" in at_6x.alternatives["self-extend"]
    assert "at 4x add --set log_n=true" in at_1_5x.alternatives["self-extend"]


def test_plot_written(tmp_path):
    path = plot_methods(big_config(), 4, tmp_path / "methods.png")
    assert path.read_bytes()[:8] == PNG


def test_cli_table_and_json(tiny_dir, capsys):
    assert run(["inspect", str(tiny_dir)]) == 0
    text = capsys.readouterr().out
    assert "unchanged" in text and "rotary dim 16" in text
    assert run(["inspect", str(tiny_dir), "--method", "yarn", "--factor", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = data["inspection"]["rows"]
    assert [r["regime"] for r in rows] == ["extrapolated", "blended"] + ["interpolated"] * 6
    assert data["inspection"]["counts"] == {"extrapolated": 1, "blended": 1, "interpolated": 6}


def test_cli_recommend_and_plot(tiny_dir, tmp_path, capsys):
    png = tmp_path / "rope.png"
    rc = run(["inspect", str(tiny_dir), "--recommend", "--target-length", "96", "--plot", str(png), "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["recommendation"]["factor"] == 96 / ORIGINAL and data["recommendation"]["method"] == "yarn"
    assert data["inspection"]["method"] == "yarn" and data["inspection"]["target_length"] == 96
    assert png.read_bytes()[:8] == PNG
    assert run(["inspect", str(tiny_dir), "--recommend", "--target-length", "96"]) == 0
    text = capsys.readouterr().out
    assert "recommendation for 96 tokens: factor 3" in text and "minimal factor" in text
    assert "alternative self-extend:" in text and 'a rotary pair of query/key dimensions (a "disk")' in text


def test_cli_recommend_no_scaling_needed(tiny_dir, capsys):
    assert run(["inspect", str(tiny_dir), "--recommend", "--target-length", "32", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["recommendation"]["method"] is None and data["inspection"]["method"] is None


def test_cli_config_file(tiny_dir, tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text("method: linear\nfactor: 2\n")
    assert run(["inspect", str(tiny_dir), "--config", str(spec), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["inspection"]
    assert data["method"] == "linear" and data["counts"] == {"interpolated": 8}


@pytest.mark.parametrize(
    "args",
    [
        ["--method", "yarn", "--factor", "0.5"],
        ["--factor", "2"],
        ["--method", "yarn"],
        ["--method", "yarnn", "--factor", "2"],
        ["--recommend"],
        ["--target-length", "64"],
        ["--method", "yarn", "--target-length", "16"],
        ["--recommend", "--target-length", "0"],
    ],
)
def test_cli_bad_input_exits_2_with_one_line(tiny_dir, capsys, args):
    assert run(["inspect", str(tiny_dir), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rope-extend: error:") and len(err.splitlines()) == 1, err


def test_cli_missing_folder(tmp_path, capsys):
    assert run(["inspect", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nope" in err
    (tmp_path / "empty").mkdir()
    assert run(["inspect", str(tmp_path / "empty")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_inspecting_a_spec_shorter_than_the_window_shows_it_and_says_patch_refuses_it():
    config = llama3_config()  # llama3 x8 from 2048: 16384 tokens
    view = inspect_rope(config, method="yarn", factor=4)
    assert view.target_length == 8192
    assert any("reaches 8192 tokens, shorter than the model's 16384 now: patch refuses it" in n for n in view.notes)


def _passkeys(folder: str, variant: str, length: int) -> tuple[int, int]:
    """k/n straight from a committed results.jsonl (classic filler), the independent count."""
    lines = (Path(__file__).parent.parent / "eval" / "reports" / folder / "results.jsonl").read_text().splitlines()
    scores = [r["metrics"]["score"] for r in map(json.loads, lines)
              if r["variant"] == variant and r["length"] == length and r["kind"] == "passkey"
              and r.get("haystack", "filler") == "filler"]
    return int(sum(scores)), len(scores)


def test_recommend_on_the_demo_model_carries_what_the_project_measured_at_that_ratio(smollm2_path, capsys):
    """SmolLM2-135M (8192 tokens) to 65536 is x8, where the committed GPU records show every frequency method failing
    most passkeys: the recommendation says so in its first line, with the counts of the records, and points to eval
    and train; at x2 it quotes the measurements without a caveat; at x3.05 it says nothing was measured there."""
    assert run(["inspect", str(smollm2_path), "--recommend", "--target-length", "65536"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # the lines wrap at the terminal's width: read them as words
    found, prompts = _passkeys("smollm2-passkey-8x-freq-cuda-bfloat16", "yarn-x8", 65536)
    dyn_found, dyn_prompts = _passkeys("smollm2-passkey-8x-freq-cuda-bfloat16", "dynamic-x8", 65536)
    assert found / prompts < 0.5 and dyn_found / dyn_prompts < 0.5
    assert ("recommendation for 65536 tokens: factor 8, method yarn (caveat: at x8 no method this project "
            f"measured found half the passkeys on SmolLM2-135M (best: yarn {found}/{prompts}))") in text
    assert f"passkey found yarn {found}/{prompts}, dynamic {dyn_found}/{dyn_prompts} (GPU: " in text
    assert "not measured at x8: attention-level methods, perplexity" in text
    source = shlex.quote(str(smollm2_path))  # the commands name SOURCE as given (tests/test_recommend_commands.py)
    assert f"rope-extend eval {source} --spec method=yarn,target_length=65536 " in text.replace("\\ ", "")
    assert f"rope-extend train {source} --method yarn --target-length 65536 " in text.replace("\\ ", "")

    config = load_config(smollm2_path)
    at_2x = recommend(config, 16384)
    assert at_2x.caveat is None
    yarn2 = _passkeys("smollm2-passkey-2x-attn", "yarn-x2", 16384)
    assert any(f"passkey found yarn {yarn2[0]}/{yarn2[1]}, self-extend 20/20" in line for line in at_2x.reasons)
    # dual-chunk's records ran its earlier defaults (local_window L/16, no length scale): quoted as such, not as
    # today's dual-chunk
    dc2 = _passkeys("smollm2-passkey-2x-20", "dual-chunk-x2", 16384)  # its 20 prompts (2x-attn ran 10 of them)
    assert any(f"dual-chunk (its defaults before ChunkLlama 847ae71: L/16, no scale) {dc2[0]}/{dc2[1]}" in line
               for line in at_2x.reasons)
    at_3x = recommend(config, 25000)
    assert at_3x.caveat == "not measured by this project at x3.052"
    assert any(line.startswith("nothing was measured by this project at x3.052 (measured on SmolLM2-135M: x2, x4, "
                               "x8; the nearest below: x2)") for line in at_3x.reasons)


def test_recommend_reads_its_rules_from_the_method_objects(monkeypatch):
    """Which static methods are compared and in what preference, which shipped scheme is kept and each alternative's
    words live on each method's advice adapter (preference, kept_when_shipped, alternative), not in inspect.py:
    changing an adapter changes the recommendation."""
    from rope_extend.methods import advice as method_advice

    config = big_config()
    advice = recommend(config, 12288)
    assert list(advice.costs) == ["yarn", "ntk", "linear", "llama3"] and advice.method == "yarn"
    assert advice.alternatives["dynamic"] == method_advice("dynamic").alternative(6.0, "yarn")
    monkeypatch.setattr(type(method_advice("ntk")), "preference", -1)
    advice = recommend(config, 12288)
    assert list(advice.costs)[0] == advice.method == "ntk"
    assert not any("do not accept" in line for line in advice.reasons)  # yarn is accepted, ntk preferred
    assert any(line.startswith("ntk keeps the fast disks (moves 9") and "temperature" not in line
               for line in advice.reasons)
    assert advice.alternatives["yarn"] == method_advice("yarn").alternative(6.0, "ntk")
    monkeypatch.undo()
    assert recommend(llama3_config(), 65536).method == "llama3"  # Llama 3.x keeps its scheme
    monkeypatch.setattr(type(method_advice("llama3")), "kept_when_shipped", False)
    assert recommend(llama3_config(), 65536).method == "yarn"
