"""A large push to the local Hub (tests/hubserver.py): bytes sent on a clean run and on a run resumed after an
interruption at 50 %, and the pushing process's peak memory, for two checkpoint sizes side by side.

    python bench/push_resume.py            # 0.5 GB and 2 GB, 8 shards each
    python bench/push_resume.py --gb 2 --shards 30

Each checkpoint is a plain folder (config.json, an index, N sparse `model-0000i-of-0000N.safetensors` shards, each
with its own first bytes so that no two are the same object; not written by rope-extend, so pushed with
--unverified). Each push is `rope-extend push` in a fresh child
process (peak RSS from os.wait4) with HF_ENDPOINT at a HubServer running in this process, which keeps each object's
sha256 and size, not its bytes. The interrupted run gets SIGINT once the server has received half of the shards'
bytes; the resumed run is the command its last line prints. `received` is what the server read from upload
requests (parts cut short included).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from hubserver import HubServer  # noqa: E402

MB = 1_000_000


def make_checkpoint(folder: Path, total: int, shards: int) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 8192}))
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    for i, name in enumerate(names):
        with open(folder / name, "wb") as handle:
            handle.write(os.urandom(64) + f"shard {i}".encode())
            handle.truncate(total // shards)  # the rest is a hole: cheap to write, read as zeros
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": {f"w{i}": n for i, n in enumerate(names)}}))


def push(folder: Path, repo: str, hub: HubServer, interrupt_at: int | None = None) -> dict:
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_TOKEN": "hf_bench", "HF_HUB_DISABLE_TELEMETRY": "1",
           "PYTHONPATH": str(ROOT)}
    env.pop("HF_HUB_OFFLINE", None)
    before = hub.received
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "rope_extend", "push", str(folder), repo, "--unverified"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if interrupt_at is not None:
        def watch():
            while proc.poll() is None:
                if hub.received - before >= interrupt_at:
                    proc.send_signal(signal.SIGINT)
                    return
                time.sleep(0.01)

        threading.Thread(target=watch, daemon=True).start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    out, err = proc.stdout.read(), proc.stderr.read()
    code = os.waitstatus_to_exitcode(status)
    return {"exit": code, "received": hub.received - before, "wall_s": round(wall, 1),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "last_line": err.strip().splitlines()[-1] if err else "",
            "stdout": out}


def one_size(total: int, shards: int, work: Path, part: int) -> dict:
    folder = work / f"ckpt-{total // MB}MB"
    make_checkpoint(folder, total, shards)
    weights = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    with HubServer(part_size=part, keep_bytes=False) as hub:
        clean = push(folder, "me/clean", hub)
        assert clean["exit"] == 0, clean
        cut = push(folder, "me/resumed", hub, interrupt_at=weights // 2)
        assert cut["exit"] == 130, cut
        resume = re.search(r"`([^`]+)` resumes", cut["last_line"])[1]
        assert shlex.split(resume)[1:] == ["push", str(folder), "me/resumed", "--unverified"], resume
        held = len(hub.repos["me/resumed"].objects)
        resumed = push(folder, "me/resumed", hub)
        assert resumed["exit"] == 0, resumed
        repo = hub.repos["me/resumed"]
        assert len(repo.commits) == 1 and repo.tree.keys() == hub.repos["me/clean"].tree.keys()
    return {"checkpoint_bytes": weights, "shards": shards, "clean": clean, "interrupted": cut,
            "objects_held_after_interrupt": held, "resumed": resumed}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gb", type=float, nargs="+", default=[0.5, 2.0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--part-mb", type=int, default=16)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="push-bench-") as tmp:
        for gb in args.gb:
            rows.append(one_size(int(gb * 1000 * MB), args.shards, Path(tmp), args.part_mb * MB))
    print(f"{'checkpoint':>10} {'clean sent':>11} {'peak RSS':>9} {'cut at':>8} {'sent before':>12} "
          f"{'resumed sent':>13} {'peak RSS':>9} {'wall clean/resumed':>19}")
    for row in rows:
        gb = row["checkpoint_bytes"] / 1e9
        c, i, r = row["clean"], row["interrupted"], row["resumed"]
        print(f"{gb:>8.2f}GB {c['received'] / 1e9:>9.3f}GB {c['peak_rss_mib']:>6.0f}MiB {'50 %':>8} "
              f"{i['received'] / 1e9:>10.3f}GB {r['received'] / 1e9:>11.3f}GB {r['peak_rss_mib']:>6.0f}MiB "
              f"{c['wall_s']:>9.1f}s/{r['wall_s']:.1f}s")
        print(f"{'':>10} after the interruption the Hub held {row['objects_held_after_interrupt']} of "
              f"{row['shards']} objects; sent before + resumed = {(i['received'] + r['received']) / 1e9:.3f} GB")
    print(json.dumps([{k: ({kk: vv for kk, vv in v.items() if kk != 'stdout'} if isinstance(v, dict) else v)
                       for k, v in row.items()} for row in rows]))


if __name__ == "__main__":
    main()
