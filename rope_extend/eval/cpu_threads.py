"""How many CPU threads torch gets for an evaluation job: the cores that other processes leave free.

torch runs each operation on OpenMP threads (as many as the machine has cores) that spin while they wait for each
other. Where other processes keep the cores busy, a thread that the kernel has descheduled keeps its partner
spinning at every barrier: on the 2-core machine at a load average of 8-9, one probe job of the smoke suite took
78.9 s of wall time and 25.8 s of CPU with 2 threads, 10.9 s and 3.7 s with one (`bench/eval_case_cost.py` measures
it). A decode step is hundreds of small operations, each with its barrier, so the probes suffer most.

Before each job, `CpuThreads.fit` sets torch's thread count to the cores the other processes leave free: the core
count less their load (the 1-minute load average less this process's own use of the CPU over about the same
minute; the machine's load counted on this process's share of the CPUs where it may run on fewer than all), at
least one and at most torch's own default. On an idle machine that is every core, as before. Where the user set
``OMP_NUM_THREADS``, that count stands. `CpuThreads` restores torch's count when the evaluation ends.
"""

from __future__ import annotations

import math
import os
import time

WINDOW_S = 60.0  # the 1-minute load average's time constant: this process's own use is averaged the same way


def threads_for(cores: int, load: float, own: float, share: float = 1.0) -> int:
    """The threads to run with on *cores* cores where the machine's load average is *load*, of which *own* is this
    process's (both in cores) and *share* the fraction of the machine's CPUs this process may run on: the cores the
    others leave free, rounded, at least one."""
    others = max(0.0, load - own) * share
    return max(1, min(cores, math.floor(cores - others + 0.5)))


def cpu_share() -> float:
    """The fraction of the machine's CPUs this process may run on (its affinity; 1 where that cannot be read)."""
    try:
        return len(os.sched_getaffinity(0)) / (os.cpu_count() or 1)
    except (AttributeError, OSError):
        return 1.0


class CpuThreads:
    """torch's CPU thread count for the jobs of one evaluation, fitted to the load before each job (`fit`); a context
    manager that puts torch's own count back at the end. ``cores``: the most threads to use (default: torch's
    count when entered); ``load``: reads the 1-minute load average (default `os.getloadavg`)."""

    def __init__(self, cores: int | None = None, load=None):
        self.cores, self._load = cores, load or (lambda: os.getloadavg()[0])
        self.fixed = "OMP_NUM_THREADS" in os.environ  # the user's choice stands
        self.threads: int | None = None
        self._own, self._at = 0.0, None  # this process's CPU use (cores, averaged over ~WINDOW_S), and when measured

    def __enter__(self) -> CpuThreads:
        import torch

        self._saved = torch.get_num_threads()
        self.cores = self.cores or self._saved
        self._at = (time.perf_counter(), time.process_time())
        return self

    def __exit__(self, *exc) -> None:
        import torch

        torch.set_num_threads(self._saved)

    def fit(self) -> int:
        """Set torch's thread count for the next job; returns it."""
        import torch

        if self.fixed:
            self.threads = torch.get_num_threads()
            return self.threads
        wall, cpu = time.perf_counter(), time.process_time()
        if self._at is not None and wall > self._at[0]:
            used = (cpu - self._at[1]) / (wall - self._at[0])
            keep = math.exp(-(wall - self._at[0]) / WINDOW_S)
            self._own = keep * self._own + (1 - keep) * used
        self._at = (wall, cpu)
        self.threads = threads_for(self.cores, self._load(), self._own, cpu_share())
        if self.threads != torch.get_num_threads():
            torch.set_num_threads(self.threads)
        return self.threads

    def describe(self) -> str:
        """``torch runs on 1 of 2 CPU threads: other processes keep the rest busy``, for the progress lines (said
        again when the count changes)."""
        if self.threads is None:
            return ""
        if self.fixed:
            return f"torch runs on {self.threads} CPU thread{'s' * (self.threads > 1)} (OMP_NUM_THREADS)"
        if self.threads == self.cores:
            return f"torch runs on {self.threads} of {self.cores} CPU threads"
        return (f"torch runs on {self.threads} of {self.cores} CPU threads: other processes keep the other cores "
                "busy (see rope_extend/eval/cpu_threads.py)")
