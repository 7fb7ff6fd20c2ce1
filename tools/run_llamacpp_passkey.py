"""llama.cpp's own passkey at a long prompt, with and without its self-extend (`llama-passkey -gan G -b W`).

Evidence for docs/attention-methods.md: `llama-passkey` on the demo GGUF (SmolLM2-135M-Instruct Q4_1, native
window 8192), its own classic-filler prompt (the `filler` haystack of rope-extend's probe is the same sentences),
the key after `position` of `junk` filler sentences for several positions (depths) and seeds. Without `-gan`,
llama-passkey runs a context of n_ctx_train + n_keep and *discards* the oldest tokens of a longer prompt (a sliding
window): its baseline is not raw extrapolation. With `-gan G -b W` it shifts and divides the cached positions by G
before each W-token batch (block-wise self-extend). Resumable: one JSON line per finished run in OUT; rerunning the
same command skips them.

    python tools/run_llamacpp_passkey.py --junk 650 --group 4 --batch 1024 --depths 0.1 0.3 0.5 0.7 0.9 \
        -o eval/reports/llamacpp-passkey-16k/results.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rope_extend.demo_model import demo_gguf_path
from rope_extend.llamacpp_build import LlamaCppError, ensure_llamacpp


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--junk", type=int, default=650, help="filler sentences (650: about 15.7k prompt tokens)")
    ap.add_argument("--group", type=int, nargs="+", default=[1, 4], help="-gan values to run (1 = no grouping)")
    ap.add_argument("--batch", type=int, default=1024, help="-b/-ub: llama-passkey's neighbour window")
    ap.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.9])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1234])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("-o", "--output", type=Path, required=True, help="results.jsonl (appended, resumable)")
    args = ap.parse_args(argv)

    lc = ensure_llamacpp(progress=lambda line: print(line, file=sys.stderr, flush=True))
    model = demo_gguf_path()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if args.output.is_file():
        for line in args.output.read_text().splitlines():
            r = json.loads(line)
            done.add((r["group"], r["batch"], r["junk"], r["position"], r["seed"]))
    runs = [(g, args.batch, args.junk, round(d * args.junk), s) for s in args.seeds for d in args.depths
            for g in args.group]
    for i, (group, batch, junk, position, seed) in enumerate(runs, 1):
        if (group, batch, junk, position, seed) in done:
            continue
        t0 = time.monotonic()
        record = {"group": group, "batch": batch, "junk": junk, "position": position, "depth": position / junk,
                  "seed": seed}
        try:
            r = lc.passkey(model, junk=junk, position=position, group=group, batch=batch, seed=seed,
                           threads=args.threads)
        except LlamaCppError as exc:  # e.g. -gan 1 beyond n_ctx_train: llama-passkey's context shift exits 1
            record.update(found=None, error=str(exc).splitlines()[0][-300:], log_tail=str(exc)[-600:])
            outcome = "failed"
        else:
            record.update(key=r.key, prompt_tokens=r.prompt_tokens, found=r.found, answer=r.answer[:80],
                          command=r.command)
            outcome = f"{'found' if r.found else 'missed'} ({r.prompt_tokens} tokens) {r.answer[:40]!r}"
        record["seconds"] = round(time.monotonic() - t0, 1)
        with args.output.open("a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"[{i}/{len(runs)}] -gan {group} pos {position}/{junk}: {outcome}, {record['seconds']} s", flush=True)
    rows = [json.loads(line) for line in args.output.read_text().splitlines()]
    for group in sorted({r["group"] for r in rows}):
        cell = [r for r in rows if r["group"] == group and r["junk"] == args.junk]
        found = sum(r["found"] is True for r in cell)
        failed = sum(r["found"] is None for r in cell)
        print(f"-gan {group}: {found}/{len(cell) - failed} found" + (f", {failed} runs failed" if failed else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
