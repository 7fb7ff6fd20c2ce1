"""The run-engine interface (`rope_extend.engines.runs`) and the report a CI can use, without a real engine.

`StockTransformers` is a run engine as an adapter writes one (`RunEngine`), the run half of a throwaway room
(`StockRoom`: vLLM's rules under another name, registered from outside the package): its worker serves a folder the
way the room's card lines say (this checkpoint as written; the original model with `--hf-overrides` applied to its
config.json) by loading it with stock transformers, so where the card says identical it is identical, up to
float32 rounding: an honest engine. `forged` adds a constant to every log-probability it returns: the run measured
otherwise what the card lists as identical, and `rope-extend engines` must exit 3. The model is the demo model's
first 2 layers with a 256-token window (`short_window`), served at 2x: requests of 256 and 512 tokens.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from rope_extend.cli import run
from rope_extend.engines import registry, runs
from rope_extend.engines.parity import TABLE_CONFIG, parity
from rope_extend.engines.run_engine import EngineRefused, RunEngine
from rope_extend.engines.runs import port_verdicts
from rope_extend.engines.vllm.engine import VLLM as VLLM_ROOM
from rope_extend.engines.vllm.engine import VllmEngine

VLLM, SGLANG = runs.lookup("vllm"), runs.lookup("sglang")  # the registered adapters


class StockWorker:
    """Serves one folder at a time with stock transformers (float32, CPU)."""

    version, device = "5-stock", "cpu"

    def __init__(self, offset: float, events: list):
        self.offset, self.events, self.model = offset, events, None

    def label(self, route: str) -> str:
        return f"Stock {self.version} on {self.device}, {route}"

    def load(self, folder: Path, overrides: dict | None, tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from rope_extend.engines.runs import linked_folder

        config = json.loads((folder / "config.json").read_text())
        config.update(overrides or {})  # what `--hf-overrides` does to the loaded config
        served = linked_folder(folder, config, tmp / f"served-{len(self.events)}")
        self.events.append(("load", folder.name, time.perf_counter()))
        self.model = AutoModelForCausalLM.from_pretrained(str(served), dtype=torch.float32).eval()

    def prompt_logprobs(self, ids: list[int]) -> list[float]:
        import torch

        from rope_extend.eval.perplexity import token_losses

        if len(ids) + 1 > self.model.config.max_position_embeddings:
            raise EngineRefused(f"{len(ids)} tokens exceed max_position_embeddings")
        self.events.append(("request", len(ids) + 1, time.perf_counter()))
        return [self.offset - float(x) for x in token_losses(self.model, torch.tensor(ids))]

    def generate(self, ids: list[int], max_tokens: int) -> list[int]:
        raise NotImplementedError

    def close(self, now: bool = False) -> None:
        self.events.append(("close", now, time.perf_counter()))


class StockTransformers:
    """A run engine that serves its room's card lines (vLLM's rules) with stock transformers."""

    name = "stock"
    title = "Stock"
    runs = {"stock": "offline"}
    eval_route = "offline"
    options = ()

    def __init__(self, tmp: Path, offset: float = 0.0):
        self.tmp, self.offset, self.events = tmp, offset, []

    def environment_label(self) -> str:
        return "Stock 5-stock"

    def card_routes(self, hint):
        return runs.card_routes(hint)

    def eval_serving(self, plan, original_config, max_len, lengths):
        settings = VLLM.eval_serving(plan, original_config, max_len, lengths).settings
        return port_verdicts(VLLM_ROOM, plan, settings, original_config, lengths)

    def open(self) -> StockWorker:
        self.events.append(("open", None, time.perf_counter()))
        return StockWorker(self.offset, self.events)

    def load(self, worker, folder, settings, *, route, engine_args=None) -> float:
        worker.load(Path(folder), settings.hf_overrides, self.tmp)
        return 0.0

    def describe(self, settings) -> dict:
        return VLLM.describe(settings)


class StockRoom(VllmEngine):
    """A throwaway room registered from outside the package: vLLM's rules and port, its own name, its run adapter."""

    name, title, version = "stock", "Stock", "stand-in 1.0 (vLLM 0.34.0's rules)"
    first_choice = None

    def __init__(self, adapter: StockTransformers):
        self.adapter = adapter

    @property
    def run(self) -> StockTransformers:
        return self.adapter


@pytest.fixture
def stock(tmp_path):
    rooms = []

    def register(offset: float = 0.0) -> StockTransformers:
        engine = StockTransformers(tmp_path, offset)
        assert isinstance(engine, RunEngine)
        rooms.append(registry.registered(StockRoom(engine)))
        rooms[-1].__enter__()
        return engine

    yield register
    for room in reversed(rooms):
        room.__exit__(None, None, None)


class Stamped:
    """stderr, noting when the first progress line was written."""

    def __init__(self, stream):
        self.stream, self.first = stream, None

    def write(self, text: str) -> int:
        if self.first is None and text.startswith("rope-extend: engines"):
            self.first = time.perf_counter()
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def engines(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    code = run(["engines", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- the registry ------------------------------------------------------------------------------------------------------
def test_the_registry_names_every_engine_once():
    assert runs.eval_engines()[:3] == ("transformers", "vllm", "sglang")
    assert runs.run_names()[:3] == ["vllm", "vllm-server", "sglang"]
    assert runs.lookup("transformers") is None and runs.lookup("vllm").title == "vLLM"
    assert runs.lookup("sglang").title == "SGLang"
    assert [route for _, route in runs.resolve_runs(["vllm-server", "vllm", "sglang"])] == ["server", "offline", "server"]
    with pytest.raises(ValueError, match="--engine 'vlm': expected one of transformers, vllm, sglang"):
        runs.lookup("vlm")
    with pytest.raises(ValueError, match="registered already"):
        registry.register(VLLM_ROOM)
    with pytest.raises(ValueError, match="--tensor-parallel-size is not an argument of --engine transformers: add "
                                         "--engine vllm or --engine sglang"):
        runs.check_engine_args({"tensor_parallel_size": 2}, "transformers")
    runs.check_engine_args({"tensor_parallel_size": 2}, "vllm")
    runs.check_engine_args({"tensor_parallel_size": 2}, "sglang")
    with pytest.raises(ValueError, match="--pipeline-parallel-size is not an argument of --engine sglang: add "
                                         "--engine vllm"):
        runs.check_engine_args({"pipeline_parallel_size": 2}, "sglang")


def test_eval_refuses_an_engine_argument_the_engine_does_not_take(capsys, tmp_path):
    code = run(["eval", "smollm2", "-o", str(tmp_path / "o"), "--tensor-parallel-size", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--tensor-parallel-size is not an argument of --engine transformers" in err[0]
    assert not (tmp_path / "o").exists()


# --- the report a CI can use -------------------------------------------------------------------------------------------
def test_an_engine_that_serves_as_the_card_says_exits_0_with_its_evidence_and_progress(stock, short_window, capsys,
                                                                                        monkeypatch):
    engine = stock()
    stamped = Stamped(sys.stderr)
    monkeypatch.setattr(sys, "stderr", stamped)
    started = time.perf_counter()
    code, out, err = engines(capsys, short_window, "--method", "yarn", "--factor", "2", "--run", "stock", "--json")
    assert code == 0, err
    assert stamped.first - started < 30, stamped.first - started  # the first progress line, within 30 s
    # progress on stderr: the plan first, a line before and after each step (engine start, each request), with the
    # elapsed time and, once a request has run, an estimate of what is left; nothing more
    lines = [line for line in err.splitlines() if line.startswith("rope-extend: engines ")]
    assert lines[0].startswith("rope-extend: engines --run: Stock (offline): each engine started, the transformers")
    # the estimate comes before anything starts: the 2 reference requests and 2 x 2 engine ones, timed by two
    # transformers forwards on this machine
    assert lines[1].startswith("rope-extend: engines estimate: about 0:") and "for 6 requests (2304 tokens)" in lines[1]
    assert "transformers ran 256 tokens in" in lines[1] and "512 tokens in" in lines[1]
    assert "Stock: starting its worker" in lines[2] and "ready in" in lines[3]  # the engine starts first
    assert all("left)" in line for line in lines[2:])  # calibrated: what is left is said from the start
    assert sum("transformers (reference): request of" in line for line in lines) == 2
    requests = [line for line in lines if "Stock 5-stock on cpu, offline: request of" in line]
    assert len(requests) == 4 and all("elapsed" in line for line in requests)
    assert "left)" in lines[-1]
    assert len(lines) == 1 + 1 + 2 * 2 + 2 + 2 * 2 + 2 * 4, lines
    rows = json.loads(out)["rows"]
    ran = [r for r in rows if r["engine"].startswith("Stock")]
    assert [r["route"] for r in ran] == ["this checkpoint", "original model + --hf-overrides"]
    assert [e[0] for e in engine.events].count("load") == 2 and engine.events[-1][0] == "close"
    for row in ran:
        assert (row["label"], row["kind"], row["version"], row["device"]) == ("run", "run", "5-stock", "cpu")
        assert row["identical"] and row["short"]["tokens"] == 256 and row["long"]["tokens"] == 512
        evidence = row["evidence"]
        assert evidence["max_abs_dlogprob"] == max(row["short"]["max_abs_dlogprob"], row["long"]["max_abs_dlogprob"])
        assert evidence["max_abs_dlogprob"] < 1e-3 and "log-probability" in evidence["measure"]
    port = next(r for r in rows if r["engine"] == StockRoom.version and r["route"] == "this checkpoint")
    assert (port["label"], port["version"], port["device"]) == ("port", StockRoom.version, None)
    assert port["evidence"]["max_abs_dcos"] == max(port["short"]["max_abs_dcos"], port["long"]["max_abs_dcos"])
    assert "contradicted" not in err


def test_a_run_that_contradicts_the_card_exits_3_and_says_where(stock, short_window, capsys, monkeypatch):
    """The same engine, forged to move every log-probability by 0.2 nats: the card's two vLLM lines say identical at
    both lengths, the run measures otherwise: exit 3, one line per request on stderr, the table still printed."""
    monkeypatch.setenv("COLUMNS", "200")  # a row on one line
    stock(offset=0.2)
    code, out, err = engines(capsys, short_window, "--method", "yarn", "--factor", "2", "--run", "stock")
    assert code == 3
    said = [line for line in err.splitlines() if line.startswith("contradicted: ")]
    assert len(said) == 4 and all("the card says identical; measured |Δ logprob| max 0.2" in line for line in said)
    words = " ".join(out.split())
    assert "a run row: max / mean |Δ logprob| of the prompt tokens against transformers" in words
    assert "a port row: max |Δcos|, |Δsin| against rope-extend's RoPE" in words
    (line,) = [line for line in out.splitlines() if "Stock" in line and "this checkpoint" in line]
    assert line.split()[:6] == ["Stock", "5-stock", "on", "cpu,", "offline", "(run)"] and "0.2 / 0.2 logprob" in line
    code, out, _ = engines(capsys, short_window, "--method", "yarn", "--factor", "2", "--run", "stock", "--json")
    assert code == 3 and json.loads(out)["rows"]  # --json too: the report on stdout, the exit code for CI


def test_a_method_the_card_does_not_claim_is_not_a_contradiction(stock, short_window, capsys):
    """dynamic: the card serves vLLM up to L only (its long request is not claimed), so a run that differs there
    (here stock transformers' dynamic, which matches) exits 0; the forged run differs on the claimed short request."""
    stock(offset=0.2)
    code, _, err = engines(capsys, short_window, "--method", "dynamic", "--factor", "2", "--run", "stock")
    said = [line for line in err.splitlines() if line.startswith("contradicted: ")]
    assert code == 3 and said and all("short request" in line for line in said)


def test_run_never_labels_a_row_that_was_not_run(stock, capsys, monkeypatch):
    """A config without weights: the run rows say "not run" (the engine is not even started), and so does the other
    transformers line without its Python; only rows that ran say run."""
    monkeypatch.delenv("ROPE_EXTEND_OTHER_PYTHON", raising=False)
    engine = stock()
    report = parity(source=TABLE_CONFIG, spec={"method": "yarn", "factor": 2}, runs=["stock"])
    ran = [row for row in report.rows if row.served_by_engine]
    assert len(ran) == 2 and all(row.label == "not run" for row in ran) and engine.events == []
    assert {row.label for row in report.rows} == {"run", "port", "not run"}
    for row in report.rows:
        assert (row.label == "run") == (row.kind == "run" and not row.skipped), row
    for row in report.to_dict()["rows"]:  # the JSON says what kind of check a row is and what was done, apart
        assert "checked" not in row and row["kind"] in ("port", "run")
        assert row["label"] == ("not run" if "not run" in json.dumps([row["short"], row["long"]]) else row["kind"])
    other = next(row for row in report.rows if row.engine == "transformers (other line)")
    assert other.label == "not run" and "| not run |" in report.markdown()
    assert report.contradictions() == []


def test_an_interrupt_is_acknowledged_at_once_and_stops_the_engines_within_seconds(stock, short_window, capsys,
                                                                                   monkeypatch):
    """Ctrl-C during a long engine request: one line on stderr within a second saying the signal was received, the
    run's engines stopped at once (`close(now=True)`, not after their request), exit 130 within a few seconds."""
    import os
    import signal
    import threading

    engine = stock()
    calls = []

    def slow(self, ids):  # a request that would take a minute
        calls.append(time.perf_counter())
        for _ in range(600):
            time.sleep(0.1)
        raise AssertionError("not interrupted")

    monkeypatch.setattr(StockWorker, "prompt_logprobs", slow)
    stamped = Stamped(sys.stderr)
    monkeypatch.setattr(sys, "stderr", stamped)
    sent = []

    def interrupt():
        while not calls:
            time.sleep(0.05)
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    code, _, err = engines(capsys, short_window, "--method", "yarn", "--factor", "2", "--run", "stock")
    ended = time.perf_counter()
    assert code == 130 and ended - sent[0] < 5, (code, ended - sent[0])
    assert [(kind, now) for kind, now, _ in engine.events if kind == "close"] == [("close", True)]
    assert err.strip().splitlines()[-1].startswith("rope-extend: interrupted (SIGINT)")
