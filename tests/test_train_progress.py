"""A newcomer's first `rope-extend train` run (issue 36 §5): what it says before the first step, inside a long
step, on the first and the second signal, and what it leaves on disk. Same tiny model as tests/test_train.py."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import warnings

import pytest
from helpers import child_env, train_argv

from rope_extend.cli import run
from rope_extend.train import progress


def test_the_first_lines_give_tokens_per_step_an_estimate_and_progress_inside_a_step(tiny_source, tmp_path,
                                                                                    capsys, monkeypatch):
    """4 windows of 32 tokens per step = 4 micro-batches: the plan line before the first step, the estimate from
    the first micro-batch, and (the interval set to 0) a line per micro-batch inside a step."""
    source, text = tiny_source
    monkeypatch.setattr(progress, "INTERVAL_SECONDS", 0.0)
    args = ["train", str(source), "--method", "yarn", "--factor", "4", "--text", str(text), "--window", "32",
            "--steps", "2", "--batch-tokens", "128", "--warmup", "0", "--no-verify", "-o", str(tmp_path / "o")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run(args) == 0
    err = [line.removeprefix("rope-extend: ") for line in capsys.readouterr().err.splitlines()]
    plan = next(i for i, line in enumerate(err) if line.startswith("128 tokens per step"))
    assert err[plan] == ("128 tokens per step (4 micro-batch(es) of 32 tokens per process), 2 step(s) to run = "
                         "256 tokens; timing the first micro-batch")
    estimate = err[plan + 1]
    m = re.fullmatch(r"first micro-batch: ([\d.]+) s for 32 tokens \(([\d,]+) tokens/s per process, warm-up "
                     r"included\); estimate ~(\d+)m(\d\d)s per step, ~(\d+)m(\d\d)s for 2 step\(s\)", estimate)
    assert m, estimate
    step_s = int(m[3]) * 60 + int(m[4])
    assert abs(step_s - 4 * float(m[1])) <= 1 and abs(int(m[5]) * 60 + int(m[6]) - 8 * float(m[1])) <= 1
    assert err[plan + 2:plan + 4] == [line for line in err if line.startswith("step 1/2: micro-batch")][:2]
    assert [line.split(" (")[0] for line in err if line.startswith("step 1/2: micro-batch")] == [
        "step 1/2: micro-batch 2/4", "step 1/2: micro-batch 3/4"]  # the 1st is the estimate, the 4th ends the step
    assert any(line.startswith("step 2/2 loss") for line in err)
    assert any(re.match(r"attention: sdpa \(flash kernel\); gradient checkpointing off \(auto: ~[\d.]+ GiB of "
                        r"activations per micro-batch without it, [\d.]+ GiB available\); loss in chunks", line)
               for line in err), err


def _start(tiny_source, out, *extra):
    source, text = tiny_source
    command = [sys.executable, "-m", "rope_extend", *train_argv(source, text, out, *extra)]
    return subprocess.Popen(command, env=child_env(), stderr=subprocess.PIPE, text=True, bufsize=1)


def _read_until(proc, pattern: str, timeout: float = 180) -> list[str]:
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise AssertionError(f"exited {proc.wait()} before {pattern!r}: {''.join(lines)[-3000:]}")
        lines.append(line)
        if re.search(pattern, line):
            return lines
    raise AssertionError(f"no {pattern!r} in time: {''.join(lines)[-3000:]}")


def test_one_sigterm_says_it_stops_after_the_step_and_names_the_checkpoint_it_keeps(tiny_source, tmp_path):
    out = tmp_path / "one"
    proc = _start(tiny_source, out, "--batch-tokens", "256")  # 8 micro-batches per step
    _read_until(proc, r"step 1/6 loss")
    proc.send_signal(signal.SIGTERM)
    said = _read_until(proc, r"SIGTERM received")[-1]
    assert re.search(r"SIGTERM received: stopping after the current step \(\d/6\) with a checkpoint in "
                     r".*one\.train-state; send it again \(or Ctrl-C\) to stop now, keeping the last checkpoint",
                     said), said
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 143, rest
    last = rest.strip().splitlines()[-1]
    m = re.fullmatch(r"rope-extend: interrupted \(SIGTERM\) at step (\d): stopped after the step; kept: (\S+) \(step "
                     r"(\d)\) in (\S+); rerun the same command to resume from it \(--restart discards it\)", last)
    assert m, last
    assert m[1] == m[3] and m[2] == str(tmp_path / "one.train-state" / f"checkpoint-{m[1]}")
    assert (tmp_path / "one.train-state" / f"checkpoint-{m[1]}" / "trainer_state.json").is_file()


def test_a_second_signal_stops_mid_step_naming_it_and_what_is_left(tiny_source, tmp_path):
    """SIGTERM after the first micro-batch of a 64-micro-batch step, then SIGINT: exit 130, the line names SIGINT
    (not the first signal, not a generic 'interrupted'), and says no checkpoint exists yet."""
    out = tmp_path / "two"
    proc = _start(tiny_source, out, "--batch-tokens", "2048")
    _read_until(proc, r"^rope-extend: first micro-batch")
    proc.send_signal(signal.SIGTERM)
    _read_until(proc, r"SIGTERM received")
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130, rest
    last = rest.strip().splitlines()[-1]
    assert last == (f"rope-extend: interrupted (SIGINT) at step 1: stopped now (second signal); no checkpoint was "
                    f"saved yet ({tmp_path / 'two.train-state'} holds only the run's fingerprint); rerunning the same "
                    "command starts over"), last
    assert not out.exists() and not list((tmp_path / "two.train-state").glob("checkpoint-*"))


@pytest.mark.parametrize("seconds,text", [(59.6, "1m00s"), (3600 * 5 + 60 * 7, "5h07m"), (86400 * 3 + 7200, "3d02h"),
                                          (float("nan"), "?")])
def test_durations_read_as_minutes_hours_days(seconds, text):
    assert progress.duration(seconds) == text


def test_an_interrupt_before_training_names_the_state_folder(tmp_path, capsys):
    """A signal while `train` loads or tokenises: OUT does not exist yet, but OUT.train-state does (its fingerprint);
    the line says so instead of only 'nothing was left at OUT'."""
    import signal

    from rope_extend.cli.main import Signals, interrupted

    out = tmp_path / "out"
    signals = Signals()
    signals.received = signal.SIGTERM
    assert interrupted(signals, out, atomic=False) == 143
    assert capsys.readouterr().err.strip() == f"rope-extend: interrupted (SIGTERM); nothing was left at {out}"
    (tmp_path / "out.train-state").mkdir()
    assert interrupted(signals, out, atomic=False) == 143
    line = capsys.readouterr().err.strip()
    assert line == (f"rope-extend: interrupted (SIGTERM); nothing was left at {out}; {out}.train-state keeps this "
                    "run's training state: rerun the same command to resume from it")
