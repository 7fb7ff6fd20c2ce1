"""Every method x architecture: patch in memory -> save_pretrained -> stock transformers in a fresh process.

The reloading process blocks `import rope_extend`, so the checkpoint must carry everything. Logits are compared on
FACTOR x the original length (for dynamic-yarn this is exactly where stock static YaRN equals it).
"""

from __future__ import annotations

import os
import warnings

import pytest
import tiny
import torch

from rope_extend import UnsupportedModelError, patch_model

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
