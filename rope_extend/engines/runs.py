"""Run engines: real serving engines rope-extend starts, serves a checkpoint in and reads back, each the run adapter
of its engine's room (`ServingEngine.run`, `engines.registry`). The one interface behind `rope-extend eval --engine
NAME` (every variant served by the engine: `eval.backends`) and `rope-extend engines --run NAME` (the parity report's
"run" rows: `engines.parity`).

transformers is the reference engine (`REFERENCE`): what both commands compare the others with, run in this
process (eval patches the loaded model; the parity report runs rope-extend's RoPE on the original model). It has no
adapter: `lookup(REFERENCE)` is None, every other name is a registered `RunEngine` or a ValueError.

What an adapter provides (`engines/vllm/run.py` is the worked example; docs/development.md, "Adding a serving
engine", walks through it):

- A worker: a process of the engine's own Python (its virtualenv) that serves one checkpoint at a time and answers
  the `EngineWorker` operations: `prompt_logprobs(ids)` (log p of tokens 1..n-1, NaN where the engine gives NaN),
  `generate(ids, max_tokens)` (greedy token ids), `label(route)` (what a row names: engine, version, device,
  route), `version`, `device`, `close()`. A load or request the engine refuses raises `EngineRefused` (a subclass)
  with the engine's own message: for the report that is a result, not a failure.
- The adapter object, a `RunEngine`: its names (`name`, the room's name, for `--engine`; `title` as the card names
  it; `runs` mapping each `--run` name to a route; `eval_route`), the engine arguments eval passes through
  (`options`: the names of the `eval.options.EngineArgs` fields it takes, where each is declared), and six
  methods: `environment_label()` (its environment built when missing, named), `card_routes(hint)`
  (the routes of its room's hint it serves: `runs.card_routes`), `eval_serving(plan,
  config, max_len, lengths)` (what it would serve for an eval variant, checked before anything loads through the
  room's port: `port_verdicts`), `open()` (start a worker), `load(worker, folder, settings, route=...,
  engine_args=...)` (serve one checkpoint folder with a route's settings, as the room's hint gives them) and
  `describe(settings)` (what eval records of how a variant was served).
- The room's `ServingEngine.run` returns it (imported there lazily, so the registry never loads an environment's
  code). Nothing else names the engine: eval, its CLI, the parity report and `engines --run` read the registry.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .run_engine import EngineRefused, EngineWorker, EvalServing, RunEngine

if TYPE_CHECKING:
    from ..plan import PatchPlan
    from .hint import EngineHint, Route
    from .registry import ServingEngine

REFERENCE = "transformers"  # the reference engine: in this process, no adapter

# Identical within: every prompt token's |Δ logprob| (nats) <= LOGPROB_TOL and their mean <= MEAN_TOL, no NaN. Kernels
# and the float32 rounding of the rotation angle differ between engines. Measured with vLLM on the demo model (30
# layers) at 12288 tokens, 2026-12-05: YaRN x1.5 (vLLM computes p·θ as transformers does) max 2.3e-4, mean 6.9e-6;
# linear x1.5 (vLLM rounds p/s, transformers θ/s: the angle rounding the port's float32 tolerance admits, ~7e-4 rad at
# the fastest frequency) max 1.6e-2 on one token, mean 2.6e-4, mean signed difference 1.8e-5 (the perplexities agree
# to 2e-5). A RoPE that differs moves every token: by 0.05 to 1 and more on the suite's 2-layer model.
LOGPROB_TOL = 5e-2
MEAN_TOL = 1e-3


def run_engines() -> list[RunEngine]:
    """The run adapters of the registered serving engines (`registry`), in their order."""
    from .registry import serving_engines

    adapters = [engine.run for engine in serving_engines() if engine.run is not None]
    names = [run for adapter in adapters for run in adapter.runs]
    clash = sorted({run for run in names if names.count(run) > 1})
    if clash:
        raise ValueError(f"--run {clash[0]} is registered by two run engines; give each route its own name")
    return adapters


def eval_engines() -> tuple[str, ...]:
    """Every `eval --engine` name: the reference first."""
    return (REFERENCE, *(engine.name for engine in run_engines()))


def lookup(name: str) -> RunEngine | None:
    """The adapter of `eval --engine NAME`; None for the reference (transformers, in this process)."""
    for engine in run_engines():
        if engine.name == name:
            return engine
    if name != REFERENCE:
        raise ValueError(f"--engine {name!r}: expected one of {', '.join(eval_engines())}")
    return None


def run_names() -> list[str]:
    return [run for engine in run_engines() for run in engine.runs]


def resolve_runs(runs) -> list[tuple[RunEngine, str]]:
    """(adapter, route) of every `--run NAME`, in order, or ValueError naming the choices (before anything loads)."""
    out = []
    for run in runs:
        engine = next((e for e in run_engines() if run in e.runs), None)
        if engine is None:
            raise ValueError(f"--run {run!r}: the real engines rope-extend runs are {', '.join(run_names())}")
        out.append((engine, engine.runs[run]))
    return out


def check_engine_args(engine_args: Mapping[str, Any], name: str) -> None:
    """ValueError when `engine_args` holds an argument the engine `name` does not take, naming the engines that do."""
    adapter = lookup(name)
    taken = adapter.options if adapter is not None else ()
    extra = [key for key in engine_args if key not in taken]
    if extra:
        flag = "--" + extra[0].replace("_", "-")
        owners = [e.name for e in run_engines() if extra[0] in e.options]
        fix = f"add --engine {' or --engine '.join(owners)}" if owners else "no engine takes it"
        raise ValueError(f"{flag} is not an argument of --engine {name}: {fix}")


def recorded_runs(engine: RunEngine, method: str) -> list[dict]:
    """The runs of `method` in the real `engine` recorded in the project's evidence
    (`rope_extend/engines/<name>/runs.json`, written by `tools/run_engines.py --summarize` from eval/reports/): model,
    factor, request lengths, engine, device, date, verdict per the engines table's words; [] when none."""
    path = Path(__file__).parent / engine.name / "runs.json"
    if not path.is_file():
        return []
    return json.loads(path.read_text())["methods"].get(method, [])


def card_routes(hint: EngineHint) -> list[Route]:
    """Every route of an engine's hint that has settings to serve (what a run adapter's `card_routes` returns)."""
    return [route for route in hint.routes if route.settings is not None]


# --- what a run engine serves, checked through its port before anything loads ---------------------------------------
def card_settings(engine: ServingEngine, plan: PatchPlan, config: dict) -> Any:
    """The settings of `engine`'s card route for the original model (its overrides) for `plan` on `config`."""
    from .hint import ORIGINAL
    from .written import Written

    route = engine.hint(Written.of(plan, config)).route(ORIGINAL)
    return None if route is None else route.settings


def port_verdicts(engine: ServingEngine, plan: PatchPlan | None, settings: Any, config: dict,
                  lengths) -> EvalServing:
    """`settings` for an eval variant (the original model served with plan's method; None: unpatched), and per request
    length n (positions 0..n-1) None where the engine's port serves rope-extend's RoPE identically, else why not."""
    from . import hf_config
    from .hint import ORIGINAL, Route
    from .served import NotServed, compare, own_rope

    route = Route("eval", ORIGINAL, "", True, None, settings)
    verdicts: dict[int, str | None] = {}
    for n in sorted(set(lengths)):
        if plan is not None and plan.method.acts_on_attention:
            verdicts[n] = f"{plan.spec.method} acts on attention, which {engine.title} does not apply"
            continue
        served = engine.served(route, config, n)
        if isinstance(served, NotServed):
            verdicts[n] = served.reason
        elif plan is None:  # the original RoPE, within the window the model claims
            window = int(hf_config.text_part(config).get("max_position_embeddings") or n)
            verdicts[n] = None if n <= window else f"beyond the model's {window}-token window"
        else:
            delta = compare(served, own_rope(plan, n), n)
            verdicts[n] = None if delta.identical else (
                f"{engine.version} builds cos/sin {max(delta.max_cos, delta.max_sin):.2g} away from rope-extend's"
                + (f": {served.note}" if served.note else ""))
    return EvalServing(settings, verdicts)


# --- comparison with the reference ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LogprobDelta:
    """A run engine's prompt log-probabilities against transformers' for one request of n tokens (n - 1 prompt
    tokens, each but the first scored, and one generated token); the statistics are over the tokens where the engine
    gave a number."""

    n: int
    max_abs: float  # max |Δ logprob|
    mean_abs: float  # mean |Δ logprob|
    mean: float  # mean Δ logprob (engine - transformers): minus the change of the mean loss
    nan: int  # tokens where the engine gave NaN
    first_nan: int | None  # the first of them (its position in the prompt)

    @property
    def identical(self) -> bool:
        return self.nan == 0 and self.max_abs <= LOGPROB_TOL and self.mean_abs <= MEAN_TOL

    def describe(self) -> str:
        text = f"|Δ logprob| max {self.max_abs:.2g}, mean {self.mean_abs:.2g} (mean Δ {self.mean:+.2g})"
        if self.nan:
            return f"NaN log-probabilities from token {self.first_nan} on ({self.nan} of {self.n - 2}); elsewhere {text}"
        return text


class EngineError(RuntimeError):
    """A run engine answered something rope-extend cannot compare (a wrong number of log-probabilities)."""


def compare_logprobs(engine: list[float], reference) -> LogprobDelta:
    """`engine`: a run engine's log-probabilities of tokens 1..n-1; `reference`: transformers' (a tensor or list)."""
    ref = [float(x) for x in reference]
    if len(engine) != len(ref):
        raise EngineError(f"the engine returned {len(engine)} log-probabilities for {len(ref)} prompt tokens")
    nans = [i for i, v in enumerate(engine) if math.isnan(v)]
    diffs = [v - r for v, r in zip(engine, ref) if not math.isnan(v)]
    count = max(1, len(diffs))
    return LogprobDelta(n=len(ref) + 2, max_abs=max(map(abs, diffs), default=0.0),
                        mean_abs=sum(map(abs, diffs)) / count, mean=sum(diffs) / count, nan=len(nans),
                        first_nan=nans[0] + 1 if nans else None)


def log_tail(path: Path, engine: str, lines: int = 30) -> str:
    """The last `lines` lines of an engine's log, headed with its name and path, to end an error message ("" when
    the log cannot be read)."""
    try:
        with open(path, errors="replace") as f:
            tail = deque(f, maxlen=lines)
    except OSError:
        return ""
    return f"\n--- {engine} log ({path}), last lines ---\n" + "".join(tail)


def linked_folder(weights: Path, config: dict, folder: Path) -> Path:
    """`folder` holding `config` as config.json and links to every other file of `weights` (a checkpoint served
    with another config.json: the original model's, or one planned in memory); nothing is copied."""
    folder.mkdir(parents=True)
    for item in Path(weights).iterdir():
        if item.name != "config.json" and not item.name.startswith("."):
            (folder / item.name).symlink_to(item.resolve())
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def serve_and_compare(engine: RunEngine, worker: EngineWorker, route: str, folder: Path, settings: Any, *,
                      requests: dict[int, list[int]], reference: dict[int, list[float]],
                      progress: RunProgress | None = None) -> dict[int, LogprobDelta | str]:
    """Load `folder` in `worker` with the card route's `settings` and run every request ({n: the n - 1 prompt tokens
    of a request of n tokens}): a LogprobDelta each, or the engine's refusal (a string: why the load or the request
    was refused)."""
    progress = progress or RunProgress.silent()
    try:
        with progress.step(f"{worker.label(route)}: starting on {folder.name}"):
            engine.load(worker, folder, settings, route=route)
    except EngineRefused as exc:
        return {n: f"{engine.title} refused to start: {exc}" for n in requests}
    out: dict[int, LogprobDelta | str] = {}
    for n, ids in requests.items():
        try:
            with progress.request(worker.label(route), n):
                out[n] = compare_logprobs(worker.prompt_logprobs(ids), reference[n])
        except EngineRefused as exc:
            out[n] = f"{engine.title} refused the request: {exc}"
    return out


class Workers:
    """One worker per run engine, started on first use (a line before and after), closed at the end."""

    def __init__(self, progress: RunProgress):
        self.progress, self.open = progress, {}

    def __call__(self, engine: RunEngine) -> EngineWorker:
        if engine.name not in self.open:
            with self.progress.step(f"{engine.title}: starting its worker (the engine's environment is built first "
                                    "when missing)"):
                self.open[engine.name] = engine.open()
        return self.open[engine.name]

    def close(self, now: bool = False) -> None:
        """Close every worker; `now` (an interrupt): stop the engines at once."""
        for worker in self.open.values():
            worker.close(now)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        self.close(now=kind is not None)  # an interrupt or a failure: the engines are stopped at once


# --- progress -----------------------------------------------------------------------------------------------------------
def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class RunProgress:
    """One line on stderr per step of a run (`rope-extend engines --run`): the estimate before anything starts
    (`calibrated`), then before an engine starts and after, before each request and after, with the elapsed time and
    what is left. A request's cost is its length until `calibrated` gives the machine's seconds for n tokens; once
    requests have run, what is left is their measured seconds per unit of cost times the cost still to run. A line
    per event, never a redrawn bar: it reads the same in a log."""

    def __init__(self, requests: Sequence[int] = (), write: Callable[[str], None] | None = None):
        self.requests = list(requests)  # every request's length the run will serve, the reference's included
        self.cost: Callable[[int], float] = float
        self.total = max(1.0, sum(map(self.cost, self.requests)))
        self.done = self.spent = 0.0  # cost run so far, and the seconds its requests took
        self.started = time.perf_counter()
        self.write = write

    @classmethod
    def silent(cls) -> RunProgress:
        return cls(write=lambda line: None)

    def _print(self, message: str) -> None:
        line = f"rope-extend: engines {message}"
        if self.write is not None:
            self.write(line)
        else:
            print(line, file=sys.stderr, flush=True)

    def _left(self) -> float | None:
        if self.done:
            return self.spent / self.done * max(0.0, self.total - self.done)
        return self.total if self.cost is not float else None  # calibrated: seconds; else unknown yet

    def _times(self) -> str:
        elapsed = time.perf_counter() - self.started
        left = self._left()
        return f"{_clock(elapsed)} elapsed" + ("" if left is None else f", about {_clock(left)} left")

    def calibrated(self, cost: Callable[[int], float], how: str) -> None:
        """Cost requests in seconds (`reference.Cost`) and say, before the engines start, how long the run will take."""
        self.cost = cost
        self.total = max(1e-9, sum(map(cost, self.requests)))
        tokens = sum(self.requests)
        self._print(f"estimate: about {_clock(self.total)} for {len(self.requests)} requests ({tokens} tokens), plus "
                    f"each engine's start ({how}; each engine taken as fast as transformers on this machine)")

    def say(self, message: str) -> None:
        self._print(f"{message} ({self._times()})")

    @contextmanager
    def step(self, what: str) -> Iterator[None]:
        self._print(f"{what} ({self._times()})")
        started = time.perf_counter()
        yield
        self._print(f"{what.split(':')[0]}: ready in {time.perf_counter() - started:.1f} s ({self._times()})")

    @contextmanager
    def request(self, who: str, n: int) -> Iterator[None]:
        self._print(f"{who}: request of {n} tokens ({self._times()})")
        started = time.perf_counter()
        yield
        seconds = time.perf_counter() - started
        self.done += self.cost(n)
        self.spent += seconds
        self._print(f"{who}: {n} tokens in {seconds:.1f} s ({self._times()})")
