"""The whole `rope-extend patch` command on real checkpoints from a Hub cache vs the 135M demo model, side by side.

    python bench/real_checkpoints.py [--repeats 3]

Checkpoints: the Hub-cache fixtures of tests/hubcache.py (huggingface_hub's layout, the models' real config.json
and index, sparse weight files of the real sizes: a 141 GB Llama-3.1-70B in 30 shards costs no disk) and the demo
model SmolLM2-135M (`smollm2` alias, cached under ~/.cache/rope-extend; built there if missing). Every command is
the CLI in a fresh child process (`python -m rope_extend patch ID --method yarn --factor 4 -o OUT`, offline:
HF_HUB_OFFLINE=1, HF_HUB_CACHE at the fixture), measured with os.wait4: wall seconds, CPU seconds (user + system)
and the child's peak RSS. The 70B and the 135M runs alternate (A B B A ...) so machine noise hits both alike;
medians are reported with their ratio.

1. 70B vs 135M, `--repeats` times each (Llama-3.1 ships llama3 scaling to 131072 tokens, so its command is
   `--target-length 262144 --set replace_existing=true`: yarn x4 would shorten it to 32768, which patch refuses).
2. The other real checkpoints once each (Llama-2-7B, Llama-3.1-8B, Mistral-7B-v0.3, Qwen2.5-7B, Gemma-3-1B): the
   same command; each output is checked verified, its weights hard-linked (every weight file shares the blob's
   inode: no copy-on-write clone on this filesystem) and its other files copied.
3. Error paths (bad method, OUT inside SOURCE, OUT a dangling link, factor out of range, an uncached id, scaling
   already present) vs the config read of `rope-extend show ID`: each must answer in about that time.
4. With `--reflink-dir DIR` (a folder on a filesystem with copy-on-write clones: an XFS formatted with reflink=1, a
   btrfs): the 70B command with its Hub cache and OUT there, `--repeats` times, beside section 1's; every weight
   file must be a clone (its own inode, one link, the blob's size), not a hard link.

Goal (issue 18): whole command 70B / 135M <= 1.5x, peak RSS <= 350 MB for both; error paths ~ a config read.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, demo_model

sys.path.insert(0, str(ROOT / "tests"))
import hubcache  # the suite's fixture builder

BIG = "meta-llama/Llama-3.1-70B"
OTHERS = ["meta-llama/Llama-2-7b-hf", "meta-llama/Llama-3.1-8B", "mistralai/Mistral-7B-v0.3", "Qwen/Qwen2.5-7B",
          "google/gemma-3-1b-pt"]
LLAMA3 = {"meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B"}
GOAL_RATIO, GOAL_RSS_MB = 1.5, 350


def cli(args: list[str], env: dict) -> dict:
    """One `python -m rope_extend ...` child: exit code, wall and CPU seconds, peak RSS (MB), last stderr line."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "rope_extend", *map(str, args)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
    err = proc.stderr.read()  # small: progress lines or the one error line
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    lines = [line for line in err.strip().splitlines() if not line.startswith("rope-extend: [")]
    return {"rc": os.waitstatus_to_exitcode(status), "wall": wall, "cpu": usage.ru_utime + usage.ru_stime,
            "rss": usage.ru_maxrss * 1024 / 1e6, "err": lines[-1] if lines else ""}


def patch_args(source: str, out: Path) -> list[str]:
    if source in LLAMA3:  # yarn x32 over 8192: beyond the 131072 tokens it reaches already
        return ["patch", source, "--method", "yarn", "--target-length", "262144", "-o", str(out), "--set",
                "replace_existing=true"]
    return ["patch", source, "--method", "yarn", "--factor", "4", "-o", str(out)]


def check_output(cache: Path, repo: str, out: Path) -> str:
    """'verified, N/N weight files hard-linked, M other files copied' (or what is wrong): on a filesystem without
    copy-on-write clones the weights share the blob's inode, and every other file of SOURCE is OUT's own."""
    snapshot = next((cache / f"models--{repo.replace('/', '--')}" / "snapshots").iterdir())
    weights = sorted(snapshot.glob("*.safetensors"))
    linked = sum(os.stat(out / w.name).st_ino == os.stat(os.path.realpath(w)).st_ino for w in weights)
    others = [p for p in snapshot.iterdir() if p.suffix != ".safetensors" and p.name != "config.json"]
    copied = sum(os.stat(out / p.name).st_nlink == 1 for p in others)
    verified = "verified" if (out / "rope_extend.yaml").exists() else "NOT written"
    return f"{verified}, {linked}/{len(weights)} weight files hard-linked, {copied}/{len(others)} others copied"


def check_clones(cache: Path, repo: str, out: Path) -> str:
    """'N/N weight files reflinked' (their own inode, one link, the blob's size) or what is wrong."""
    snapshot = next((cache / f"models--{repo.replace('/', '--')}" / "snapshots").iterdir())
    weights = sorted(snapshot.glob("*.safetensors"))
    cloned = 0
    for weight in weights:
        blob, copy = os.stat(os.path.realpath(weight)), os.stat(out / weight.name)
        cloned += copy.st_ino != blob.st_ino and copy.st_nlink == 1 and copy.st_size == blob.st_size
    return f"{cloned}/{len(weights)} weight files reflinked"


def reflink_section(folder: Path, repeats: int, ext: dict) -> None:
    """Section 4: the 70B command with its cache and OUT on a copy-on-write filesystem, beside section 1's."""
    work = Path(tempfile.mkdtemp(prefix="rope-bench-reflink-", dir=folder))
    try:
        cache = work / "hub"
        hubcache.build(cache, BIG)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HOME": str(work / "hf-home"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        runs = []
        for repeat in range(repeats):
            out = work / f"out-{repeat}"
            row = cli(patch_args(BIG, out), env)
            if row["rc"] != 0:
                raise SystemExit(f"{BIG} on {folder}: exit {row['rc']}: {row['err']}")
            row["check"] = check_clones(cache, BIG, out)
            runs.append(row)
            shutil.rmtree(out)
        row = summary(runs)
        print(f"\n4. the 70B command on {folder} (copy-on-write clones), median of {repeats}")
        print(f"   {BIG + ' (reflinks)':<46}{row['wall']:>8.2f}{row['cpu']:>8.2f}{row['rss']:>13.0f}  {runs[-1]['check']}")
        print(f"   vs section 1's 70B (hard links): wall {row['wall'] / ext['wall']:.2f}x, CPU {row['cpu'] / ext['cpu']:.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def summary(runs: list[dict]) -> dict:
    return {key: statistics.median(r[key] for r in runs) for key in ("wall", "cpu", "rss")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--reflink-dir", type=Path, help="also run the 70B command on this copy-on-write filesystem")
    args = parser.parse_args()
    smol = demo_model()  # builds the cache entry once if missing; the commands below use the alias
    work = Path(tempfile.mkdtemp(prefix="rope-bench-real-"))
    try:
        cache = work / "hub"
        for repo in [BIG, *OTHERS]:
            hubcache.build(cache, repo)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HOME": str(work / "hf-home"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        apparent = sum(p.stat().st_size for p in (cache / "models--meta-llama--Llama-3.1-70B" / "blobs").iterdir())
        print(f"fixtures: {BIG} {apparent / 1e9:.1f} GB apparent in 30 sparse shards; SmolLM2-135M at {smol}")

        def one(source: str, tag: str) -> dict:
            out = work / f"out-{tag}"
            result = cli(patch_args(source, out), env)
            if result["rc"] != 0:
                raise SystemExit(f"{source}: exit {result['rc']}: {result['err']}")
            result["check"] = check_output(cache, source, out) if source != "smollm2" else "ok"
            shutil.rmtree(out)
            return result

        one("smollm2", "warm")  # page cache of the interpreter and libraries, for both alike
        runs: dict[str, list[dict]] = {BIG: [], "smollm2": []}
        for repeat in range(args.repeats):
            order = [BIG, "smollm2"] if repeat % 2 == 0 else ["smollm2", BIG]
            for source in order:
                runs[source].append(one(source, f"{repeat}-{source.replace('/', '-')}"))
        big, small = summary(runs[BIG]), summary(runs["smollm2"])
        print(f"\n1. whole `rope-extend patch ... --method yarn --factor 4` command, median of {args.repeats} "
              "alternating runs")
        print(f"   {'checkpoint':<46}{'wall s':>8}{'CPU s':>8}{'peak RSS MB':>13}")
        for name, row in ((f"{BIG} (141 GB, 30 shards)", big), ("SmolLM2-135M (smollm2)", small)):
            print(f"   {name:<46}{row['wall']:>8.2f}{row['cpu']:>8.2f}{row['rss']:>13.0f}")
        ratio = big["wall"] / small["wall"]
        print(f"   ratio 70B/135M: wall {ratio:.2f}x, CPU {big['cpu'] / small['cpu']:.2f}x, peak RSS "
              f"{big['rss'] / small['rss']:.2f}x  (goal: wall <= {GOAL_RATIO}x, RSS <= {GOAL_RSS_MB} MB: "
              f"{'met' if ratio <= GOAL_RATIO and max(big['rss'], small['rss']) <= GOAL_RSS_MB else 'NOT met'})")
        print(f"   70B output: {runs[BIG][-1]['check']}")

        if args.reflink_dir is not None:
            reflink_section(args.reflink_dir, args.repeats, big)

        print("\n2. the other real checkpoints, once each")
        print(f"   {'checkpoint':<46}{'wall s':>8}{'CPU s':>8}{'peak RSS MB':>13}  output")
        for repo in OTHERS:
            row = one(repo, repo.replace("/", "-"))
            print(f"   {repo:<46}{row['wall']:>8.2f}{row['cpu']:>8.2f}{row['rss']:>13.0f}  {row['check']}")

        print("\n3. error paths (exit 2, one line) vs a config read (`rope-extend show ID`)")
        snapshot = next((cache / "models--meta-llama--Llama-3.1-70B" / "snapshots").iterdir())
        dangling = work / "dangling-out"
        dangling.symlink_to(work / "nowhere")
        read = [cli(["show", BIG], env) for _ in range(2)]
        base = statistics.median(r["wall"] for r in read)
        print(f"   {'config read: show ' + BIG:<46}{base:>8.2f} s  (exit {read[0]['rc']})")
        cases = [
            ("bad method (--method yarm)", ["patch", BIG, "--method", "yarm", "--factor", "4", "-o", work / "e1"]),
            ("factor out of range (--factor 5000)", ["patch", BIG, "--method", "yarn", "--factor", "5000", "-o",
                                                     work / "e2"]),
            ("OUT inside SOURCE", ["patch", BIG, "--method", "yarn", "--factor", "4", "-o", snapshot / "out"]),
            ("OUT a dangling link", ["patch", BIG, "--method", "yarn", "--factor", "4", "-o", dangling]),
            ("id not in the cache (offline)", ["patch", "acme/never-downloaded", "--method", "yarn", "--factor", "4",
                                              "-o", work / "e3"]),
            ("already scaled (llama3, no replace_existing)", ["patch", BIG, "--method", "yarn", "--factor", "4", "-o",
                                                              work / "e4"]),
        ]
        for name, argv in cases:
            row = cli(argv, env)
            verdict = "ok" if row["rc"] == 2 else f"UNEXPECTED exit {row['rc']}"
            print(f"   {name:<46}{row['wall']:>8.2f} s  {row['wall'] / base:.2f}x the config read  {verdict}: "
                  f"{row['err'][:90]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
