"""What this project measured, per ratio and method, for recommendations to quote.

`measured.json` beside this module is written by `tools/readme_results.py` from the eval records committed under
eval/reports, together with the README's result tables (tests/test_readme.py fails while either differs from what
the records give), so a recommendation never quotes a number the records do not hold today. It holds, for each
ratio s = N/L that was run: passkey k/n (classic filler; the device) and perplexity beyond the window, per method.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .methods import get_method

PATH = Path(__file__).with_name("measured.json")


@cache
def records() -> dict:
    return json.loads(PATH.read_text(encoding="utf-8"))


def _is_attention_level(label: str) -> bool:
    """'self-extend + log_n' -> the method object of 'self-extend' says whether it acts on attention."""
    return get_method(label.split(" + ")[0]).acts_on_attention


@dataclass(frozen=True)
class Measured:
    """What was measured at one ratio: `lines` to print, and `caveat` (None when some method measured there found at
    least half the keys)."""

    ratio: float
    lines: list[str]
    caveat: str | None


def at_ratio(factor: float, method: str | None = None) -> Measured:
    """The project's measurements at `factor` (x2, x4, x8 ...), or a line saying that nothing was measured there;
    `method` (the recommended one) is named first when it was measured."""
    data = records()
    model, orig = data["model"], data["original_length"]
    where = f"{model}, {orig} -> {{length}} tokens; rope_extend/measured.json, from eval/reports"
    ratios = {float(key): value for key, value in data["ratios"].items()}
    match = next((r for r in ratios if math.isclose(r, factor, rel_tol=1e-3)), None)
    if match is None:
        below = [r for r in ratios if r < factor]
        nearest = f"; the nearest below: x{max(below):g}" if below else ""
        return Measured(factor, [
            f"nothing was measured by this project at x{factor:.4g} (measured on {model}: "
            f"{', '.join(f'x{r:g}' for r in sorted(ratios))}{nearest}); measure it on your model before relying on it"
        ], f"not measured by this project at x{factor:.4g}")
    entry = ratios[match]
    methods = entry["methods"]

    def shown(name: str) -> str:  # a row that ran other parameters than the method's defaults today says which
        return f"{name} ({methods[name]['ran']})" if "ran" in methods[name] else name

    passkey = {name: m["passkey"] for name, m in methods.items() if "passkey" in m}
    order = sorted(passkey, key=lambda n: (n != method, -passkey[n]["found"] / passkey[n]["prompts"], n))
    devices = sorted({p["device"] for p in passkey.values()})
    lines = []
    if passkey:
        lines.append(
            f"measured by this project at x{match:g} ({where.format(length=entry['length'])}): passkey found "
            + ", ".join(f"{shown(name)} {passkey[name]['found']}/{passkey[name]['prompts']}" for name in order)
            + f" ({'; '.join(devices)})"
        )
    ppl = {name: m["perplexity"] for name, m in methods.items() if "perplexity" in m}
    if ppl:
        texts = data["texts"]
        lines.append(f"perplexity at {entry['length']} tokens ({' / '.join(texts)}): "
                     + ", ".join(f"{shown(name)} " + " / ".join(f"{ppl[name][t]:.2f}" for t in texts)
                                 for name in sorted(ppl, key=lambda n: sum(ppl[n].values()))))
    unmeasured = [kind for kind, test in (("frequency", lambda n: not _is_attention_level(n)),
                                          ("attention-level", _is_attention_level))
                  if not any(test(name) for name in methods)]
    if unmeasured or not ppl:
        lines.append(f"not measured at x{match:g}: " + ", ".join(
            [f"{kind} methods" for kind in unmeasured] + ([] if ppl else ["perplexity"])))
    best = max((p["found"] / p["prompts"] for p in passkey.values()), default=None)
    caveat = None
    if best is not None and best < 0.5:
        top = max(passkey, key=lambda n: passkey[n]["found"] / passkey[n]["prompts"])
        caveat = (f"at x{match:g} no method this project measured found half the passkeys on {model} (best: {top} "
                  f"{passkey[top]['found']}/{passkey[top]['prompts']})")
    elif method is not None and method not in methods:
        caveat = f"{method} was not measured by this project at x{match:g}"
    return Measured(match, lines, caveat)
