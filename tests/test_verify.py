"""The verification forward's small model: built from the checkpoint's own config with width, MLP, vocabulary,
experts and repeated layers shrunk, it must hold the same rotary modules and attention as the full config builds.

The references are independent of rope-extend's shrinking: the full-width config (on the meta device, so a 70B shape
costs nothing) for the attention modules, and the rotary class instantiated from the full config for the
frequencies.
"""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModel

from rope_extend import compat, patch_model, verify
from rope_extend.rotary import find_rotary_modules

# The Hub fixtures' real config.json files (tests/data/hub/<org>--<name>/) and a MoE one (tests/real_configs/).
HERE = Path(__file__).parent
REAL = {p.parent.name: p for p in (HERE / "data" / "hub").glob("*/config.json")}
REAL.update({p.stem: p for p in (HERE / "real_configs").glob("*.json")})
REAL_CONFIGS = sorted(REAL)
# Attention attributes that follow the model's width (shrunk on purpose); every other plain attribute must match.
WIDTH_ATTRIBUTES = {"config", "layer_idx", "training", "hidden_size", "num_heads", "num_attention_heads",
                    "num_key_value_heads", "num_kv_heads", "embed_dim"}


def real_config(name: str):
    return AutoConfig.for_model(**json.loads(REAL[name].read_text()))


def _build(config, device: str):
    with warnings.catch_warnings(), torch.device(device):
        warnings.simplefilter("ignore")
        return AutoModel.from_config(config, attn_implementation="eager")


def _attention(model) -> list[tuple[str, dict]]:
    out = []
    for module in model.modules():
        if type(module).__name__.endswith("Attention"):
            plain = {k: v for k, v in vars(module).items()
                     if not k.startswith("_") and k not in WIDTH_ATTRIBUTES and isinstance(v, (int, float, str, bool, type(None)))}
            out.append((type(module).__name__, plain))
    return out


def _rotary_from_full_config(module, config):
    for args in ((), (None,)):
        try:
            return type(module)(config, *args)
        except TypeError:
            continue
    raise AssertionError(f"cannot instantiate {type(module).__name__} from the full config")


def assert_small_model_is_faithful(full) -> torch.nn.Module:
    small = verify.small_config(full)
    model = _build(small, "cpu")
    full = compat.text_config(full)  # a multimodal config's text model (Gemma 4's), which verification builds
    reference = copy.deepcopy(full)
    verify._keep_one_layer_per_signature(reference)  # the same layers, at full width, vocabulary and experts
    assert _attention(model) == _attention(_build(reference, "meta"))
    assert _attention(model), "the small model has no attention layer"
    rotary = find_rotary_modules(model)
    assert rotary
    for name, module, prefixes in rotary:
        want = _rotary_from_full_config(module, full)
        for prefix in prefixes:
            torch.testing.assert_close(getattr(module, f"{prefix}inv_freq"), getattr(want, f"{prefix}inv_freq"),
                                       rtol=0, atol=0, msg=f"{name} {prefix}inv_freq")
            assert getattr(module, f"{prefix}attention_scaling") == getattr(want, f"{prefix}attention_scaling")
    return model


@pytest.mark.parametrize("name", REAL_CONFIGS)
def test_small_model_of_a_real_config_has_its_rope_and_attention(name):
    full = real_config(name)
    model = assert_small_model_is_faithful(full)
    # ...at a size that does not follow the checkpoint's (the 70B shape: 2.8M parameters, Gemma-3-1B 5.9M); configs
    # with per-layer head_dim (Gemma 4) keep their widths (`verify._narrow`): one layer of each type, small vocabulary
    # (Gemma 4 E2B: 22M parameters, the unified 12B layout: 44M)
    budget = 5e7 if "_heterogeneity_spec" in vars(compat.text_config(full)) else 1e7
    assert sum(p.numel() for p in model.parameters()) < budget


def test_gemma3_keeps_one_layer_of_each_type_with_its_own_rope():
    small = verify.small_config(real_config("google--gemma-3-1b-pt"))
    assert small.layer_types == ["sliding_attention", "full_attention"]
    assert small.head_dim == 256 and small.num_attention_heads == 4 and small.num_key_value_heads == 1
    assert small.query_pre_attn_scalar == 256 and small.sliding_window == 512
    assert small.vocab_size == verify.PROBE_VOCAB


def test_seventy_b_shape_is_verified_on_a_narrow_model():
    """Llama-3.1-70B: 64 heads over 8 KV heads becomes 8 over 1, head_dim 128 kept, one layer, vocabulary 256."""
    full = real_config("meta-llama--Llama-3.1-70B")
    small = verify.small_config(full)
    assert (small.num_attention_heads, small.num_key_value_heads, small.head_dim) == (8, 1, 128)
    assert (small.num_hidden_layers, small.hidden_size, small.vocab_size) == (1, 1024, verify.PROBE_VOCAB)
    assert small.rope_parameters == full.rope_parameters


def test_verification_of_a_real_shape_catches_a_wrong_patch(monkeypatch):
    """The narrow model still disagrees when rope-extend's frequencies are wrong (so it is not a vacuous check)."""
    from transformers import AutoModelForCausalLM

    config = real_config("Qwen--Qwen2.5-7B")
    small = verify.small_config(config)
    small.max_position_embeddings = 64
    model = AutoModelForCausalLM.from_config(small)
    from rope_extend import plan as planning

    real_compute = planning.PatchPlan.compute
    monkeypatch.setattr(planning.PatchPlan, "compute",
                        lambda self, slot, seq_len=None, device=None: (real_compute(self, slot, seq_len, device)[0] * 1.01,
                                                                       real_compute(self, slot, seq_len, device)[1]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(verify.VerificationError, match="disagree beyond the original length"):
            patch_model(model, method="yarn", factor=4)


# --- the tokenizer and chat templates: what a user loads beside the weights ---------------------------------------
BROKEN_TEMPLATE = "{% for m in messages %}{{ m['content'] }"


@pytest.fixture(scope="module")
def with_tokenizer(tmp_path_factory, smollm2_path):
    """A tiny llama with SmolLM2's real tokenizer files and chat template (chat_template.jinja)."""
    import shutil

    import tiny

    folder = tmp_path_factory.mktemp("tok") / "src"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tiny.make_model("llama").save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy2(Path(smollm2_path) / name, folder / name)
    return folder


def _cli(*args) -> int:
    from rope_extend.cli import run

    return run([str(a) for a in args])


def _one_error(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if not line.startswith("rope-extend: [")]
    assert len(lines) == 1, err
    return lines[0]


def test_verify_refuses_a_tokenizer_that_does_not_load_and_writes_nothing(with_tokenizer, tmp_path, capsys):
    """Issue 57: tokenizer.json truncated to 1000 bytes in OUT. `verify` refused in one line naming the file (it
    printed "verified" and re-signed the record before), nothing is written, and push still refuses the edit."""
    import tiny
    from transformers import AutoTokenizer

    out = tmp_path / "out"
    assert _cli("patch", with_tokenizer, "-o", out, "--method", "yarn", "--factor", "4") == 0
    shipped = (out / "tokenizer.json").read_bytes()
    (out / "tokenizer.json").write_bytes(shipped[:1000])
    with pytest.raises(ValueError):  # what a user of OUT meets (JSONDecodeError)
        AutoTokenizer.from_pretrained(out)
    before = tiny.checksums(out)
    capsys.readouterr()
    assert _cli("verify", out) == 2
    error = _one_error(capsys.readouterr().err)
    assert error.startswith(f"rope-extend: error: OUT {str(out)!r} does not verify as it is now: tokenizer.json is "
                            "not valid JSON ("), error
    assert "nothing was written" in error and tiny.checksums(out) == before
    assert _cli("push", out, "me/m", "--dry-run") == 2
    assert "tokenizer.json (edited)" in _one_error(capsys.readouterr().err)
    (out / "tokenizer.json").write_bytes(shipped)
    assert _cli("verify", out) == 0


def test_verify_names_an_edit_of_config_json_before_building_a_model(with_tokenizer, tmp_path, capsys, monkeypatch):
    """Issue 66 item 7: config.json's rope factor edited from 2 to 3 after patching: `verify` said "factor 3.0 and
    target_length 16384 disagree; give only one of them" (an edited marker) or ran a model to report an inv_freq
    difference (an edited factor). It names the edit, config.json's rope parameters against the patch the marker
    records, without building a model; and an edited marker is named as the marker."""
    import tiny

    from rope_extend import checkpoint

    out = tmp_path / "out"
    assert _cli("patch", with_tokenizer, "-o", out, "--method", "yarn", "--factor", "2") == 0
    original = json.loads((out / "config.json").read_text())

    def no_model(*args, **kwargs):
        raise AssertionError("verify built a model before naming the edit")

    monkeypatch.setattr(checkpoint, "verify_output", no_model)
    edited = copy.deepcopy(original)
    for key in ("rope_parameters", "rope_scaling"):
        edited[key]["factor"] = 3.0
    (out / "config.json").write_text(json.dumps(edited))
    before = tiny.checksums(out)
    capsys.readouterr()
    assert _cli("verify", out) == 2
    printed = capsys.readouterr()
    assert _one_error(printed.err) == (
        f"rope-extend: error: OUT {str(out)!r} does not verify as it is now: config.json's rope parameters no longer "
        "match the record: factor is 3.0 where the patch writes 2.0 (the patch its rope_extend marker records, yarn x2 "
        "over 32 tokens, writes those), so stock loaders would serve another RoPE; nothing was written: restore "
        "config.json, or write OUT again with `rope-extend patch` into a new folder")
    assert "[transformers]" not in printed.err and tiny.checksums(out) == before
    marker = copy.deepcopy(original)
    marker["rope_extend"]["spec"]["factor"] = 3.0
    (out / "config.json").write_text(json.dumps(marker))
    assert _cli("verify", out) == 2
    error = _one_error(capsys.readouterr().err)
    assert ("config.json's rope_extend marker (its record of the patch) was edited and no longer holds together "
            "(factor 3.0 and target_length 64 disagree for original length 32 (3.0 x 32 = 96))") in error
    assert "give only one of them" not in error


@pytest.mark.parametrize("where", ["chat_template.jinja", "tokenizer_config.json", "chat_template.json"])
def test_a_chat_template_that_does_not_compile_is_never_verified(with_tokenizer, tmp_path, capsys, where):
    """Issue 57: a chat template with an unclosed `{{` in any of the places transformers reads one: `patch` from
    that SOURCE refuses (nothing at OUT), in one line naming the file and jinja2's error; a template that
    compiles only in transformers' environment (its `{% generation %}` tag) verifies."""
    import shutil

    source = tmp_path / "src"
    shutil.copytree(with_tokenizer, source)
    if where != "chat_template.jinja":  # one template, in the place tested
        (source / "chat_template.jinja").unlink()
    config = json.loads((source / "tokenizer_config.json").read_text())

    def put(template: str) -> None:
        if where == "tokenizer_config.json":
            (source / where).write_text(json.dumps({**config, "chat_template": template}))
        elif where == "chat_template.json":
            (source / where).write_text(json.dumps({"chat_template": template}))
        else:
            (source / where).write_text(template)

    put(BROKEN_TEMPLATE)
    out = tmp_path / "out"
    capsys.readouterr()
    assert _cli("patch", source, "-o", out, "--method", "yarn", "--factor", "4") == 2
    error = _one_error(capsys.readouterr().err)
    assert f"the chat template in {where} does not compile (TemplateSyntaxError on line 1: " in error, error
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
    put("{% for m in messages %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}")
    assert _cli("patch", source, "-o", out, "--method", "yarn", "--factor", "4") == 0
