"""Every method x architecture: patch in memory -> save_pretrained -> stock transformers in a fresh process.

The reloading process blocks `import rope_extend`, so the checkpoint must carry everything. Logits are compared on
FACTOR x the original length (for dynamic-yarn this is exactly where stock static YaRN equals it).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import tiny
import torch
import transformers
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

from rope_extend import UnsupportedModelError, patch_model
from rope_extend.compat import TRANSFORMERS_V5

pytestmark = pytest.mark.portability
OTHER = os.environ.get("ROPE_EXTEND_OTHER_PYTHON")


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """Patch and save every (method, arch) once; one stock process reloads them all."""
    root = tmp_path_factory.mktemp("matrix")
    ids = tiny.input_ids()
    cases, jobs = {}, []
    for arch in tiny.ARCHS:
        model = tiny.make_model(arch)
        with torch.no_grad():
            unpatched = model(ids).logits
        for method in tiny.METHODS:
            if (arch, method) in tiny.REFUSED:
                continue
            model = tiny.make_model(arch)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                report = patch_model(model, **tiny.spec_kwargs(method, arch))
            with torch.no_grad():
                patched = model(ids).logits
            path = root / f"{arch}-{method}"
            model.save_pretrained(path)
            cases[(arch, method)] = (patched, unpatched, report, len(jobs))
            jobs.append((path, ids))
    stock = tiny.stock_logits(jobs, root / "stock")
    # The other transformers line (4.x when this is 5.x, and back): the same saved folders, its own stock loader.
    other_line = {}
    if OTHER:
        both = [key for key in cases if key not in tiny.REFUSED_ANY_LINE]
        logits = tiny.stock_logits([jobs[cases[key][3]] for key in both], root / "other", python=OTHER)
        other_line = dict(zip(both, logits))
    return {
        key: (patched, unpatched, report, stock[i], other_line.get(key))
        for key, (patched, unpatched, report, i) in cases.items()
    }


@pytest.mark.parametrize("arch", list(tiny.ARCHS))
@pytest.mark.parametrize("method", tiny.METHODS)
def test_patched_in_memory_equals_stock_reload(matrix, arch, method):
    if (arch, method) in tiny.REFUSED:
        model = tiny.make_model(arch)
        before = model.config.to_dict()
        with pytest.raises(UnsupportedModelError, match=f"reject method '{method}'"):
            patch_model(model, **tiny.spec_kwargs(method, arch))
        assert model.config.to_dict() == before  # nothing half-applied
        return
    patched, unpatched, report, stock, _ = matrix[(arch, method)]
    assert report.changed and report.modules
    # the patch really changed the model beyond the original window...
    assert (patched[:, tiny.ORIGINAL :] - unpatched[:, tiny.ORIGINAL :]).abs().max() > 1e-4
    # ...and stock transformers rebuilds exactly the same model from the saved checkpoint
    torch.testing.assert_close(stock, patched, atol=1e-5, rtol=0)


@pytest.mark.skipif(not OTHER, reason="set ROPE_EXTEND_OTHER_PYTHON to the other transformers line (make test does)")
@pytest.mark.parametrize("arch", list(tiny.ARCHS))
@pytest.mark.parametrize("method", tiny.METHODS)
def test_in_memory_saves_reload_identically_in_the_other_line(matrix, arch, method):
    """patch_model + the model's own save_pretrained, reloaded by the *other* transformers line's stock loader:
    the same logits (configs one of the lines' config classes refuses are excluded)."""
    if (arch, method) in tiny.REFUSED_ANY_LINE:
        assert (arch, method) not in matrix or matrix[(arch, method)][4] is None
        return
    patched, _, _, _, other = matrix[(arch, method)]
    assert other is not None
    torch.testing.assert_close(other, patched, atol=1e-5, rtol=0)


@pytest.mark.parametrize("method", tiny.METHODS)
def test_per_layer_type_models_keep_sliding_rope(method):
    """Gemma 3: only full-attention layers are rescaled by default; the local RoPE is untouched."""
    model = tiny.make_model("gemma3_text")
    from rope_extend.compat import read_slots

    before = read_slots(model.config)["sliding_attention"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = patch_model(model, **tiny.spec_kwargs(method, "gemma3_text"))
    after = read_slots(model.config)
    assert after["sliding_attention"] == before
    assert all("sliding" not in name for name in report.modules)
    assert any(name.endswith("[full_attention]") or "local" not in name for name in report.modules)


# --- every RoPE causal-LM type of the running transformers (generated from its registry at test time) ------------
ZOO = tiny.zoo_types()


def _zoo_case(model_type: str, layer_types: list[str] | None = None, method: str = "yarn") -> dict:
    """Patch a tiny random model of the type with yarn (or `method`) x2 (rope-extend) and build transformers' own
    one with the same weights (of `layer_types`' one slot when given); logits on 1.5 L tokens."""
    ids = tiny.input_ids(tiny.ZOO_SEQ)
    if model_type in tiny.ZOO_NOT_ATTEMPTED:
        return {"unbuilt": "not attempted (tiny.ZOO_NOT_ATTEMPTED)"}
    try:
        model = tiny.zoo_model(model_type)
    except Exception as exc:  # recorded and asserted against the reviewed list
        return {"unbuilt": f"{type(exc).__name__}: {exc}"}
    before = model.config.to_dict()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            patch_model(model, method=method, factor=tiny.ZOO_FACTOR,
                        **({"layer_types": layer_types} if layer_types else {}))
        except Exception as exc:  # asserted in the test
            return {"refused": exc, "unchanged": model.config.to_dict() == before}
        try:
            with torch.no_grad():
                patched = model(ids).logits
            unpatched_model = tiny.zoo_model(model_type)
            with torch.no_grad():
                unpatched = unpatched_model(ids).logits
            reference = type(unpatched_model)._from_config(tiny.zoo_reference(unpatched_model.config,
                                                                              *(layer_types or ["full_attention"]),
                                                                              method=method),
                                                           attn_implementation="eager").eval().float()
            reference.load_state_dict(weights, strict=True)
            with torch.no_grad():
                stock = reference(ids).logits
        except Exception as exc:  # asserted in the test (a type whose patched or reference model does not run)
            return {"failed": f"{type(exc).__name__}: {exc}"}
    return {"patched": patched, "unpatched": unpatched, "stock": stock}


class _Zoo(dict):
    """Each type's case, computed when a test first asks for it (so `-k` selects the work too)."""

    def __missing__(self, model_type):
        self[model_type] = _zoo_case(model_type)
        return self[model_type]


@pytest.fixture(scope="module")
def zoo():
    opened = sum(t in tiny.ZOO_OPEN for t in ZOO)
    refused = sum(t in tiny.ZOO_REFUSED and t not in tiny.ZOO_OPEN for t in ZOO)  # an open type counts as open
    print(f"\nzoo (transformers {transformers.__version__}): {len(ZOO)} RoPE causal-LM types: "
          f"{len(ZOO) - opened - refused} expected exact, {refused} expected refused, {opened} open")
    return _Zoo()


@pytest.mark.parametrize("model_type", ZOO)
def test_every_rope_model_type_is_exact_versus_its_own_yarn_or_refused_in_one_line(zoo, model_type):
    result = zoo[model_type]
    if model_type in tiny.ZOO_OPEN:
        try:
            _check_zoo_case(model_type, result)
        except AssertionError:
            pytest.xfail(f"open: {tiny.ZOO_OPEN[model_type]}")
        raise AssertionError(f"{model_type} works now: take it off tiny.ZOO_OPEN")
    _check_zoo_case(model_type, result)


@pytest.mark.parametrize("model_type", [t for t in tiny.ZOO_LAYER_TYPES if t in ZOO])
def test_refused_types_are_exact_with_the_layer_types_their_message_names(zoo, model_type):
    """The refusal's "what would work" is true: with those layer_types the patch equals transformers' own YaRN x2
    of that slot."""
    want = tiny.ZOO_LAYER_TYPES[model_type]
    assert f"use e.g. layer_types: [{want[0]}]" in str(zoo[model_type].get("refused"))
    _check_zoo_case(model_type, _zoo_case(model_type, want), refused=False)


@pytest.mark.parametrize("model_type", [t for t in ("olmo3",) if t in ZOO])
def test_full_attention_scaling_types_are_exact_with_linear_too(model_type):
    """OLMo 3 (compat.FULL_ATTENTION_SCALING): a config.json rope_scaling reaches only its full-attention layers,
    so linear x2 is exact versus transformers' own on both lines (4.x's config validates rope_type, not the
    OLMo / OLMo 2 {type, factor} dialect)."""
    _check_zoo_case(model_type, _zoo_case(model_type, method="linear"), refused=False)


def _check_zoo_case(model_type: str, result: dict, refused: bool | None = None) -> None:
    assert "unbuilt" not in result, result.get("unbuilt")
    if refused is None:
        refused = model_type in tiny.ZOO_REFUSED
    if refused:
        want, _why = tiny.ZOO_REFUSED[model_type]
        error = result.get("refused")
        assert error is not None, f"{model_type} is patched now: take it off tiny.ZOO_REFUSED"
        assert isinstance(error, ValueError), repr(error)
        assert "\n" not in str(error) and want in str(error), str(error)
        assert result["unchanged"]
        return
    assert "refused" not in result, f"{type(result['refused']).__name__}: {result['refused']}"
    assert "failed" not in result, result.get("failed")
    patched, unpatched, stock = result["patched"], result["unpatched"], result["stock"]
    beyond = slice(tiny.ZOO_ORIGINAL, None)
    scale = float(stock.abs().max())
    # the patch moves the logits beyond L clearly (std 0.2 init)...
    assert float((patched - unpatched)[:, beyond].abs().max()) > 1e-3 * max(scale, 1.0)
    # ...to exactly transformers' own YaRN x2 of this architecture
    assert float((patched - stock).abs().max()) <= 1e-5 * max(scale, 1.0)


DOCS = Path(__file__).parent.parent / "docs" / "architectures.md"


@pytest.mark.skipif(not TRANSFORMERS_V5, reason="docs/architectures.md describes the pinned transformers 5.x line")
def test_architectures_page_is_current():
    """docs/architectures.md's table is the zoo's expected outcome, which the test above asserts type by type
    (ROPE_EXTEND_UPDATE_DOCS=1 rewrites it)."""
    outcomes = {t: "unbuilt" if t in tiny.ZOO_OPEN else "refused" if t in tiny.ZOO_REFUSED else "exact" for t in ZOO}
    table = tiny.zoo_table(outcomes)
    text = DOCS.read_text(encoding="utf-8")
    head, rest = text.split(tiny.DOCS_BEGIN + "\n", 1)
    tail = rest.split(tiny.DOCS_END, 1)[1]
    if os.environ.get("ROPE_EXTEND_UPDATE_DOCS"):
        DOCS.write_text(head + tiny.DOCS_BEGIN + "\n" + table + tiny.DOCS_END + tail, encoding="utf-8")
    assert rest.split(tiny.DOCS_END, 1)[0] == table, "docs/architectures.md is stale: rerun with ROPE_EXTEND_UPDATE_DOCS=1"


# --- proportional RoPE (Gemma 4, LFM3): linear and ntk, exact against transformers' own rotary module ---------------
REAL_CONFIGS = Path(__file__).parent / "real_configs"
# real-shaped config.json files (their `_provenance` says where each value comes from) of every proportional type
PROPORTIONAL = {"gemma4": "gemma4-e2b-it", "gemma4_text": "gemma4_text-e2b", "gemma4_unified": "gemma4_unified-12b-it",
                "gemma4_unified_text": "gemma4_unified_text-12b", "lfm3": "lfm3-1.7b"}
PROPORTIONAL_FACTOR = 4.0
# (transformers 4.x has none of these types)
needs_proportional = pytest.mark.skipif(
    not set(PROPORTIONAL) <= set(CONFIG_MAPPING_NAMES),
    reason=f"transformers {transformers.__version__} has no Gemma 4 / LFM3 (proportional RoPE) config classes")


def _real_config(name: str):
    return transformers.AutoConfig.for_model(**json.loads((REAL_CONFIGS / f"{name}.json").read_text()))


def _rotary_module(text_config):
    """The model's own rotary embedding built from `text_config` (its class found on a meta-device model)."""
    from rope_extend.rotary import find_rotary_modules

    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        meta = transformers.AutoModel.from_config(text_config)
    (_, module, _), = find_rotary_modules(meta)
    return type(module)(text_config)


def _proportional_frequencies(params: dict, head_dim: int, method: str, factor: float) -> torch.Tensor:
    """The paper formulas, written out: proportional RoPE (the first int(p * head_dim // 2) frequencies
    theta^(-2i/head_dim) rotate, the rest are 0) under position interpolation (every frequency / s) or NTK-aware
    scaling (theta * s^(d/(d-2)), d the dimension the frequencies are spread over: head_dim)."""
    theta = params["rope_theta"]
    if method == "ntk":
        theta = theta * factor ** (head_dim / (head_dim - 2))
    rotating = int(params.get("partial_rotary_factor", 1.0) * head_dim // 2)
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    inv_freq = torch.where(i < rotating, theta ** (-2 * i / head_dim), torch.zeros_like(i))
    return inv_freq / (factor if method == "linear" else 1.0)


@needs_proportional
@pytest.mark.parametrize("model_type", list(PROPORTIONAL))
@pytest.mark.parametrize("method", ["linear", "ntk"])
def test_proportional_rope_takes_linear_and_ntk_exactly(model_type, method):
    """Each layer type's frequencies, cos and sin in the model's own rotary module, built by stock transformers from
    the config.json rope-extend writes for a real-shaped config: the formula's, and rope-extend's plan's bit for
    bit; the sliding layers' untouched."""
    from rope_extend import compat, plan_patch

    config = _real_config(PROPORTIONAL[model_type])
    assert config.model_type == model_type
    text = compat.text_config(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = plan_patch(config, method=method, factor=PROPORTIONAL_FACTOR)
        written = compat.text_config(compat.stock_config(text, plan.slots, plan.max_position_embeddings, plan.marker))
    assert plan.targets == ("full_attention",)
    assert written.rope_parameters["full_attention"]["rope_type"] == "proportional"
    rotary, original = _rotary_module(written), _rotary_module(text)
    positions = torch.tensor([[0, 1, 7, 1000, 40000, 4 * 131072 - 1]])
    seen = 0
    for slot, params in compat.read_slots(text).items():
        if not hasattr(rotary, f"{slot}_inv_freq"):
            continue
        seen += 1
        got = getattr(rotary, f"{slot}_inv_freq")
        if slot in plan.targets:
            head_dim = compat.rotary_dim(text, {"partial_rotary_factor": 1.0}, slot)
            want = _proportional_frequencies(params, head_dim, method, PROPORTIONAL_FACTOR)
            torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)
            assert torch.equal(got, plan.compute(slot)[0])
            assert int((got == 0).sum()) == head_dim // 2 - int(params["partial_rotary_factor"] * head_dim // 2) > 0
        else:
            assert torch.equal(got, getattr(original, f"{slot}_inv_freq"))
        cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions, slot)
        angles = positions[..., None].float() * got
        torch.testing.assert_close(cos, torch.cat((angles, angles), -1).cos(), rtol=0, atol=0)
        torch.testing.assert_close(sin, torch.cat((angles, angles), -1).sin(), rtol=0, atol=0)
        if slot in plan.targets:  # and the patch moved them
            assert not torch.equal(cos, original(torch.zeros(1), positions, slot)[0])
    assert seen == 2


@pytest.fixture(scope="module")
def proportional_reloads(tmp_path_factory):
    """Tiny random models of each proportional type patched in memory with linear and ntk x2, saved, and reloaded
    by stock transformers in one fresh process that cannot import rope_extend."""
    root = tmp_path_factory.mktemp("proportional")
    ids = tiny.input_ids(tiny.ZOO_SEQ)
    cases, jobs = {}, []
    for model_type in PROPORTIONAL:
        for method in ("linear", "ntk"):
            model = tiny.zoo_model(model_type)
            with torch.no_grad():
                unpatched = model(ids).logits
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                patch_model(model, method=method, factor=tiny.ZOO_FACTOR)
            with torch.no_grad():
                patched = model(ids).logits
            model.save_pretrained(root / f"{model_type}-{method}")
            cases[(model_type, method)] = (patched, unpatched, len(jobs))
            jobs.append((root / f"{model_type}-{method}", ids))
    stock = tiny.stock_logits(jobs, root / "stock")
    return {key: (patched, unpatched, stock[i]) for key, (patched, unpatched, i) in cases.items()}


@needs_proportional
@pytest.mark.parametrize("model_type", list(PROPORTIONAL))
@pytest.mark.parametrize("method", ["linear", "ntk"])
def test_proportional_checkpoints_reload_identically_in_stock_transformers(proportional_reloads, model_type, method):
    patched, unpatched, stock = proportional_reloads[(model_type, method)]
    scale = max(float(stock.abs().max()), 1.0)
    assert float((patched - unpatched)[:, tiny.ZOO_ORIGINAL:].abs().max()) > 1e-3 * scale
    assert float((patched - stock).abs().max()) <= 1e-5 * scale
