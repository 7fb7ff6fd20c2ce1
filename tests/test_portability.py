"""A config written by rope-extend loads to the same model in the *other* transformers line (4.x <-> 5.x).

`make test` runs the suite on 5.x with ROPE_EXTEND_OTHER_PYTHON pointing at the 4.x environment, then the portability
tests on 4.x pointing back at 5.x. Checkpoints are written by `rope-extend patch` (config-only path); logits of the
other line (in a process that cannot import rope_extend) must equal this line's in-memory patched model.
"""

from __future__ import annotations

import json
import os
import warnings

import pytest
import tiny
import torch

from rope_extend import patch_model
from rope_extend.cli import run

pytestmark = pytest.mark.portability

OTHER = os.environ.get("ROPE_EXTEND_OTHER_PYTHON")
needs_other = pytest.mark.skipif(
    not OTHER, reason="set ROPE_EXTEND_OTHER_PYTHON to the other transformers line's python (make test does)"
)


@needs_other
def test_written_configs_load_identically_in_the_other_transformers_line(tmp_path):
    ids = tiny.input_ids()
    jobs, expected, names = [], [], []
    for arch in tiny.ARCHS:
        source = tmp_path / f"src-{arch}"
        tiny.make_model(arch).save_pretrained(source)
        for method in tiny.METHODS:
            # a config must be loadable by both lines: skip what either line's config class refuses
            if (arch, method) in tiny.REFUSED_ANY_LINE:
                continue
            out = tmp_path / f"{arch}-{method}"
            args = ["patch", str(source), "-o", str(out)]
            for key, value in tiny.spec_kwargs(method, arch).items():
                args += ["--method", value] if key == "method" else ["--set", f"{key}={json.dumps(value)}"]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                assert run(args) == 0, (arch, method)
            model = tiny.make_model(arch)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                patch_model(model, **tiny.spec_kwargs(method, arch))
            with torch.no_grad():
                expected.append(model(ids).logits)
            jobs.append((out, ids))
            names.append((arch, method))
    assert len(jobs) >= 60
    other = tiny.stock_logits(jobs, tmp_path / "other", python=OTHER)
    for name, want, got in zip(names, expected, other):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0, msg=lambda m, name=name: f"{name}: {m}")


def test_v5_only_configs_lose_their_scaling_in_4x_which_is_why_both_forms_are_written(tmp_path):
    """Pitfall 7: a config carrying only `rope_parameters` loads in 4.x with the default base and no scaling.
    Our written config carries `rope_scaling` + top-level `rope_theta` as well, with identical values."""
    source = tmp_path / "src"
    tiny.make_model("llama").save_pretrained(source)
    out = tmp_path / "out"
    assert run(["patch", str(source), "--method", "yarn", "--factor", "4", "-o", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    scaling, parameters = config["rope_scaling"], config["rope_parameters"]
    assert parameters["rope_theta"] == config["rope_theta"]
    assert {k: v for k, v in parameters.items() if k != "rope_theta"} == scaling
    assert scaling["attention_factor"] == pytest.approx(1.1386294361)  # always explicit
