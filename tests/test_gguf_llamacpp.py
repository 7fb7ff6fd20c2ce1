"""A real llama.cpp (built from the llama-cpp-python 0.3.36 sdist) against rope-extend's transformers evaluation, on
the suite's 2-layer model: the demo model's first 2 layers with a 256-token window (`short_window`), and its GGUF
twins (convert_hf_to_gguf.py's f32 file; the demo's Q4_1 file cut to the same 2 layers and window).

The second half of a 512-token window (what ``llama-perplexity -c 512 --chunks 1`` scores: tokens 256..511, every
one beyond the window), the same tokens on both sides (llama.cpp's own tokenisation fed to transformers), compared
token by token: llama.cpp saves every scored token's log-probability (`--kl-divergence-base`), and the two engines
must be identical by the run engines' rule (`runs.compare_logprobs`: every token within 5e-2 nats, their mean within
1e-3). Perplexity alone cannot tell RoPEs apart on a model cut to 2 layers (~3e8 here, moved by a few percent by a
RoPE that moves single tokens by a nat); its log-probabilities can, at every position past the window. Checked:
unpatched, and YaRN, llama3 and NTK x2 in the GGUF rope-extend writes, each identical to transformers running
rope-extend's RoPE and far from the unpatched model; the Q4_1 GGUF patched in place close to transformers on its
dequantised weights; every other route a user has (the llama.cpp flags rope-extend prints, convert_hf_to_gguf.py of
the checkpoint `rope-extend patch` writes) identical to that GGUF in llama.cpp. Planted bugs (a doubled attention
factor, a dropped rope base, a dropped scaling factor) fail the comparison. The same comparisons on the demo model itself at 12k tokens, and past its real 8192-token
window (where the unpatched model degrades), run in `make llamacpp-check` (tests/checks/test_gguf_llamacpp_long.py,
its record in eval/reports/llamacpp-parity-smollm2/). A missing or failed build fails these tests with the build
log's tail.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
import subprocess

import pytest
from helpers import (
    F32_TOLERANCE,
    GGUF_SPECS,
    Q4_TOLERANCE,
    ROUTE_TOLERANCE,
    Parity,
    assert_close,
    gguf_first_layers,
)

pytestmark = pytest.mark.slow

WINDOW = 256  # the short_window model's
CTX = 2 * WINDOW  # llama-perplexity scores tokens 256..511: every one past the window


@pytest.fixture(scope="session")
def parity(llamacpp, short_window, demo_gguf, tmp_path_factory):
    work = tmp_path_factory.mktemp("gguf-parity-short")
    q4 = gguf_first_layers(demo_gguf, work / "short-window.Q4_1.gguf", layers=2, window=WINDOW)
    p = Parity(llamacpp, short_window, work / "short-window.f32.gguf", q4, work, CTX, name="gguf parity, 2 layers",
               logprobs=True)
    yield p
    print("\n" + p.table())


def test_llamacpp_tokens_are_the_text_in_the_transformers_vocabulary(parity):
    """Both sides score llama.cpp's tokenisation. Those ids decode, in the Hugging Face tokenizer, to the text itself
    (same vocabulary: the demo model's), which is why transformers can be fed llama.cpp's ids."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(parity.hf_dir))
    decoded = tok.decode(parity.ids().tolist())
    assert len(decoded) > 1500 and parity.text.read_text(encoding="utf-8").startswith(decoded)


def assert_identical(delta, what: str) -> None:
    assert delta.identical, f"{what}: llama.cpp vs transformers, {delta.describe()}"


def assert_differs(delta, what: str) -> None:
    """A RoPE that differs moves log-probabilities by 0.1 nats and more (else an engine that ignored the scaling
    would pass)."""
    assert delta.max_abs > 0.1, f"{what}: {delta.describe()}"


def test_unpatched_parity(parity):
    assert_identical(parity.compare("unpatched", "unpatched"), "unpatched")
    assert_close(parity.llamacpp("unpatched"), parity.transformers("unpatched"), F32_TOLERANCE)


@pytest.mark.parametrize("method", ["yarn", "llama3", "ntk"])
def test_rope_extend_gguf_parity(parity, method):
    """The GGUF rope-extend writes, run by llama.cpp, gives every scored position the log-probabilities of
    rope-extend's transformers evaluation, and not the unpatched model's."""
    assert_identical(parity.compare(f"{method}:gguf", method), method)
    assert_close(parity.llamacpp(f"{method}:gguf"), parity.transformers(method), F32_TOLERANCE)
    assert_differs(parity.compare("unpatched", method), f"unpatched llama.cpp vs transformers {method}")


@pytest.mark.parametrize(
    ("method", "route"), [("yarn", "flags"), ("yarn", "convert"), ("llama3", "convert"), ("ntk", "flags"), ("ntk", "convert")]
)
def test_other_routes_give_llamacpp_the_same_rope(parity, method, route):
    """Printed flags on the original GGUF / convert_hf_to_gguf.py of the patched checkpoint == rope-extend's GGUF:
    the same llama.cpp perplexity to float noise, the same log-probabilities as transformers."""
    reference = parity.llamacpp(f"{method}:gguf")
    other = parity.llamacpp(f"{method}:{route}")
    assert abs(other - reference) / reference < ROUTE_TOLERANCE, (other, reference)
    assert_identical(parity.compare(f"{method}:{route}", method), f"{method} {route}")


def test_q4_1_gguf_patched_in_place(parity):
    """The demo's Q4_1 file (cut to 2 layers), patched by rope-extend, against transformers on its dequantised
    weights (the short_window checkpoint's): llama.cpp quantises the activations of its Q4_1 dot products to 8 bits
    too, so log-probabilities move by up to MAX_Q4 nats, by MEAN_Q4 on average, less than a RoPE that differs moves
    them (measured: see the constants); the perplexity within 2 %."""
    assert_close(parity.llamacpp("yarn:q4_1"), parity.transformers("yarn"), Q4_TOLERANCE)
    delta = parity.compare("yarn:q4_1", "yarn")
    assert delta.mean_abs < MEAN_Q4 and delta.max_abs < MAX_Q4, delta.describe()
    assert parity.compare("yarn:q4_1", "unpatched").mean_abs > MEAN_Q4


# Measured on 2026-12-07 (llama.cpp 0.3.36's CPU build): the Q4_1 file against transformers YaRN x2, |Δ| max 0.37,
# mean 0.053; against the unpatched model, mean 0.17 (max 1.4). The f32 files: max 0.006, mean 4e-4.
MEAN_Q4, MAX_Q4 = 0.1, 1.0


# --- planted bugs: what the comparisons above catch ------------------------------------------------------------------
# Each rewrites the keys rope-extend plans for YaRN x2 after they were planned and checked (a wrong reading of
# llama.cpp that the port shares would pass that check): the file is written as the bug would write it.
BUGS = {
    # llama.cpp multiplies rope.scaling.attn_factor by YaRN's own 1 + 0.1 ln s: writing the whole factor applies it twice
    "attention factor applied twice": lambda arch: {f"{arch}.rope.scaling.attn_factor": 1 + 0.1 * math.log(2)},
    # llama.cpp's default base (10000) instead of the model's 100000
    "rope base dropped": lambda arch: {f"{arch}.rope.freq_base": None},
    # YaRN without its factor: llama.cpp's frequencies unscaled
    "scaling factor dropped": lambda arch: {f"{arch}.rope.scaling.factor": None},
}


@pytest.mark.parametrize("bug", BUGS)
def test_a_planted_bug_fails_the_parity_check(parity, bug, monkeypatch, tmp_path):
    from rope_extend.gguf import plan as gguf_plan
    from rope_extend.gguf.info import read_gguf_info
    from rope_extend.gguf.write import patch_gguf

    planned = gguf_plan.plan_gguf

    def plan_with_the_bug(info, spec):
        plan = planned(info, spec)
        return dataclasses.replace(plan, keys={**plan.keys, **BUGS[bug](info.architecture)})

    monkeypatch.setattr(gguf_plan, "plan_gguf", plan_with_the_bug)
    written = patch_gguf(parity.base_gguf(), GGUF_SPECS["yarn"], tmp_path / "bug.gguf").out
    bugged, good = read_gguf_info(written), read_gguf_info(parity.gguf_of("yarn:gguf"))
    assert (bugged.freq_base, bugged.scaling) != (good.freq_base, good.scaling)  # the bug is in the file
    _, logprobs = parity.llamacpp_file(written, what=f"llama.cpp yarn with {bug}")
    with pytest.raises(AssertionError, match="llama.cpp vs transformers"):
        assert_identical(parity.compare_with(logprobs, "yarn"), f"yarn with {bug}")


def test_native_builds_compile_ggml_amx_backend_out(llamacpp):
    """The AMX backend that segfaulted stop 27's CI on every Q4_1 run is not in a native build on an AMX CPU: the
    vendored ggml-cpu.cpp, preprocessed for Sapphire Rapids with the build's own C++ flags, no longer registers the
    AMX buffer type, which it does without them (so the check can fail)."""
    from rope_extend.llamacpp_build import cmake_options, is_x86

    flags = [o.split("=", 1)[1] for o in cmake_options(native=True) if o.startswith("-DCMAKE_CXX_FLAGS=")]
    if not is_x86():
        assert flags == []  # no AMX off x86: nothing to compile out
        return
    ggml = llamacpp.src / "ggml"
    base = ["g++", "-std=c++17", "-march=sapphirerapids", f"-I{ggml / 'include'}", f"-I{ggml / 'src'}",
            f"-I{ggml / 'src' / 'ggml-cpu'}", "-E", str(ggml / "src" / "ggml-cpu" / "ggml-cpu.cpp")]
    registered = {}
    for name, extra in (("stock", []), ("rope-extend", shlex.split(flags[0]))):
        out = subprocess.run([*base, *extra], capture_output=True, text=True, check=True).stdout
        registered[name] = "bufts.push_back(ggml_backend_amx_buffer_type())" in out
    assert registered == {"stock": True, "rope-extend": False}
