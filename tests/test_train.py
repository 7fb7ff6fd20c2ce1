"""`rope-extend train` end to end on a tiny random llama with the real SmolLM2 tokenizer (tied embeddings, 49k vocab,
2 layers, original window 64, trained for the 4x = 256-token target with PoSE windows of 32 tokens).

One reference run (6 steps, a child process with the resume test's environment: one thread, so the two runs' CPU
matmuls split their sums alike on any core count) is shared: the loss test, the checkpoint/portability test, the
resume test and the 2-process test compare against it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import tiny
import torch
from helpers import ROOT, STEPS, child_env, expected_card, toy_text, train_argv
from safetensors.torch import load_file

from rope_extend.cli import run

OTHER = os.environ.get("ROPE_EXTEND_OTHER_PYTHON")


@pytest.fixture(scope="module")
def reference(tiny_source, tmp_path_factory):
    source, text = tiny_source
    out = tmp_path_factory.mktemp("train-ref") / "ref"
    # Not in-process: pytest's torch uses every core, and a BLAS may block a sum by thread count, so the resumed
    # run (one thread) would only be bit-identical to it on some machines (stop 27's CI, on a larger one, was not).
    result = subprocess.run([sys.executable, "-m", "rope_extend", *train_argv(source, text, out)], env=child_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_the_loss_line_adds_the_means_of_the_first_and_last_tenth_of_the_steps():
    from rope_extend.train.finish import loss_means
    from rope_extend.train.training_card import loss_line

    losses = [2.5, 3.5] + [3.0] * 16 + [2.0, 3.0]  # 20 steps: a tenth is 2
    summary = {"first_loss": losses[0], "last_loss": losses[-1], "loss_means": loss_means(losses)}
    assert summary["loss_means"] == {"steps": 2, "first": 3.0, "last": 2.5}
    assert loss_line(summary) == "first 2.5000 -> last 3.0000 (mean of the first / last 2 steps: 3.0000 -> 2.5000)"
    assert loss_means([]) is None and loss_line({"first_loss": None}) is None


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def test_loss_falls_on_a_learnable_text_and_the_card_records_the_run(reference):
    summary = json.loads((reference / "training.json").read_text())
    log = [json.loads(line) for line in (reference / "training_log.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in log if "loss" in row]
    assert len(losses) == STEPS and summary["steps"] == STEPS
    assert losses[0] == pytest.approx(float(torch.log(torch.tensor(49152.0))), abs=0.2)  # random init: ~ln(vocab)
    assert losses[-1] < losses[0] - 1.0, losses  # the 60-word cycle is being learned
    assert summary["tokens_trained"] == STEPS * 64 and summary["recipe"]["pose"] is True
    assert (summary["precision"], summary["processes"]) == ("float32", "one process (cpu)")
    assert summary["data"][0]["sha256"] == __import__("hashlib").sha256(
        toy_text().encode()).hexdigest()
    assert summary["loss_means"] == {"steps": 1, "first": losses[0], "last": losses[-1]}  # 6 steps: a tenth is 1
    card = (reference / "README.md").read_text()
    assert "## Training" in card and "PoSE positions spanning 256" in card and "training_loss.png" in card
    assert f"| loss | first {losses[0]:.4f} -> last {losses[-1]:.4f} |" in card
    assert (reference / "training_loss.png").stat().st_size > 1000
    config = json.loads((reference / "config.json").read_text())
    assert config["max_position_embeddings"] == 256 and config["rope_scaling"]["rope_type"] == "yarn"
    assert config["tie_word_embeddings"] is True
    assert not (reference.parent / "ref.train-state").exists()  # the resume state is removed after success


def test_stock_reload_in_both_transformers_lines_equals_the_trained_model(reference, tiny_source, tmp_path):
    """The writer verified the stock reload of this line against the trained model in memory; here the other line
    (4.x <-> 5.x, a process that cannot import rope_extend) must reload the same logits beyond the window."""
    ids = torch.randint(3, 49152, (1, 200), generator=torch.Generator().manual_seed(0))
    (this,) = tiny.stock_logits([(reference, ids)], tmp_path / "this")
    trained = _weights(reference)
    source_weights = _weights(tiny_source[0])
    assert any(not torch.equal(trained[k], source_weights[k]) for k in trained)  # training changed the weights
    if OTHER:
        (other,) = tiny.stock_logits([(reference, ids)], tmp_path / "other", python=OTHER)
        torch.testing.assert_close(other, this, atol=1e-5, rtol=0)


def test_bad_input_is_refused_in_one_line_before_any_work(tiny_source, tmp_path, capsys):
    source, text = tiny_source
    short = tmp_path / "short.txt"
    short.write_text("Too short for one window.")
    suite = tmp_path / "trained-on.yaml"  # a suite whose perplexity text is the training text
    suite.write_text(f"name: trained-on\nperplexity:\n  texts: [{text}]\n  lengths: [64]\n")
    out = tmp_path / "out"
    base = ["--window", "32", "--steps", "2", "-o", str(out)]
    cases = [
        (["train", str(source), "--method", "yarn", "--factor", "4", *base], "no training text"),
        (["train", str(source), "--method", "yarn", "--factor", "4", "--text", str(short), *base],
         "fewer than one training window"),
        (["train", str(source), "--method", "nope", "--factor", "4", "--text", str(text), *base], "nope"),
        (["train", str(source), "--method", "dynamic", "--factor", "4", "--text", str(text), *base], "is dynamic"),
        *((["train", str(source), "--method", m, "--factor", "2", "--text", str(text), *base],
           "remaps attention at inference") for m in ("self-extend", "dual-chunk")),
        (["train", str(source), "--method", "string", "--text", str(text), *base], "remaps attention at inference"),
        (["train", str(source), "--method", "yarn", "--factor", "4", "--text", str(text), "--loss-chunk", "0",
          *base], "--loss-chunk 0 must be >= 1"),
        (["train", str(source), "--method", "yarn", "--factor", "4", "--text", str(text), "--window", "32",
          "-o", str(source / "inside")], "inside SOURCE"),
        (["train", str(source), "--method", "yarn", "--factor", "4", "--text", str(text), "--eval-text", str(text),
          *base], "training texts"),
        (["train", str(source), "--method", "yarn", "--factor", "4", "--text", str(text), "--eval-suite", str(suite),
          *base], "one of the training texts"),
    ]
    for args, needle in cases:
        started = time.perf_counter()
        assert run(args) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("rope-extend: error:") and needle in err[0], err
        assert time.perf_counter() - started < 20  # refused before a model is loaded
        assert not out.exists() and not (tmp_path / "out.train-state").exists()
        assert not (source / "inside").exists()


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.is_file():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def test_sigterm_saves_and_a_rerun_after_sigkill_resumes_to_the_same_weights(reference, tiny_source, tmp_path):
    source, text = tiny_source
    out = tmp_path / "res"
    command = [sys.executable, "-m", "rope_extend", *train_argv(source, text, out)]
    state = tmp_path / "res.train-state"
    first = subprocess.Popen(command, env=child_env(), stderr=subprocess.PIPE, text=True)
    _wait_for(state / "checkpoint-2" / "trainer_state.json", first)
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 143, err
    assert "rerun the same command to resume" in err.strip().splitlines()[-1]
    stopped = max(int(p.name.split("-")[1]) for p in state.glob("checkpoint-*"))
    assert 2 <= stopped < STEPS
    second = subprocess.Popen(command, env=child_env(), stderr=subprocess.PIPE, text=True)
    _wait_for(state / f"checkpoint-{stopped + 1}" / "trainer_state.json", second)
    second.send_signal(signal.SIGKILL)
    second.communicate(timeout=60)
    assert not out.exists()
    third = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stderr
    assert f"resuming from checkpoint-{stopped + 1}" in third.stderr or "resuming from checkpoint-" in third.stderr
    want, got = _weights(reference), _weights(out)
    assert sorted(want) == sorted(got)
    for key in want:  # deterministic on CPU: bit-identical to the uninterrupted run
        assert torch.equal(want[key], got[key]), key
    log = [json.loads(line) for line in (out / "training_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == list(range(1, STEPS + 1))


LAUNCHERS = {  # launcher -> the progress line saying how the 2 processes hold the model
    "torchrun": "processes: DDP over 2 processes (cpu)",
    "accelerate": "processes: DDP over 2 processes (cpu)",
    "accelerate-fsdp-config": "processes: FSDP2 over 2 processes (cpu): each holds 1/2 of the weights",
    "accelerate-deepspeed-config": "processes: DeepSpeed ZeRO-3 over 2 processes (cpu): each holds 1/2 of the weights",
}


def _launch_command(launcher: str, train_args: list[str], tmp_path: Path,
                    entry: tuple[str, ...] = ("-m", "rope_extend")) -> tuple[list[str], dict]:
    """(command, environment) of `rope-extend train` on 2 CPU processes (gloo) started by `launcher` (a key of
    LAUNCHERS), each launcher on its own port; `entry` is what each process runs (rope-extend's CLI)."""
    port = str(29500 + os.getpid() % 1000 + 250 * list(LAUNCHERS).index(launcher))
    if launcher == "torchrun":
        start = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port]
    elif launcher == "accelerate":  # every launch setting given: no user accelerate config (HF_HOME is empty) is read
        start = ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                 "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", port]
    else:
        config = ROOT / "configs/accelerate" / ("fsdp.yaml" if "fsdp" in launcher else "deepspeed-zero3.yaml")
        start = ["-m", "accelerate.commands.launch", "--config_file", str(config), "--num_processes", "2",
                 "--mixed_precision", "no", "--main_process_port", port]
    command = [sys.executable, *start, *entry, *train_args]
    return command, {**child_env(), "HF_HOME": str(tmp_path / "hf-home"), "CUDA_VISIBLE_DEVICES": ""}


def _launch(launcher: str, train_args: list[str], tmp_path: Path, expect: str | None = None,
            entry: tuple[str, ...] = ("-m", "rope_extend"), env: dict | None = None) -> subprocess.CompletedProcess:
    """`rope-extend train` on 2 CPU processes (gloo) started by `launcher`, to a successful end; its progress says
    `expect` (default: how LAUNCHERS says the launcher holds the model)."""
    command, launch_env = _launch_command(launcher, train_args, tmp_path, entry)
    env = {**launch_env, **(env or {})}
    deepspeed = "deepspeed" in launcher or "--sequence-parallel" in train_args
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
    if result.returncode != 0 and deepspeed and "Signal 6 (SIGABRT)" in result.stderr:
        # DeepSpeed 0.19.8 on CPU processes: a worker aborted (SIGABRT, no Python traceback) in 2 of ~40 runs of
        # this test on 2026-12-04, under pytest only, cause not found; one fresh retry, so that a second abort,
        # a wrong weight or any other failure still fails the test.
        out = Path(train_args[train_args.index("-o") + 1])
        for folder in (out, out.parent / f"{out.name}.train-state"):
            shutil.rmtree(folder, ignore_errors=True)
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
    errors = [line for line in result.stderr.splitlines() if "rope-extend: error" in line or "Error" in line]
    assert result.returncode == 0, "\n".join(errors[:20]) + "\n" + result.stderr[-6000:]
    assert (expect or LAUNCHERS[launcher]) in result.stderr, result.stderr[-3000:]
    assert "the accelerate config asks for" not in result.stderr
    return result


def _assert_same_weights(got: Path, want: Path, atol: float) -> None:
    a, b = _weights(want), _weights(got)
    assert sorted(a) == sorted(b)
    for key in a:
        torch.testing.assert_close(b[key], a[key], atol=atol, rtol=0, msg=key)


# accelerate's plain DDP launch (its torchrun path: the same DDP as torchrun's), ZeRO-3 (configs/accelerate/
# deepspeed-zero3.yaml: ~3 minutes of 2-process DeepSpeed start here) and LoRA+ under ZeRO-3 run in `make train-check`
# (marker `check`), with their record (eval/reports/train-check-sharded/); DeepSpeed itself stays in the suite
# (ZeRO-0 with Ulysses: test_sequence_parallel_over_two_processes_trains_the_one_process_run), and so do FSDP2 (its
# 2-process run stopped and resumed: test_fsdp_stopped_by_sigterm_...) and LoRA under FSDP
CHECK_ONLY = pytest.mark.check


@pytest.mark.parametrize("launcher", [pytest.param(name, marks=CHECK_ONLY)
                                      if name in ("accelerate", "accelerate-deepspeed-config") else name
                                      for name in LAUNCHERS if name != "accelerate-fsdp-config"])
def test_two_gloo_processes_give_the_weights_of_one_process_with_the_same_global_batch(reference, tiny_source,
                                                                                        tmp_path, launcher):
    """Two CPU processes over gloo, each taking one window of the 2-window global batch instead of one process
    accumulating both, end at the one-process weights (1e-5 absolute: the gradient reduction sums in another order).

    DDP launched by `torchrun --nproc_per_node 2` or by `accelerate launch --multi_gpu --num_processes 2`
    (accelerate's torchrun path; its `--cpu` path starts one process, and its multi-CPU path needs mpirun).
    The shipped ZeRO-3 config on 2 CPU processes, sharded: configs/accelerate/deepspeed-zero3.yaml (zero3_init_flag:
    the verification copies are built whole), with the chunked loss in chunks of 8 positions (the LM head called
    outside the wrapped forward, and again when each chunk is recomputed); it gathers the full weights for the
    writer, which verifies them. The shipped FSDP config runs the same comparison stopped and resumed:
    test_fsdp_stopped_by_sigterm_resumes_to_the_weights_of_one_uninterrupted_process."""
    source, text = tiny_source
    out = tmp_path / "ddp"
    sharded = launcher.endswith("-config")  # their loss in 4 chunks of 8, each recomputed in the backward
    _launch(launcher, train_argv(source, text, out, *(["--loss-chunk", "8"] if sharded else [])), tmp_path)
    _assert_two_processes_trained_the_reference(out, reference, launcher)


def _assert_two_processes_trained_the_reference(out: Path, reference: Path, launcher: str) -> None:
    """`out`, written by 2 processes started by `launcher` (a key of LAUNCHERS), one window each: its summary and card
    say so, and its weights (1e-5 absolute: the gradient reduction sums in another order), files and config are the
    one-process `reference`'s."""
    summary = json.loads((out / "training.json").read_text())
    assert summary["recipe"]["world_size"] == 2 and summary["recipe"]["accumulation"] == 1
    held = LAUNCHERS[launcher].removeprefix("processes: ")
    assert summary["processes"].startswith(held) and summary["precision"] == "float32"
    assert f"| processes | {summary['processes']} |" in (out / "README.md").read_text()
    _assert_same_weights(out, reference, atol=1e-5)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in reference.iterdir())
    same = ("architectures", "rope_scaling", "rope_parameters", "max_position_embeddings", "tie_word_embeddings")
    a, b = json.loads((out / "config.json").read_text()), json.loads((reference / "config.json").read_text())
    assert {k: a.get(k) for k in same} == {k: b.get(k) for k in same}


@pytest.mark.parametrize(("launcher", "extra"), [("accelerate-fsdp-config", ["--lora-only"]),
                                                 pytest.param("accelerate-deepspeed-config", [], marks=CHECK_ONLY)])
def test_lora_sharded_gives_the_weights_of_one_process(tiny_source, tmp_path, launcher, extra):
    """LoRA alone under FSDP, LoRA+ (trainable embeddings and norms) under ZeRO-3, dropout 0: the merged weights of
    the one-process run (the adapters are initialised from --seed, so every process count starts alike)."""
    source, text = tiny_source
    lora = ["--lora", "--lora-dropout", "0", *extra]
    one, two = tmp_path / "one", tmp_path / "two"
    done = subprocess.run([sys.executable, "-m", "rope_extend", *train_argv(source, text, one, *lora)], env=child_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    _launch(launcher, train_argv(source, text, two, *lora), tmp_path)
    _assert_same_weights(two, one, atol=1e-5)
    assert json.loads((two / "training.json").read_text())["recipe"]["lora"]


def test_fsdp_stopped_by_sigterm_resumes_to_the_weights_of_one_uninterrupted_process(reference, tiny_source,
                                                                                       tmp_path):
    """The shipped FSDP config on 2 CPU processes (configs/accelerate/fsdp.yaml: FSDP2 through
    `sharding.fsdp_on_cpu`, FSDP's activation checkpointing, the loss in chunks of 8 positions, each recomputed in the
    backward), each taking one window of the 2-window global batch: SIGTERM to `accelerate launch` stops after the
    current step with a sharded checkpoint (exit 143, one line naming it); the same command resumes from it and ends
    at the weights of the uninterrupted one-process run (1e-5 absolute: the gradient reduction sums in another
    order), gathered whole for the writer, which verifies them; its files, card and config are the one-process
    run's. (The uninterrupted FSDP launch of test_two_gloo_processes_... is this test's first half.)"""
    source, text = tiny_source
    two = tmp_path / "two"
    command, env = _launch_command("accelerate-fsdp-config", train_argv(source, text, two, "--loss-chunk", "8"),
                                   tmp_path)
    log = tmp_path / "first.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 240
        # SIGTERM once step 2 is logged (~2 s before the last step here, idle): stopped after step 2 or 3, the
        # other 3-4 steps trained by the resumed run
        while f"step 2/{STEPS}" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=240) == 143, log.read_text()[-3000:]
    first = log.read_text()
    stopped = [line for line in first.splitlines() if "interrupted (SIGTERM)" in line]
    assert len(stopped) == 1 and "checkpoint-" in stopped[0], first[-3000:]
    assert LAUNCHERS["accelerate-fsdp-config"] in first and not two.exists()
    resumed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from checkpoint-" in resumed.stderr and "verified with stock transformers" in " ".join(resumed.stdout.split())
    _assert_two_processes_trained_the_reference(two, reference, "accelerate-fsdp-config")


def test_lora_plus_under_fsdp_is_refused_before_any_work(tiny_source, tmp_path, capsys, monkeypatch):
    source, text = tiny_source
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch` with the FSDP config sets
    assert run(train_argv(source, text, tmp_path / "out", "--lora")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--lora-only" in err[0] and "deepspeed-zero3.yaml" in err[0], err
    assert not (tmp_path / "out.train-state").exists()


def _losses(folder: Path) -> list[float]:
    return [row["loss"] for row in map(json.loads, (folder / "training_log.jsonl").read_text().splitlines())
            if "loss" in row]


def test_sequence_parallel_over_two_processes_trains_the_one_process_run(reference, tiny_source, tmp_path):
    """`--sequence-parallel 2` under torchrun: DeepSpeed's Ulysses (ALST) through transformers' Trainer, each
    32-token PoSE window split into two 16-token shards, one per process, the built-in ZeRO-0 config (the shipped
    configs/deepspeed/zero0.json). The loss of every step and the final weights are the one-process run's (the
    shared reference: same data, same recipe), and the checkpoint is verified. Then the negative control: the same
    sharding without the Ulysses attention (each process attends only within its shard,
    tests/sharded_without_ulysses.py) fails the same loss comparison at the first step."""
    source, text = tiny_source
    out = tmp_path / "sp"
    done = _launch("torchrun", train_argv(source, text, out, "--sequence-parallel", "2"), tmp_path,
                   expect="processes: DeepSpeed ZeRO-0 over 2 processes (cpu); Ulysses sequence parallel: each window "
                          "split over 2 processes")
    from rope_extend.train.sequence_parallel import DEFAULT_ZERO

    assert json.loads((ROOT / "configs/deepspeed/zero0.json").read_text()) == DEFAULT_ZERO
    assert "2 micro-batch(es) of 16 tokens per process" in done.stderr  # each process holds half of each window
    assert "verified with stock transformers" in " ".join(done.stdout.split())
    want, got = _losses(reference), _losses(out)
    assert len(got) == STEPS
    assert got == pytest.approx(want, rel=1e-5, abs=0), (got, want)
    norms = {run: [row.get("grad_norm") for row in map(json.loads, (run / "training_log.jsonl").read_text().splitlines())
                   if "loss" in row] for run in (reference, out)}  # issue 57: the 2-process log had none
    assert None not in norms[reference] and norms[out] == pytest.approx(norms[reference], rel=1e-4, abs=0), norms
    assert "Gradient accumulation steps mismatch" not in done.stderr  # rope-extend's own config: consistent
    _assert_same_weights(out, reference, atol=1e-5)
    summary = json.loads((out / "training.json").read_text())
    assert (summary["recipe"]["sequence_parallel"], summary["recipe"]["world_size"]) == (2, 2)
    assert summary["recipe"]["accumulation"] == 2  # one group of 2 processes takes both windows of a step
    assert "1 group(s) of 2 sequence-parallel processes" in (out / "README.md").read_text()

    marker = tmp_path / "without-ulysses"
    negative = tmp_path / "negative"
    args = train_argv(source, text, negative, "--sequence-parallel", "2", "--no-verify")
    args[args.index("--steps") + 1] = "1"  # the first step's loss is the forward's: one step shows it
    _launch("torchrun", args, tmp_path, expect="Ulysses sequence parallel", env={
        "SHARDED_WITHOUT_ULYSSES_MARKER": str(marker)}, entry=(str(ROOT / "tests/sharded_without_ulysses.py"),))
    assert {p.name for p in tmp_path.glob("without-ulysses.*")} == {"without-ulysses.0", "without-ulysses.1"}
    (first,) = _losses(negative)
    assert first != pytest.approx(want[0], rel=1e-5, abs=0), (first, want[0])  # measured: 10.7706 against 10.7578


def test_a_resumed_sequence_parallel_run_skips_exactly_the_micro_batches_it_trained():
    """transformers skips a resumed run's batches with accelerate's `skip_first_batches`, which cannot reach through
    DeepSpeed's Ulysses adapter (AttributeError in transformers 5.25); `sequence_parallel.resumed_dataloader` skips
    whole batches of the DataLoader the adapter wraps and the rest of a batch's N micro-batches itself. Checked on
    DeepSpeed's adapter class (a new one, wrapping the skipped DataLoader, with the same group) and on the adapter's
    order for N = 2 without its collectives (a resumed run on 2 processes ending at the one-process weights was run
    by hand: docs/train.md)."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter
    from torch.utils.data import DataLoader

    from rope_extend.train.sequence_parallel import resumed_dataloader

    samples = [{"input_ids": torch.full((4,), i), "position_ids": torch.arange(4), "labels": torch.full((4,), i)}
               for i in range(7)]
    group = object()
    adapter = UlyssesSPDataLoaderAdapter(DataLoader(samples, batch_size=1), sp_rank=1, sp_group=group,
                                         sp_world_size=2, device="cpu")
    resumed = resumed_dataloader(adapter, 6)  # 3 batches of the DataLoader, 2 micro-batches each
    assert type(resumed) is UlyssesSPDataLoaderAdapter and resumed is not adapter
    assert (resumed.sp_rank, resumed.sp_group, resumed.sp_world_size, resumed.device) == (1, group, 2, "cpu")
    assert int(next(iter(resumed.dl))["input_ids"][0, 0]) == 3

    class TwoShards(UlyssesSPDataLoaderAdapter):
        """The adapter's order for N = 2 without its collectives: each batch, then its 2 micro-batches."""

        def refill(self):
            batch = next(self.iter)
            self.micro_batches.extend((int(batch["input_ids"][0, 0]), shard) for shard in range(self.sp_world_size))

    for skipped in range(6):  # whole batches skipped in the DataLoader, the rest of one batch by the adapter
        two = TwoShards(DataLoader(samples, batch_size=1), sp_rank=0, sp_group=None, sp_world_size=2, device="cpu")
        assert next(iter(resumed_dataloader(two, skipped))) == (skipped // 2, skipped % 2)


def test_sequence_parallel_refuses_what_cannot_work_in_one_line_before_any_work(tiny_source, tmp_path, capsys,
                                                                                  monkeypatch):
    """Heads that do not split over N, a window that does not, eager attention, a launch of one process, FSDP, a
    ZeRO-3 config that cannot gather the weights, --deepspeed without sequence parallelism: one line naming the fix,
    exit 2, before any model is loaded."""
    source, text = tiny_source
    eager = tmp_path / "eager-src"
    shutil.copytree(source, eager)
    config = json.loads((eager / "config.json").read_text())
    (eager / "config.json").write_text(json.dumps({**config, "attn_implementation": "eager"}))
    ungathered = tmp_path / "zero3-ungathered.json"  # ZeRO-3 that cannot hand the trained weights to the writer
    ungathered.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    out = tmp_path / "out"

    def args(*extra: str, src: Path = source) -> list[str]:
        return ["train", str(src), "--method", "yarn", "--factor", "4", "--text", str(text), "--window", "32",
                "--steps", "2", "-o", str(out), *extra]

    cases = [  # (arguments, the launch's WORLD_SIZE and FSDP flag, what the line must say)
        (args("--sequence-parallel", "3"), 3, None, "4 attention heads, which do not split over 3 processes"),
        (args("--sequence-parallel", "8"), 8, None, "use --sequence-parallel 2 or 4"),
        (args("--sequence-parallel", "2", "--window", "33"), 2, None, "use --window 34 or 32"),
        (args("--sequence-parallel", "2", src=eager), 2, None, "attn_implementation 'eager'"),
        (args("--sequence-parallel", "2"), 1, None, "this launch started 1; start 2 processes"),
        (args("--sequence-parallel", "2"), None, None, "torchrun --nproc_per_node 2"),
        (args("--sequence-parallel", "2"), 2, "true", "not FSDP"),
        (args("--sequence-parallel", "2", "--deepspeed", str(ungathered)), 2, None,
         "set it to true (configs/deepspeed/zero3.json has it)"),
        (args("--deepspeed", str(ROOT / "configs/deepspeed/zero3.json")), None, None,
         "--deepspeed configures a --sequence-parallel run"),
    ]
    for argv, world, fsdp, needle in cases:
        with monkeypatch.context() as patch:
            if world is not None:
                patch.setenv("WORLD_SIZE", str(world))
            if fsdp is not None:
                patch.setenv("ACCELERATE_USE_FSDP", fsdp)
            started = time.perf_counter()
            assert run(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("rope-extend: error:") and needle in err[0], (needle, err)
        assert time.perf_counter() - started < 20  # refused before a model is loaded
        assert not out.exists() and not (tmp_path / "out.train-state").exists()


def test_a_refusal_under_torchrun_is_said_once_by_the_main_process(tiny_source, tmp_path):
    """Issue 57: under `torchrun --nproc_per_node 2` every process refuses the same way; the line is printed once
    (the main process's: the other waits for the launcher to stop it), then torchrun adds its own ChildFailedError
    report, which names exit code 2, and exits 1 itself (what docs/train.md says the user sees)."""
    source, text = tiny_source
    out = tmp_path / "out"
    command, env = _launch_command("torchrun", train_argv(source, text, out, "--sequence-parallel", "3"), tmp_path)
    started = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in result.stderr.splitlines() if line.startswith("rope-extend:")]
    assert lines == ["rope-extend: error: --sequence-parallel 3: the model has 4 attention heads, which do not split "
                     "over 3 processes (Ulysses gives each process heads/N of them); use --sequence-parallel 2 or 4"]
    assert result.returncode == 1 and "ChildFailedError" in result.stderr, result.stderr[-3000:]
    assert "exitcode  : 2" in result.stderr  # torchrun's report names the refusing process's exit code
    assert time.perf_counter() - started < 60 + 60  # the other process did not wait out OTHER_RANK_WAIT_S
    assert not out.exists() and not (tmp_path / "out.train-state").exists()


def test_another_process_that_alone_refuses_still_says_why(tiny_source, tmp_path, capsys, monkeypatch):
    """A process other than the main one waits for the main one to refuse first; still running afterwards (the
    refusal was its own), it prints its line."""
    import importlib

    main = importlib.import_module("rope_extend.cli.main")  # the module (rope_extend.cli.main is also a function)
    waited = []
    monkeypatch.setattr(main, "_wait_for_main_process", lambda: waited.append(True))
    source, text = tiny_source
    for rank, wait in (("1", [True]), ("0", [])):
        waited.clear()
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", "3")
        assert run(train_argv(source, text, tmp_path / "out", "--sequence-parallel", "2")) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--sequence-parallel 2 splits each window over 2 processes, but this launch " \
            "started 3" in err[0], err
        assert waited == wait


def test_the_first_run_says_deepspeed_compiles_its_shared_memory_op(tmp_path, monkeypatch):
    """Issue 57: the first sequence-parallel run on CPU processes spent minutes compiling DeepSpeed's shared-memory
    op without a word. The note names it while torch's extension folder lacks the built op, and not once it is
    there."""
    from rope_extend.train.sequence_parallel import compile_note

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    note = compile_note()
    assert note is not None and "deepspeed_shm_comm" in note and str(tmp_path / "deepspeed_shm_comm") in note, note
    (tmp_path / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").write_bytes(b"")
    assert compile_note() is None


def test_a_missing_deepspeed_names_the_extra_that_installs_it(monkeypatch):
    import importlib.util

    import tomllib

    from rope_extend.train import sequence_parallel

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    reason = sequence_parallel.missing_support()
    assert reason == ("DeepSpeed is not installed (pip install 'rope-extend[train,deepspeed]', or pip install "
                      f"'deepspeed>={sequence_parallel.MIN_DEEPSPEED}')")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["deepspeed"] == [f"deepspeed>={sequence_parallel.MIN_DEEPSPEED}"]


def test_eval_suite_runs_before_and_after_under_their_own_names_with_the_evals_numbers(tiny_source, tmp_path):
    """--eval-suite end to end (2 steps, a tiny suite): the card and training.json show SOURCE unpatched, SOURCE
    with yarn x4 training-free and the trained checkpoint ('trained yarn-x4', never 'unpatched'), and their numbers
    are the eval's own records; the trained row's perplexity is recomputed here from a stock reload of OUT."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rope_extend.eval.perplexity import tokenize_text
    from rope_extend.eval.runner import read_results

    source, text = tiny_source
    heldout = tmp_path / "heldout.txt"
    heldout.write_text(" ".join(f"v{(7 * i) % 53:02d}" for i in range(600)) + "\n")  # shares no text with toy.txt
    suite = tmp_path / "tiny-suite.yaml"
    suite.write_text(f"name: tiny-train\nsmoke: true\nseed: 0\nshort_context: []\nperplexity:\n  texts: [{heldout}]\n"
                     "  lengths: [64, 128]\n  block_size: 16\n  bucket_size: 32\n")
    out = tmp_path / "ev"
    args = ["train", str(source), "--method", "yarn", "--factor", "4", "--text", str(text), "--window", "32",
            "--steps", "2", "--batch-tokens", "64", "--lr", "3e-3", "--warmup", "0", "--eval-suite", str(suite),
            "--no-verify", "-o", str(out)]  # the writer's verification is tested above
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run(args) == 0
    before = read_results(tmp_path / "ev-eval" / "before" / "results.jsonl")
    after = read_results(tmp_path / "ev-eval" / "after" / "results.jsonl")
    assert {r["variant"] for r in before} == {"unpatched", "yarn-x4"}
    assert {r["variant"] for r in after} == {"trained yarn-x4"} and len(after) == 2
    summary = json.loads((out / "training.json").read_text())
    rows = {(r["variant"], r["case_id"]): r for r in summary["eval"]["records"]}
    assert len(rows) == len(before) + len(after) == 6
    for rec in before + after:  # copied from the eval's records, not recomputed or rounded
        row = rows[(rec["variant"], rec["case_id"])]
        assert row["ppl"] == rec["metrics"]["ppl"] and row["ppl_ci"] == rec["metrics"]["ppl_ci"]
    card = (out / "README.md").read_text()
    block = card[card.index("### Before / after"):]
    assert "| unpatched | yarn-x4 | trained yarn-x4 |" in block and "'unpatched' because" not in card
    assert "Suite `tiny-train` (cpu, float32)" in block and "`training.json` (`eval`) holds every measurement" in block
    assert "report.md" not in card and "ev-eval" not in card  # the reports' folder is beside OUT, never published
    assert (summary["eval"]["device"], summary["eval"]["dtype"]) == ("cpu", "float32")
    for part in ("before", "after"):
        meta = json.loads((tmp_path / "ev-eval" / part / "run.json").read_text())
        assert (meta["device"], meta["dtype"]) == ("cpu", "float32")
    for rec in before + after:
        assert f"{rec['metrics']['ppl']:.2f} [" in block
    with warnings.catch_warnings():  # an independent reference for the trained row: stock reload of OUT, HF's loss
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = tokenize_text(AutoTokenizer.from_pretrained(out), heldout.read_text())[None]
    for rec in after:
        L = rec["length"]
        with torch.no_grad():
            loss = model(input_ids=ids[:, :L], labels=ids[:, :L]).loss
        assert rec["metrics"]["ppl"] == pytest.approx(float(torch.exp(loss)), rel=1e-4)
    free = {r["length"]: r["metrics"]["ppl"] for r in before if r["variant"] == "yarn-x4"}
    assert all(abs(r["metrics"]["ppl"] - free[r["length"]]) > 1e-3 * free[r["length"]] for r in after)  # trained


@pytest.mark.parametrize(("device", "dtype", "bf16", "want"), [
    ("cpu", "auto", True, ("cpu", "float32")), ("cpu", "bfloat16", True, ("cpu", "float32")),
    ("cuda", "auto", True, ("cuda", "bfloat16")), ("cuda", "auto", False, ("cuda", "float32")),
    ("cuda", "float32", True, ("cuda", "float32")), ("cuda", "bfloat16", True, ("cuda", "bfloat16"))])
def test_eval_suite_runs_where_the_training_runs(monkeypatch, device, dtype, bf16, want):
    """--eval-suite before/after on the training's device: float32 on the CPU (the CPU records' setting), the
    training's bf16 on a GPU (the GPU records' setting), so a GPU run does not evaluate 64k prompts on the CPU."""
    from rope_extend.train import TrainSpec, evaluation

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    spec = TrainSpec(source="s", output="o", rope=None, texts=["t"], dtype=dtype)
    assert tuple(evaluation.settings(spec, device).values()) == want


def test_the_pose_flop_bound_counts_what_torch_counts_in_a_forward():
    """bench/train_speed.py's bound on PoSE's per-token speed-up: its matrix-product FLOPs per token against torch's
    own FLOP counter on a forward of a tiny GQA llama (eager attention scores every query-key pair, a causal count
    (n + 1) / 2n of them)."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(ROOT / "bench"))
    from train_speed import matmul_flops_per_token

    config = LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, vocab_size=300, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    model.config._attn_implementation = "eager"
    n = 40
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.randint(0, 300, (1, n)))
    ours = matmul_flops_per_token(config, n)
    assert counter.get_total_flops() / n == pytest.approx(ours["weights"] + ours["attention"] * 2 * n / (n + 1))
    assert ours["weights"] == 2 * sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_train_push_to_hub_uploads_the_written_checkpoint(tiny_source, tmp_path, monkeypatch, capsys):
    """`train --push-to-hub` ends with the same publishing code as `patch` (tests/test_hub_push.py), against the
    local Hub server: after training, the repo receives exactly OUT's files, byte for byte, card and training
    records included, in one commit; the token is printed nowhere."""
    from hubserver import HubServer
    from huggingface_hub import constants

    from rope_extend.record import read_record

    source, text = tiny_source
    secret = "hf_SECRETtoken1234567890abcdef"
    out = tmp_path / "pushed"
    with HubServer() as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setenv("HF_TOKEN", secret)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            code = run(["train", str(source), "--method", "yarn", "--factor", "4", "--text", str(text), "--window",
                        "32", "--steps", "2", "--batch-tokens", "64", "--warmup", "0", "-o", str(out),
                        "--push-to-hub", "me/tiny-trained"])
    printed = capsys.readouterr()
    assert code == 0, printed.err[-3000:]
    assert secret not in printed.out + printed.err
    repo = hub.repos["me/tiny-trained"]
    recorded = read_record(out)  # every file train wrote; the card's serving commands name the repo
    card = expected_card(out, "me/tiny-trained")  # its Serving section naming the repo
    local_card, sent_card = (hashlib.sha256(c).hexdigest() for c in ((out / "README.md").read_bytes(), card))
    record = (out / "rope_extend.yaml").read_text()  # the uploaded one vouches for the card it sends
    assert f"README.md: sha256 {local_card}\n" in record
    from rope_extend.record import MODEL_ID, PUBLIC_NOTE, RECORD_NOTE

    public = (record.replace(local_card, sent_card).replace(RECORD_NOTE, PUBLIC_NOTE)  # the record as pushed:
              .replace("output_record:\n", "output_record:\n  model_id: me/tiny-trained\n", 1)  # names the repo
              .replace(MODEL_ID, "me/tiny-trained"))
    assert MODEL_ID in record and "model_id" not in record
    assert repo.files == {name: (out / name).read_bytes() for name in recorded.files} | {
        "README.md": card, "rope_extend.yaml": public.encode()}
    assert {"README.md", "config.json", "model.safetensors", "training.json", "training_log.jsonl"} <= set(repo.files)
    assert len(repo.commits) == 1 and f"pushed: {hub.endpoint}/me/tiny-trained" in printed.out
