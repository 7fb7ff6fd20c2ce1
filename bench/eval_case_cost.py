"""What an eval case costs against the forwards it runs: seconds per case beside seconds per forward pass of the same
length, timed back to back in one run (issue 66: single 256-token needle cases took 74-124 s on a loaded 2-core
machine where a forward of the demo model at 512 tokens takes about 2 s of one core).

    python bench/eval_case_cost.py [--suite smoke] [--threads fitted,default] [--repeats 1]

On the demo model (SmolLM2-135M, float32, on the CPU), every job of the suite's unpatched variant is run as `rope-extend
eval` runs it (`Evaluator.run`: one forward for the perplexity lengths of a text, the prompts of one probe task
sharing their prefix, one entropy pass each), then one plain forward over as many tokens as the job's longest case.
A probe case also decodes its answer (`new tok`: the probe's budget, one cheap step each), so it costs its prefill
forward and those steps. Each row is timed twice, interleaved: with torch's CPU threads as eval fits them to the load
(`rope_extend.eval.cpu_threads`, `fitted`) and with torch's default of every core (`default`, what eval used
before): on a machine whose cores other processes keep busy, the default's spinning threads cost several times the
work. The header names the CPU, its cores and the load average; the figures are medians of `--repeats` runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from common import cpu_name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="smoke")
    parser.add_argument("--threads", default="fitted,default", help="fitted, default or both (comma-separated)")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()

    import torch

    from rope_extend.demo_model import smollm2_path
    from rope_extend.eval.cpu_threads import CpuThreads
    from rope_extend.eval.jobs import Evaluator, plan_jobs
    from rope_extend.eval.suite import load_suite
    from rope_extend.eval.variants import load_model, make_variants, model_window

    model, tok = load_model(smollm2_path())
    suite = load_suite(args.suite)
    window = model_window(model.config).length
    cases = suite.cases(window)
    jobs = plan_jobs(cases, make_variants(None), set())
    ev = Evaluator(model, tok, window, suite.seed)
    ev.preflight(cases)  # texts tokenised and haystacks built once, as in a run, before anything is timed
    text = ev.text_ids(None)
    default = torch.get_num_threads()
    modes = [m.strip() for m in args.threads.split(",") if m.strip()]
    fitter = CpuThreads().__enter__()

    def threads(mode: str) -> int:
        if mode == "fitted":
            return fitter.fit()
        torch.set_num_threads(default)
        return default

    def forward(length: int) -> None:
        with torch.inference_mode():
            model(text[:length][None], use_cache=False)

    forward(64)  # first-call overheads out of the first row
    rows = []
    for job in jobs:
        first = job.cases[0]
        new = ev.probe(first).max_new_tokens if first.is_probe else 0
        timing: dict[str, dict[str, list[float]]] = {m: {"case": [], "forward": [], "threads": []} for m in modes}
        for _ in range(args.repeats):
            for mode in modes:  # interleaved: the load hits both alike
                timing[mode]["threads"].append(threads(mode))
                started = time.perf_counter()
                ev.run(job)
                timing[mode]["case"].append((time.perf_counter() - started) / len(job.cases))
                started = time.perf_counter()
                forward(job.length)
                timing[mode]["forward"].append(time.perf_counter() - started)
        for mode in modes:
            case, fwd = statistics.median(timing[mode]["case"]), statistics.median(timing[mode]["forward"])
            rows.append((first.kind, len(job.cases), job.length, new, mode, int(max(timing[mode]["threads"])), case,
                         fwd, case / fwd))
    fitter.__exit__(None, None, None)

    print(f"device: CPU, {cpu_name()}, {os.cpu_count()} cores; torch {torch.__version__}, default {default} threads; "
          f"load average {os.getloadavg()[0]:.1f} at the end")
    print(f"suite {suite.name}, demo model float32, unpatched; medians of {args.repeats} run(s), seconds")
    header = ("job", "cases", "tokens", "new tok", "threads", "n", "s/case", "s/forward", "case/forward")
    print(f"{header[0]:<16} {header[1]:>5} {header[2]:>6} {header[3]:>7} {header[4]:>8} {header[5]:>2} "
          f"{header[6]:>7} {header[7]:>9} {header[8]:>12}")
    for kind, n, length, new, mode, used, case, fwd, ratio in rows:
        print(f"{kind:<16} {n:>5} {length:>6} {new:>7} {mode:>8} {used:>2} {case:7.2f} {fwd:9.2f} {ratio:12.1f}")
    for mode in modes:
        total = sum(r[6] * r[1] for r in rows if r[4] == mode)
        print(f"total, {mode} threads: {total:.1f} s for {sum(r[1] for r in rows if r[4] == mode)} cases")


if __name__ == "__main__":
    main()
