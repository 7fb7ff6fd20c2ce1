"""patch_model / unpatch_model behaviour on tiny random models."""

from __future__ import annotations

import warnings

import pytest
import tiny
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

from rope_extend import (
    AlreadyScaledError,
    NoExtensionError,
    ShorterWindowError,
    SpecError,
    UnsupportedModelError,
    patch_model,
    unpatch_model,
)
from rope_extend.compat import TRANSFORMERS_V5, read_slots
from rope_extend.errors import ModelConfigError
from rope_extend.patch import find_rotary_modules

pytestmark = pytest.mark.portability


def logits(model, ids=None):
    with torch.no_grad():
        return model(tiny.input_ids() if ids is None else ids).logits


def stock_twin(model):
    """A model freshly built by stock transformers from the (rewritten) config, with the same weights."""
    config = AutoConfig.for_model(**{**model.config.to_dict()})
    twin = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    twin.load_state_dict(model.state_dict())
    return twin


@pytest.mark.parametrize("method", ["linear", "ntk", "dynamic", "yarn", "llama3"])
def test_patch_changes_logits_beyond_original_and_equals_stock_twin(method):
    model = tiny.make_model("llama")
    before = logits(model)
    report = patch_model(model, method=method, factor=4)
    after = logits(model)
    assert report.changed
    assert (after[:, tiny.ORIGINAL :] - before[:, tiny.ORIGINAL :]).abs().max() > 1e-3
    torch.testing.assert_close(after, logits(stock_twin(model)), atol=1e-5, rtol=0)


def test_config_semantics_per_method():
    original = tiny.ORIGINAL
    cases = {
        "linear": ("linear", 4 * original),
        "ntk": ("default", 4 * original),
        "dynamic": ("dynamic", original),  # threshold, never multiplied
        "yarn": ("yarn", 4 * original),
        "llama3": ("llama3", 4 * original),
    }
    for method, (rope_type, max_pos) in cases.items():
        model = tiny.make_model("llama")
        theta = read_slots(model.config)[None]["rope_theta"]
        report = patch_model(model, method=method, factor=4)
        params = read_slots(model.config)[None]
        assert params["rope_type"] == rope_type, method
        assert model.config.max_position_embeddings == max_pos == report.new_max_position_embeddings
        if method == "ntk":
            dim = 16
            assert params["rope_theta"] == pytest.approx(theta * 4 ** (dim / (dim - 2)))
        else:
            assert params["rope_theta"] == theta
        if method == "yarn":
            assert params["attention_factor"] == pytest.approx(0.1 * torch.log(torch.tensor(4.0)).item() + 1)
            assert params["original_max_position_embeddings"] == original


def test_target_length_derives_factor():
    model = tiny.make_model("llama")
    report = patch_model(model, method="yarn", target_length=3 * tiny.ORIGINAL)
    assert report.factor == 3.0 and report.new_max_position_embeddings == 3 * tiny.ORIGINAL


def _registry_spec(method, **length) -> dict:
    """A spec of a registered method with the parameters it needs besides a length (longrope's lists)."""
    from rope_extend.methods import get_method

    kwargs = {"method": method.name, **length}
    if "short_factor" in method.params:
        half = tiny.rotary_dim("llama") // 2
        kwargs.update(short_factor=[1.0] * half, long_factor=[2.0] * half)
    if "local_value" in method.params:  # STRING's W (default 128) below the tiny window of 32
        kwargs.update(local_value=4)
    assert get_method(method.name) is method
    return kwargs


def _plain(value):
    """A plan's field as plain values `==` compares (tensors as their dtype and values, a spec as its dump)."""
    if isinstance(value, torch.Tensor):
        return str(value.dtype), value.tolist()
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(item) for item in value)
    if hasattr(value, "model_dump"):
        return type(value).__name__, value.model_dump()
    return value


def test_a_plan_is_built_complete_then_frozen(monkeypatch):
    """plan_patch builds one PatchPlan, complete, and returns that plan as built (issue 67 item 4: it wrote the
    attention factor into the slots of a plan it had already built, then replaced the plan); using the plan -- its
    RoPE at construction and at the target length, what stock loaders build, applying it to a model and undoing
    it -- writes nothing into it. Every registered method on llama, and the two-slot gemma3_text."""
    import dataclasses

    import rope_extend.plan as plan_module
    from rope_extend.methods import all_methods
    from rope_extend.patch import apply_patch

    def fields(plan) -> dict:
        return {f.name: _plain(getattr(plan, f.name)) for f in dataclasses.fields(plan)}

    built = []

    def build(real=plan_module.PatchPlan, **values):
        built.append(real(**values))
        return built[-1]

    monkeypatch.setattr(plan_module, "PatchPlan", build)
    cases = [("llama", _registry_spec(method, **({} if method.works_inside_window else {"factor": tiny.FACTOR})))
             for method in all_methods()]
    cases += [("gemma3_text", {"method": "yarn", "factor": tiny.FACTOR, "layer_types": ["full_attention"]})]
    for arch, spec in cases:
        model = tiny.make_model(arch)
        model.set_attn_implementation("sdpa")  # what the attention-level methods reach on both transformers lines
        built.clear()
        plan = plan_module.plan_patch(model.config, spec)
        assert len(built) == 1 and built[0] is plan, spec  # one plan, returned as built
        as_built = fields(plan)
        if plan.method.writes_attention_factor:  # the factor stock loaders build, in the slot from the start
            assert as_built["slots"][plan.targets[0]]["attention_factor"] == pytest.approx(plan.attention_factor)
        for target in plan.targets:
            plan.compute(target)
            plan.compute(target, seq_len=plan.spec.target_length)
            plan.expected_stock(target)
        plan.is_identity()
        apply_patch(model, plan)
        unpatch_model(model)
        assert fields(plan) == as_built, spec
    assert len(cases) == len(all_methods()) + 1 >= 12


@pytest.mark.parametrize("factor, words", [(1, "factor 1"), (1.0000001, "1.0000001 x 32 rounds to 32")])
def test_every_method_refuses_a_factor_that_extends_nothing(factor, words):
    """issue 57: factor 1 (and one that rounds to it) reaches no further than the length the method counts from, for
    every registered method, frequency and attention-level alike: refused by the plan in one line naming the reach
    (`x1: 32 -> 32 tokens`) and a way that extends it. STRING, which works inside the window (`works_inside_window`),
    is the one method planned there; every other method needs a factor or a target length."""
    from rope_extend.methods import all_methods
    from rope_extend.plan import plan_patch

    config = tiny.make_config("llama")
    refused = []
    for method in all_methods():
        spec = _registry_spec(method, factor=factor)
        if method.works_inside_window:
            plan = plan_patch(config, spec)
            assert plan.spec.target_length == tiny.ORIGINAL and plan.changed, method.name
            continue
        assert method.needs_factor, f"{method.name} takes no factor, so a spec of it would reach only L"
        with pytest.raises(NoExtensionError) as info:
            plan_patch(config, spec)
        message = str(info.value)
        assert "\n" not in message and f"{method.name} x{factor}: 32 -> 32 tokens extends nothing ({words})" in message
        assert f"--target-length 64 ({method.name} x2 over 32 -> 64 tokens)" in message, message
        assert info.value.fix == {"target_length": 64} and isinstance(info.value, SpecError)
        with pytest.raises(NoExtensionError):
            plan_patch(config, _registry_spec(method, target_length=tiny.ORIGINAL))
        plan = plan_patch(config, _registry_spec(method, target_length=tiny.ORIGINAL + 1))  # one token more: planned
        assert plan.spec.target_length == tiny.ORIGINAL + 1
        refused.append(method.name)
    assert {"yarn", "linear", "longrope", "self-extend", "dual-chunk"} <= set(refused)


def test_same_spec_twice_changes_nothing():
    model = tiny.make_model("llama")
    first = patch_model(model, method="yarn", factor=4)
    config_after_first = model.config.to_dict()
    out_first = logits(model)
    second = patch_model(model, method="yarn", factor=4)
    assert first.changed and not second.changed
    assert model.config.to_dict() == config_after_first
    torch.testing.assert_close(logits(model), out_first, atol=0, rtol=0)


def test_unpatch_restores_modules_and_config_exactly():
    for arch in ("llama", "gemma3_text", "gpt_neox"):
        model = tiny.make_model(arch)
        config_before = model.config.to_dict()
        buffers_before = {n: b.clone() for n, b in model.named_buffers()}
        out_before = logits(model)
        patch_model(model, method="dynamic", factor=4)
        logits(model)  # run the dynamic hook once
        patch_model(model, method="yarn", factor=2, replace_existing=True)
        assert unpatch_model(model)
        assert model.config.to_dict() == config_before
        for name, buffer in model.named_buffers():
            torch.testing.assert_close(buffer, buffers_before[name], atol=0, rtol=0)
        torch.testing.assert_close(logits(model), out_before, atol=0, rtol=0)
        assert not unpatch_model(model)


def test_existing_foreign_scheme_is_refused_then_rederived():
    """A Llama-3.1-style llama3 scheme: never stacked silently."""
    def llama31():
        model = tiny.make_model("llama")
        patch_model(model, method="llama3", factor=2)  # stands in for a checkpoint shipped with llama3
        unpatched_state = model.__dict__.pop("_rope_extend_state")  # forget we did it: a foreign scheme
        del unpatched_state
        delattr(model.config, "rope_extend")
        return model

    model = llama31()
    with pytest.raises(AlreadyScaledError, match="replace_existing"):
        patch_model(model, method="yarn", factor=4)
    # the same scheme again is not an error: nothing to change
    assert not patch_model(model, method="llama3", factor=2).changed
    report = patch_model(model, method="yarn", factor=4, replace_existing=True)
    assert report.original_max_position_embeddings == tiny.ORIGINAL
    # re-derived from the original: equal to yarn applied to the pristine model
    pristine = tiny.make_model("llama")
    patch_model(pristine, method="yarn", factor=4)
    torch.testing.assert_close(logits(model), logits(pristine), atol=0, rtol=0)


def test_our_own_scheme_needs_replace_existing_and_is_rederived_from_the_original():
    model = tiny.make_model("llama")
    patch_model(model, method="ntk", factor=4)
    with pytest.raises(AlreadyScaledError, match="unpatch_model"):
        patch_model(model, method="yarn", factor=8)
    with pytest.raises(ShorterWindowError, match=f"reaches {2 * tiny.ORIGINAL} tokens, shorter than the source's "
                       f"window of {4 * tiny.ORIGINAL}"):  # ntk x4 reached 4 L
        patch_model(model, method="yarn", factor=2, replace_existing=True)
    patch_model(model, method="yarn", factor=8, replace_existing=True)
    direct = tiny.make_model("llama")
    patch_model(direct, method="yarn", factor=8)
    assert read_slots(model.config) == read_slots(direct.config)
    torch.testing.assert_close(logits(model), logits(direct), atol=0, rtol=0)


def test_checkpoint_marker_is_rederived_after_reload(tmp_path):
    """An ntk checkpoint written by rope-extend (rope_theta changed) is not re-scaled on top when reloaded."""
    model = tiny.make_model("llama")
    patch_model(model, method="ntk", factor=4)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert not patch_model(reloaded, method="ntk", factor=4).changed
    with pytest.raises(AlreadyScaledError):
        patch_model(reloaded, method="ntk", factor=8)


def test_meta_device_init_and_device_map_loading(tmp_path):
    """Rotary buffers left uninitialised by meta-device init are rebuilt on the model's device."""
    source = tiny.make_model("llama")
    source.save_pretrained(tmp_path)
    reference = tiny.make_model("llama")
    patch_model(reference, method="yarn", factor=4)
    want = logits(reference)

    loaded = AutoModelForCausalLM.from_pretrained(
        tmp_path, device_map="cpu", low_cpu_mem_usage=True, attn_implementation="eager"
    ).eval()
    patch_model(loaded, method="yarn", factor=4)
    torch.testing.assert_close(logits(loaded), want, atol=1e-5, rtol=0)

    with torch.device("meta"):
        empty = AutoModelForCausalLM.from_config(tiny.make_config("llama"), attn_implementation="eager")
    empty = empty.to_empty(device="cpu").eval()  # buffers hold garbage now
    empty.load_state_dict(source.state_dict())
    for _, module, prefixes in find_rotary_modules(empty):
        for prefix in prefixes:
            getattr(module, f"{prefix}inv_freq").fill_(float("nan"))
    patch_model(empty, method="yarn", factor=4)
    torch.testing.assert_close(logits(empty), want, atol=1e-5, rtol=0)


def test_keeps_buffer_dtype_and_device():
    model = tiny.make_model("llama").to(torch.bfloat16)
    _, module, _ = find_rotary_modules(model)[0]
    dtype = module.inv_freq.dtype
    patch_model(model, method="yarn", factor=4)
    assert module.inv_freq.dtype == dtype and module.inv_freq.device.type == "cpu"


def test_dynamic_yarn_warns_when_saved_and_restores_from_marker(tmp_path):
    model = tiny.make_model("llama")
    short = tiny.input_ids(tiny.ORIGINAL - 4)
    original_short = logits(model, short)
    with warnings.catch_warnings(record=True) as caught:  # the user just called patch_model: nothing to tell yet
        warnings.simplefilter("always")
        report = patch_model(model, method="dynamic-yarn", factor=4)
    assert not [w for w in caught if "stock loaders" in str(w.message)]
    assert any("not reproduced by stock loaders" in note for note in report.warnings)  # kept in the report
    # below the original length dynamic YaRN is exactly the original model
    torch.testing.assert_close(logits(model, short), original_short, atol=0, rtol=0)
    long_logits = logits(model)
    with pytest.warns(UserWarning, match=r"saved .*: stock loaders .* load it as static yarn x4 \(equal to "
                      r"dynamic-yarn only at 128 tokens\); call rope_extend.patch_model\(model\) after loading"):
        model.save_pretrained(tmp_path)
    static = tiny.make_model("llama")
    patch_model(static, method="yarn", factor=4)
    with warnings.catch_warnings(record=True) as caught:  # a method stock loaders load as it is: no warning
        warnings.simplefilter("always")
        static.save_pretrained(tmp_path / "yarn")
    assert not [w for w in caught if "stock loaders" in str(w.message)]
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert reloaded.config.rope_extend["method"] == "dynamic-yarn"
    # stock loading = static YaRN: differs below the original length
    assert (logits(reloaded, short) - original_short).abs().max() > 1e-4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        patch_model(reloaded)  # no spec: re-apply the checkpoint's marker
    torch.testing.assert_close(logits(reloaded, short), original_short, atol=1e-6, rtol=0)
    torch.testing.assert_close(logits(reloaded), long_logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "model_type, why",
    [("gpt2", "learned absolute position embeddings"), ("bloom", "ALiBi")],
)
def test_models_without_rope_are_refused(model_type, why):
    config = AutoConfig.for_model(model_type, n_embd=64, n_layer=1, n_head=4, hidden_size=64, n_head_kv=4, vocab_size=64)
    model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(UnsupportedModelError, match=why):
        patch_model(model, method="yarn", factor=2)


def test_nope_configs_of_a_rope_capable_type_are_refused_in_one_line():
    """Granite 4.0-H (granitemoehybrid) defaults to position_embedding_type None: no rotary module is built."""
    pytest.importorskip("transformers.models.granitemoehybrid")
    config = tiny.zoo_config("granitemoehybrid")
    config.position_embedding_type = None
    model = AutoModelForCausalLM.from_config(config)
    before = model.config.to_dict()
    with pytest.raises(UnsupportedModelError, match="position_embedding_type None: its layers use no rotary") as err:
        patch_model(model, method="yarn", factor=2)
    assert "\n" not in str(err.value) and "'rope' can be extended" in str(err.value)
    assert model.config.to_dict() == before


def test_layer_types_that_match_nothing_are_a_spec_error():
    model = tiny.make_model("gemma3_text")
    with pytest.raises(SpecError, match="layer_types"):
        patch_model(model, method="yarn", factor=2, layer_types=["chunked_attention"])


def test_gemma3_can_scale_sliding_layers_when_asked():
    model = tiny.make_model("gemma3_text")
    if not TRANSFORMERS_V5:  # 4.x builds Gemma 3's local RoPE as plain RoPE whatever the config says
        with pytest.raises(UnsupportedModelError, match="sliding_attention"):
            patch_model(model, method="linear", factor=2, layer_types=["full_attention", "sliding_attention"])
        return
    report = patch_model(model, method="linear", factor=2, layer_types=["full_attention", "sliding_attention"])
    slots = read_slots(model.config)
    assert slots["full_attention"]["rope_type"] == slots["sliding_attention"]["rope_type"] == "linear"
    assert len(report.modules) == 2
    torch.testing.assert_close(logits(model), logits(stock_twin(model)), atol=1e-5, rtol=0)


# --- a config the model cannot run, judged by running the installed transformers ----------------------------------
def _runs(config, seed: int = 0):
    """The model stock transformers builds from `config` (eager, seeded) and whether it runs 2 L tokens."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    try:
        logits(model, tiny.input_ids(2 * tiny.ORIGINAL))
    except RuntimeError:  # the modeling code's shape mismatch between the rotated and the unrotated head dims
        return model, False
    return model, True


@pytest.mark.parametrize("rope", ["default", "linear-x1"])
def test_a_stray_partial_rotary_factor_is_judged_by_what_transformers_runs(rope):
    """Llama's attention rotates the whole head, so a partial_rotary_factor in its config.json is stray. What that
    does is asked of the installed transformers, as patch_model asks it: 4.x's default RoPE applies the factor, so the
    model cannot run even unpatched; 5.x's Llama default RoPE ignores it but its scaled RoPE (linear, yarn) applies
    it. patch_model must succeed and equal transformers' own YaRN x2 where that runs, and otherwise refuse naming the
    field, saying truly whether the model runs unpatched, and change nothing."""
    data = {**tiny.make_config("llama").to_dict(), "partial_rotary_factor": 0.5}
    if rope == "linear-x1":  # an existing (identity) scaled RoPE: the factor applies before patching too
        if TRANSFORMERS_V5:
            data["rope_parameters"] = {"rope_type": "linear", "factor": 1.0, "rope_theta": 10000.0,
                                       "partial_rotary_factor": 0.5}
        else:
            data["rope_scaling"] = {"rope_type": "linear", "factor": 1.0}
    config = type(tiny.make_config("llama")).from_dict(data)
    model, runs = _runs(config)
    _, own_yarn_runs = _runs(tiny.zoo_reference(config))
    weights, before = {k: v.clone() for k, v in model.state_dict().items()}, model.config.to_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if own_yarn_runs:
            patch_model(model, method="yarn", factor=2, replace_existing=True)
            reference, _ = _runs(tiny.zoo_reference(config))
            reference.load_state_dict(weights)
            ids = tiny.input_ids(2 * tiny.ORIGINAL)
            torch.testing.assert_close(logits(model, ids), logits(reference, ids), atol=1e-5, rtol=0)
            return
        with pytest.raises(ModelConfigError) as refused:
            patch_model(model, method="yarn", factor=2, replace_existing=True)
    message = str(refused.value)
    assert (refused.value.field, refused.value.value) == ("partial_rotary_factor", 0.5)
    assert ("the model runs unpatched" in message) == runs, message
    assert ("even before patching" in message) == (not runs), message
    assert "remove partial_rotary_factor from config.json" in message and "\n" not in message
    if runs:  # "ignores" only when measured: the same weights without the field give the same logits
        without, _ = _runs(type(config).from_dict({k: v for k, v in data.items() if k != "partial_rotary_factor"}))
        without.load_state_dict(weights)
        same = torch.equal(logits(model), logits(without))
        assert ("ignores (its outputs are the same without it)" in message) == same, message
    assert model.config.to_dict() == before and all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())


def test_verification_keeps_the_layer_sections_of_the_real_model():
    """Dory slices its stack into input / recurrent (looped) / output sections by n_input_layers, n_recurrent_layers
    and n_output_layers. Verification's small model keeps one layer per layer type in each section, with counts that
    add up, so it runs the real model's forward at the first shrink level (it used to keep one per layer type overall,
    whose counts did not add up, and fell back to every layer); the patch equals transformers' own YaRN x2."""
    pytest.importorskip("transformers.models.dory")
    from rope_extend import small_model, verify
    from rope_extend.compat import stock_config
    from rope_extend.plan import plan_patch

    config = AutoConfig.for_model(
        "dory", hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
        vocab_size=tiny.VOCAB, max_position_embeddings=tiny.ORIGINAL, sliding_window=8, initializer_range=0.2,
        num_hidden_layers=12, n_input_layers=4, n_output_layers=4,  # layer types: full every 4th (class default)
    )
    small = small_model.small_config(config)
    assert (small.n_input_layers, small.n_recurrent_layers, small.n_output_layers) == (2, 2, 2)
    assert small.layer_types == ["sliding_attention", "full_attention"] * 3 and small.num_hidden_layers == 6
    plan = plan_patch(config, {"method": "yarn", "factor": 2})
    _, stock, _ = verify.small_run(config, stock_config(config, plan.slots, plan.max_position_embeddings,
                                                         plan.marker), plan)
    assert len(stock.layers) == 6  # the first level (narrow, one layer per signature and section) ran

    model, runs = _runs(config)
    reference, own_yarn_runs = _runs(tiny.zoo_reference(config))
    assert runs and own_yarn_runs
    reference.load_state_dict(model.state_dict())
    ids = tiny.input_ids(tiny.ZOO_SEQ)
    unpatched = logits(model, ids)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        patch_model(model, method="yarn", factor=2)
    patched = logits(model, ids)
    assert (patched - unpatched)[:, tiny.ZOO_ORIGINAL:].abs().max() > 1e-3
    torch.testing.assert_close(patched, logits(reference, ids), atol=1e-5, rtol=0)


PROPORTIONAL_ONLY = ("linear", "ntk")  # what transformers' proportional RoPE reads: a factor, a rope_theta
needs_proportional = pytest.mark.skipif(  # (transformers 4.x has neither type)
    not {"gemma4_text", "lfm3"} <= set(CONFIG_MAPPING_NAMES),
    reason="this transformers has no Gemma 4 / LFM3 (proportional RoPE) config classes")


@needs_proportional
@pytest.mark.parametrize("model_type", ["gemma4_text", "lfm3"])
def test_proportional_rope_refuses_every_other_method_in_one_line(model_type):
    """Gemma 4's and LFM3's full-attention layers (proportional RoPE) take linear and ntk (exact: test_matrix);
    every other method is a SpecError naming the method, why, and both fixes, before anything changes."""
    from rope_extend import plan_patch
    from rope_extend.methods import get_method, method_names

    config = tiny.zoo_config(model_type)
    before = config.to_dict()
    others = [name for name in method_names() if name not in PROPORTIONAL_ONLY]
    assert len(others) >= 9
    for name in others:
        with pytest.raises(SpecError) as caught:
            plan_patch(config, method=name, factor=2)
        message = str(caught.value)
        assert "\n" not in message and caught.value.field == "method" and caught.value.value == name
        assert f"model type {model_type!r}: its full_attention layers use proportional RoPE" in message
        assert f"; {name} cannot be written there (" in message
        assert message.endswith("): use --method linear or --method ntk"), message
        if get_method(name).acts_on_attention:
            assert "remaps attention" in message
    assert config.to_dict() == before
    for name in PROPORTIONAL_ONLY:
        assert plan_patch(config, method=name, factor=2).changed


@needs_proportional
def test_a_proportional_slot_with_a_factor_is_a_linear_scaling():
    """transformers divides every proportional frequency by the slot's `factor`: a config that ships one is scaled
    (its original length is max_position_embeddings / factor), and a patch on top asks to replace it."""
    from rope_extend import plan_patch
    from rope_extend.facts import read_rope

    config = tiny.zoo_config("lfm3")
    config.rope_parameters["full_attention"]["factor"] = 2.0
    facts = read_rope(config)
    assert facts.is_scaled and facts.original_length() == tiny.ZOO_ORIGINAL // 2
    with pytest.raises(AlreadyScaledError, match="replace_existing"):
        plan_patch(config, method="ntk", factor=4)
    plan = plan_patch(config, method="ntk", factor=4, replace_existing=True)
    assert "factor" not in plan.slots["full_attention"] and plan.spec.original_max_position_embeddings == 16
