"""The serving-script path: `patch_model` then the model's own `save_pretrained` / `push_to_hub`.

Those saves must write the portable config (both RoPE layouts, identical values), so stock transformers 4.x and 5.x
reload the patched model; `unpatch_model` restores the plain behaviour. The architecture matrix itself (in-memory
patch -> save_pretrained -> stock reload in this line and in the other one) lives in test_matrix.py.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import tiny
import torch

from rope_extend import patch_model, unpatch_model
from rope_extend.compat import TRANSFORMERS_V5
from rope_extend.portable_saves import enable_portable_saves


def _patched(arch="llama", method="yarn"):
    model = tiny.make_model(arch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        patch_model(model, **tiny.spec_kwargs(method, arch))
    return model


@pytest.mark.portability
@pytest.mark.parametrize("method", ["yarn", "ntk", "linear", "llama3"])
def test_save_pretrained_writes_both_layouts_with_identical_values(tmp_path, method):
    model = _patched(method=method)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    parameters, scaling = config["rope_parameters"], config["rope_scaling"]
    assert parameters["rope_theta"] == config["rope_theta"]
    if method == "ntk":  # a plain base change: no scaling dict in 4.x, a raised base in both
        assert scaling is None and parameters["rope_type"] == "default"
        assert config["rope_theta"] > 10000.0
    else:
        assert {k: v for k, v in parameters.items() if k != "rope_theta"} == scaling
    assert config["rope_extend"]["method"] == method
    assert config["max_position_embeddings"] == tiny.SEQ


@pytest.mark.portability
def test_unpatch_restores_plain_saves(tmp_path):
    plain = tiny.make_model("llama")
    plain.save_pretrained(tmp_path / "plain")
    model = _patched()
    unpatch_model(model)
    model.save_pretrained(tmp_path / "unpatched")
    want = json.loads((tmp_path / "plain" / "config.json").read_text())
    got = json.loads((tmp_path / "unpatched" / "config.json").read_text())
    assert got == want


@pytest.mark.portability
def test_nested_text_config_is_rewritten_in_place(tmp_path):
    """A multimodal-style config (text config nested under text_config) gets the portable layout in its text part."""
    from transformers import PretrainedConfig

    from rope_extend import compat

    text = tiny.make_config("llama")
    compat.write_slots(text, {None: {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
                                      "original_max_position_embeddings": 32, "attention_factor": 1.0693147}},
                       64, {"method": "yarn", "spec": {}})

    class Outer(PretrainedConfig):
        model_type = "outer-test"

        def get_text_config(self, *args, **kwargs):
            return self.text_config

    outer = Outer()
    outer.text_config = text
    enable_portable_saves()
    outer.to_json_file(tmp_path / "config.json")
    data = json.loads((tmp_path / "config.json").read_text())
    part = data["text_config"]
    assert part["rope_scaling"]["factor"] == 2.0 and part["rope_theta"] == 10000.0
    assert part["rope_parameters"]["rope_type"] == "yarn"
    assert "rope_scaling" not in data or data.get("rope_scaling") is None  # the outer part is left alone


@pytest.mark.skipif(not TRANSFORMERS_V5, reason="push_to_hub's internals are those of transformers 5.x")
def test_push_to_hub_uploads_the_portable_config(tmp_path, monkeypatch):
    """push_to_hub goes through save_pretrained: the uploaded folder carries both layouts (no network: the Hub
    calls are replaced by recorders)."""
    import transformers.utils.hub as hf_hub_utils

    uploaded = {}

    class FakeApi:
        def create_repo(self, repo_id, **kwargs):
            return type("Repo", (), {"repo_id": repo_id})()

    monkeypatch.setattr(hf_hub_utils, "hf_api", lambda: FakeApi(), raising=False)
    class FakeCard:
        def save(self, path):
            open(path, "w").write("card")

    monkeypatch.setattr(hf_hub_utils, "create_and_tag_model_card", lambda *a, **k: FakeCard(), raising=False)
    model = _patched()

    def record(working_dir, *args, **kwargs):
        uploaded["config"] = json.loads((Path(working_dir) / "config.json").read_text())
        return "ok"

    monkeypatch.setattr(model, "_upload_modified_files", record)
    model.push_to_hub("acme/tiny-yarn")
    config = uploaded["config"]
    assert config["rope_scaling"]["rope_type"] == "yarn" and config["rope_parameters"]["rope_type"] == "yarn"
    assert config["rope_scaling"]["factor"] == tiny.FACTOR


def test_patched_in_memory_equals_reload_after_save_pretrained(tmp_path):
    """Same line, through the stock loader of this process (no rope_extend in the reloading process)."""
    ids = tiny.input_ids()
    model = _patched(method="yarn")
    with torch.no_grad():
        want = model(ids).logits
    model.save_pretrained(tmp_path / "m")
    (got,) = tiny.stock_logits([(tmp_path / "m", ids)], tmp_path / "stock")
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
