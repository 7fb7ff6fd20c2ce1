"""One reader of a model's RoPE facts (`rope_extend.facts.read_rope`), used by plan, eval, inspect and the
checkpoint writer, so they agree about the original length L. Covered through all four front ends for a checkpoint
that already ships `linear` scaling and for a multimodal-style config with a nested text config."""

from __future__ import annotations

import json
import warnings

import pytest
import tiny

from rope_extend import patch_model
from rope_extend.cli import run
from rope_extend.eval.runner import config_window
from rope_extend.eval.variants import original_length as eval_original_length
from rope_extend.facts import read_rope
from rope_extend.files import load_config
from rope_extend.inspect import inspect_rope

pytestmark = pytest.mark.portability

SHIPPED_FACTOR = 2


@pytest.fixture(scope="module")
def linear_source(tmp_path_factory):
    """A checkpoint that ships linear x2 scaling: max_position_embeddings = 2 x its pretraining length 32."""
    from rope_extend import compat

    model = tiny.make_model("llama")
    config = model.config
    compat.write_slots(config, {None: {"rope_type": "linear", "rope_theta": 10000.0, "factor": float(SHIPPED_FACTOR)}},
                       SHIPPED_FACTOR * tiny.ORIGINAL, None)
    path = tmp_path_factory.mktemp("linear") / "src"
    model.save_pretrained(path)
    raw = json.loads((path / "config.json").read_text())
    raw = compat.portable_config_dict(raw, compat.read_slots(config), SHIPPED_FACTOR * tiny.ORIGINAL, None)
    (path / "config.json").write_text(json.dumps(raw))
    return path


@pytest.fixture(scope="module")
def multimodal_source(tmp_path_factory):
    path = tmp_path_factory.mktemp("mm") / "src"
    tiny.make_multimodal_model().save_pretrained(path)
    return path


def test_facts_of_a_linear_checkpoint(linear_source):
    facts = read_rope(load_config(linear_source))
    assert facts.max_position_embeddings == SHIPPED_FACTOR * tiny.ORIGINAL
    assert facts.original_length() == tiny.ORIGINAL
    assert facts.is_scaled and facts.rotary_dims == {None: 16}


def test_linear_checkpoint_patch_eval_inspect_agree_on_the_original_length(linear_source, tmp_path):
    # eval (from the folder and from a loaded model) measures the window the model serves, its linear x2's 64, with
    # the pre-scaling 32 beside it (issue 57 §1)
    window = config_window(linear_source)
    assert (window.length, window.pre_scaling, window.scheme) == (SHIPPED_FACTOR * tiny.ORIGINAL, tiny.ORIGINAL,
                                                                  f"linear x{SHIPPED_FACTOR:g}")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(linear_source)
    assert eval_original_length(model) == SHIPPED_FACTOR * tiny.ORIGINAL
    # inspect (current scheme, then a spec re-derived from L)
    config = load_config(linear_source)
    assert inspect_rope(config).original_length == tiny.ORIGINAL
    view = inspect_rope(config, method="yarn", factor=4)
    assert view.original_length == tiny.ORIGINAL and view.target_length == 4 * tiny.ORIGINAL
    # patch (the checkpoint writer) re-derives yarn x4 from L = 32, not from the shipped 64
    out = tmp_path / "out"
    assert run(["patch", str(linear_source), "--method", "yarn", "--factor", "4", "--set", "replace_existing=true",
                "-o", str(out)]) == 0
    written = json.loads((out / "config.json").read_text())
    assert written["rope_scaling"]["original_max_position_embeddings"] == tiny.ORIGINAL
    assert written["max_position_embeddings"] == 4 * tiny.ORIGINAL
    # and patch_model on the loaded model plans the same
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = patch_model(model, method="yarn", factor=4, replace_existing=True)
    assert report.original_max_position_embeddings == tiny.ORIGINAL
    assert report.new_max_position_embeddings == written["max_position_embeddings"]


def test_nested_text_config_through_patch_eval_inspect(multimodal_source, tmp_path):
    config = load_config(multimodal_source)
    facts = read_rope(config)
    assert facts.model_type == "llama" and facts.original_length() == tiny.ORIGINAL
    assert config_window(multimodal_source).length == tiny.ORIGINAL
    assert inspect_rope(config, method="yarn", factor=4).target_length == 4 * tiny.ORIGINAL
    assert run(["inspect", str(multimodal_source), "--method", "yarn", "--factor", "4"]) == 0
    assert run(["show", str(multimodal_source)]) == 0
    out = tmp_path / "out"
    assert run(["patch", str(multimodal_source), "--method", "yarn", "--factor", "4", "-o", str(out)]) == 0
    written = json.loads((out / "config.json").read_text())
    text = written["text_config"]
    assert text["rope_scaling"]["factor"] == 4.0 and text["rope_parameters"]["rope_type"] == "yarn"
    assert text["max_position_embeddings"] == 4 * tiny.ORIGINAL and "rope_scaling" not in {
        k for k, v in written.items() if v is not None and k == "rope_scaling"
    }
    # the in-memory path (patch_model + the model's own save_pretrained) writes the same text part
    model = tiny.make_multimodal_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        patch_model(model, method="yarn", factor=4)
    model.save_pretrained(tmp_path / "mem")
    mem = json.loads((tmp_path / "mem" / "config.json").read_text())["text_config"]
    for key in ("rope_scaling", "rope_parameters", "rope_theta", "max_position_embeddings"):
        assert mem[key] == text[key], key
