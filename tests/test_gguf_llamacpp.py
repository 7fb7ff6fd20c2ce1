"""A real llama.cpp (built from the llama-cpp-python 0.3.36 sdist) against rope-extend's transformers evaluation.

Perplexity of the second half of a 12k-token window (what ``llama-perplexity -c 12288 --chunks 1`` scores: tokens
6144..12287, a third of them beyond the window) on the demo model (native window 8192), the same tokens on both
sides (llama.cpp's own tokenisation fed to transformers): unpatched and YaRN x2 in the GGUF rope-extend writes,
within 1 %, and the demo's Q4_1 GGUF patched in place within a looser bound (its 2 % is more than YaRN x2 changes
a 4k window: 2.2 %). llama3 x2 and NTK x2 within 1 % on a 4096-token window: their RoPE acts alike at every position
(a frequency table, no position-dependent term), the 12k rows already show that llama.cpp and transformers agree
far out, and the short window costs about a fifth of a 12k run. Every other route a
user has (the llama.cpp flags rope-extend prints, convert_hf_to_gguf.py of the checkpoint `rope-extend patch`
writes) must give llama.cpp the same RoPE as that GGUF: the same llama.cpp perplexity on a 2048-token window (RoPE
parameters act at every position, so a route that differs shows there at a fraction of the cost). A missing or
failed build fails these tests with the build log's tail.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

# 1.5x the native window: past it, at ~55 % of a 16k run's cost (attention dominates a 135M model's long forward).
# ROPE_EXTEND_PARITY_CTX=16384 reruns the file at 2x, the table in docs/serving.md.
CTX = int(os.environ.get("ROPE_EXTEND_PARITY_CTX", "12288"))
BEYOND_WINDOW_RATIO = {12288: 1.2, 16384: 2.0}  # unpatched / YaRN perplexity at least (measured 1.34 and 7.8)
SHORT_CTX = 4096  # llama3 and ntk: scored tokens 2048..4095 (~1/5 of a 12k run's llama.cpp work)
ROUTE_CTX = 2048  # route equivalence: same RoPE => same llama.cpp perplexity (to float noise)
ROUTE_TOLERANCE = 1e-3  # ntk's printed flag rounds the base to 6 digits: 204522 vs 204522.28 (5e-6 relative)
F32_TOLERANCE = 0.01  # llama.cpp on an f32 GGUF vs transformers fp32: relative perplexity difference
Q4_TOLERANCE = 0.02  # the Q4_1 GGUF (llama.cpp quantised dot products) vs transformers on its dequantised weights: measured +0.15 %
SPECS = {
    "yarn": {"method": "yarn", "factor": 2},
    "llama3": {"method": "llama3", "factor": 2},
    "ntk": {"method": "ntk", "factor": 2},
}
TIMES: dict[str, float] = {}


def transformers4_python() -> str:
    """An interpreter with transformers 4.x for convert_hf_to_gguf.py (ROPE_EXTEND_OTHER_PYTHON or this one)."""
    for python in (os.environ.get("ROPE_EXTEND_OTHER_PYTHON"), sys.executable):
        if not python:
            continue
        proc = subprocess.run([python, "-c", "import transformers, sentencepiece; print(transformers.__version__)"],
                              capture_output=True, text=True)
        if proc.returncode == 0 and proc.stdout.strip().startswith("4."):
            return python
    pytest.fail("convert_hf_to_gguf.py needs transformers 4.x with sentencepiece: set ROPE_EXTEND_OTHER_PYTHON to "
                "such an interpreter (make test does: .venv4)")


class Parity:
    """Lazily computed, shared numbers: every llama.cpp run and transformers forward happens at most once."""

    def __init__(self, llamacpp, smollm2_path: Path, demo_gguf: Path, workdir: Path):
        from rope_extend.demo_model import cache_root
        from rope_extend.eval.texts import pydoc_topics_text

        self.lc, self.hf_dir, self.demo_gguf, self.work = llamacpp, smollm2_path, demo_gguf, workdir
        self.text = workdir / "pydoc_topics.txt"
        self.text.write_text(pydoc_topics_text(), encoding="utf-8")
        self.f32_gguf = cache_root() / "smollm2-135m-instruct-gguf" / "SmolLM2-135M-Instruct.f32.gguf"
        self._lcpp: dict[tuple[str, int], float] = {}  # (route, ctx) -> llama.cpp perplexity
        self._routes: dict[str, tuple[Path, list[str]]] = {}
        self._hf: dict[tuple[str, int], float] = {}  # (method, ctx) -> transformers perplexity
        self._model = None
        self._ids = None

    # -- inputs ----------------------------------------------------------------------------------------------------
    def base_gguf(self) -> Path:
        if not self.f32_gguf.is_file():  # cached: converted once per machine
            self._timed("convert f32", lambda: self.lc.convert_hf_to_gguf(self.hf_dir, self.f32_gguf,
                                                                          python=transformers4_python()))
        return self.f32_gguf

    def ids(self, ctx: int = CTX) -> torch.Tensor:
        """The first ctx of llama.cpp's token ids of the text (what ``llama-perplexity -c ctx`` scores from)."""
        if self._ids is None:
            ids = self.lc.tokenize(self.base_gguf(), self.text)
            assert len(ids) >= 2 * CTX, f"llama-perplexity needs {2 * CTX} tokens, the text has {len(ids)}"
            self._ids = torch.tensor(ids[:CTX])
        return self._ids[:ctx]

    # -- llama.cpp ---------------------------------------------------------------------------------------------------
    def llamacpp(self, route: str, ctx: int = CTX) -> float:
        key = (route, ctx)
        if key not in self._lcpp:
            model, args = self._route(route)
            what = f"llama.cpp {_label(*key)}"
            self._lcpp[key] = self._timed(what, lambda: self.lc.perplexity(model, self.text, ctx, *args))
            _progress(f"{what}: ppl {self._lcpp[key]:.4f} ({TIMES[what]:.0f} s)")
        return self._lcpp[key]

    def _route(self, route: str) -> tuple[Path, list[str]]:
        if route not in self._routes:
            self._routes[route] = self._make_route(route)
        return self._routes[route]

    def _make_route(self, route: str) -> tuple[Path, list[str]]:
        from rope_extend.gguf.write import patch_gguf

        if route == "unpatched":
            return self.base_gguf(), []
        method, how = route.split(":")
        if how == "flags":
            return self.base_gguf(), printed_llamacpp_flags(self.hf_dir, SPECS[method])
        if how == "gguf":
            out = self.work / f"{method}.gguf"
            patch_gguf(self.base_gguf(), SPECS[method], out, overwrite=True)
            return out, []
        if how == "q4_1":
            out = self.work / f"{method}.Q4_1.gguf"
            patch_gguf(self.demo_gguf, SPECS[method], out, overwrite=True)
            return out, []
        if how == "convert":
            from rope_extend.checkpoint import patch_checkpoint

            folder = self.work / f"{method}-hf"
            patch_checkpoint(self.hf_dir, SPECS[method], folder, overwrite=True)
            out = self.work / f"{method}-converted.gguf"
            self._timed(f"convert {method}", lambda: self.lc.convert_hf_to_gguf(folder, out, python=transformers4_python()))
            return out, []
        raise ValueError(route)

    # -- transformers ------------------------------------------------------------------------------------------------
    def transformers(self, method: str, ctx: int = CTX) -> float:
        """Perplexity of tokens ctx/2+1 .. ctx-1 (llama-perplexity's scored half) with rope-extend's patch_model."""
        key = (method, ctx)
        if key not in self._hf:
            from rope_extend.eval.perplexity import token_losses
            from rope_extend.patch import patch_model, unpatch_model

            model = self._load()
            unpatch_model(model)
            if method != "unpatched":
                patch_model(model, SPECS[method])
            what = f"transformers {_label(*key)}"
            losses = self._timed(what, lambda: token_losses(model, self.ids(ctx)))
            self._hf[key] = math.exp(float(losses[ctx // 2 : ctx - 1].mean()))
            _progress(f"{what}: ppl {self._hf[key]:.4f} ({TIMES[what]:.0f} s)")
        return self._hf[key]

    def _load(self):
        if self._model is None:
            from transformers import AutoModelForCausalLM

            from rope_extend.compat import dtype_kwargs

            self._model = AutoModelForCausalLM.from_pretrained(str(self.hf_dir), **dtype_kwargs(torch.float32)).eval()
        return self._model

    def _timed(self, what: str, fn):
        t0 = time.monotonic()
        result = fn()
        TIMES[what] = time.monotonic() - t0
        return result


def _label(name: str, ctx: int) -> str:
    """A route or method, with its window when it is not the file's CTX."""
    return name if ctx == CTX else f"{name} @{ctx}"


def _progress(line: str) -> None:
    print(f"[gguf parity] {line}", file=sys.__stderr__, flush=True)


def printed_llamacpp_flags(hf_dir: Path, spec: dict) -> list[str]:
    """The llama.cpp flags in the serving hints `rope-extend patch` prints for this spec."""
    from rope_extend.engines.serving import serving_hints
    from rope_extend.files import load_config
    from rope_extend.plan import plan_patch

    text, _ = serving_hints(plan_patch(load_config(hf_dir), spec), "out")
    match = re.search(r"llama-server -m \S+ -c \d+ ([^`]*)`", text)
    assert match, f"no llama.cpp command in the serving hints:\n{text}"
    return match.group(1).split()


@pytest.fixture(scope="session")
def parity(llamacpp, smollm2_path, demo_gguf, tmp_path_factory):
    p = Parity(llamacpp, smollm2_path, demo_gguf, tmp_path_factory.mktemp("gguf-parity"))
    yield p
    rows = [f"{'route':<16} {'llama.cpp':>10} {'transformers':>12} {'diff':>8}"]
    for (route, ctx), ppl in p._lcpp.items():
        hf = p._hf.get((route.split(":")[0], ctx))
        diff = f"{100 * (ppl - hf) / hf:+.2f}%" if hf else "-"
        rows.append(f"{_label(route, ctx):<16} {ppl:>10.4f} {hf or float('nan'):>12.4f} {diff:>8}")
    rows += [f"time {what}: {seconds:.0f} s" for what, seconds in TIMES.items()]
    print("\n" + "\n".join(rows))


def assert_close(llamacpp_ppl: float, transformers_ppl: float, tolerance: float) -> None:
    diff = abs(llamacpp_ppl - transformers_ppl) / transformers_ppl
    assert diff < tolerance, f"llama.cpp {llamacpp_ppl:.4f} vs transformers {transformers_ppl:.4f}: {100 * diff:.2f}%"


def assert_far(patched_ppl: float, unpatched_ppl: float, margin: float) -> None:
    """The window tells the method from no scaling (else an engine that ignored the scaling would pass)."""
    diff = abs(patched_ppl - unpatched_ppl) / patched_ppl
    assert diff > margin, f"patched {patched_ppl:.4f} vs unpatched {unpatched_ppl:.4f}: {100 * diff:.2f}% < {100 * margin}%"


def test_llamacpp_tokens_are_the_text_in_the_transformers_vocabulary(parity):
    """Both sides score llama.cpp's tokenisation. Those ids decode, in the Hugging Face tokenizer, to the text itself
    (same vocabulary). The HF tokenizer's own ids differ from token 11659 on (llama.cpp's pre-tokenizer splits
    newline + spaces + digits differently), which is why transformers is fed llama.cpp's ids."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(parity.hf_dir))
    decoded = tok.decode(parity.ids().tolist())
    assert len(decoded) > 40_000 and parity.text.read_text(encoding="utf-8").startswith(decoded)


def test_unpatched_parity(parity):
    assert_close(parity.llamacpp("unpatched"), parity.transformers("unpatched"), F32_TOLERANCE)


@pytest.mark.parametrize(("method", "ctx"), [("yarn", CTX), ("llama3", SHORT_CTX), ("ntk", SHORT_CTX)])
def test_rope_extend_gguf_parity(parity, method, ctx):
    """The GGUF rope-extend writes, run by llama.cpp, scores like rope-extend's transformers evaluation."""
    assert_close(parity.llamacpp(f"{method}:gguf", ctx), parity.transformers(method, ctx), F32_TOLERANCE)
    assert_far(parity.transformers(method, ctx), parity.transformers("unpatched", ctx), 2 * F32_TOLERANCE)


@pytest.mark.parametrize(
    ("method", "route"), [("yarn", "flags"), ("yarn", "convert"), ("llama3", "convert"), ("ntk", "flags"), ("ntk", "convert")]
)
def test_other_routes_give_llamacpp_the_same_rope(parity, method, route):
    """Printed flags on the original GGUF / convert_hf_to_gguf.py of the patched checkpoint == rope-extend's GGUF."""
    reference = parity.llamacpp(f"{method}:gguf", ROUTE_CTX)
    other = parity.llamacpp(f"{method}:{route}", ROUTE_CTX)
    assert abs(other - reference) / reference < ROUTE_TOLERANCE, (other, reference)
    assert_far(reference, parity.llamacpp("unpatched", ROUTE_CTX), 10 * ROUTE_TOLERANCE)


def test_beyond_window_effect_shows_in_llamacpp(parity):
    """Past the native 8192 tokens the unpatched model degrades; YaRN x2 does not (in llama.cpp as in transformers).

    Measured, unpatched vs YaRN: 11.47 vs 8.59 at 12k (a third of the scored tokens past the window), 75.7 vs 9.67
    at 16k (all of them). Inside the window YaRN is the slightly worse one (the 2048-token rows)."""
    beyond = BEYOND_WINDOW_RATIO.get(CTX, 1.2)
    unpatched, yarn = parity.llamacpp("unpatched"), parity.llamacpp("yarn:gguf")
    assert unpatched > beyond * yarn, (unpatched, yarn)
    assert parity.transformers("unpatched") > beyond * parity.transformers("yarn")
    assert parity.llamacpp("unpatched", ROUTE_CTX) < parity.llamacpp("yarn:gguf", ROUTE_CTX)


def test_q4_1_gguf_patched_in_place(parity):
    """The demo's original Q4_1 file, patched by rope-extend, against transformers on its dequantised weights."""
    assert_close(parity.llamacpp("yarn:q4_1"), parity.transformers("yarn"), Q4_TOLERANCE)


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
