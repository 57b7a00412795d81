"""Threads that follow the cores other processes leave free, re-read while a process serves or trains.

`budget` says what a process may use (its affinity mask, its quota). A busy neighbour changes neither, yet
with one thread per core every parallel region waits for the thread that shares its core with the neighbour,
and throughput falls far more than the share of the machine lost: with one busy process on one of two cores,
the server kept 0.30 of its quiet requests/s on 2 threads and 0.61 on 1 (`benchmarks/bench_contention.py`).

So a sampler thread reads, once a second, how busy this process's cores were with other processes' work:
`/proc/stat` per core (user, nice, system, irq, softirq, steal), less this process's own CPU time. Niced work
counts: where the kernel groups processes by session (autogroup, on by default), a niced process in another
session competes as an equal. The thread count becomes the cores left free, within the budget, at least one.
torch's thread count belongs to the thread that sets it, so each thread that runs torch work applies it itself.

    governor = ThreadGovernor(budget)      # adapts when the budget was found, not set (--threads, train.threads)
    governor.start()
    ...
    governor.follow()                      # in the thread that runs forward passes, before each batch or step
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.cpu.budget import CpuBudget, affinity_cpus

log = logging.getLogger(__name__)

PROC_STAT = Path("/proc/stat")
SAMPLE_S = 1.0
# /proc/stat columns after the cpu name: user nice system idle iowait irq softirq steal guest guest_nice;
# `guest` is already inside `user`.
BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)
# A core counts as taken once other processes keep it this busy: a busy neighbour pinned to one core measures
# only half of it while one of our threads shares that core with it.
TAKEN_SHARE = 0.4


@dataclass(frozen=True)
class CpuReading:
    """CPU seconds at one moment: every process's busy time on this process's cores, and this process's
    own."""

    wall: float
    busy: float
    own: float


def read_cpu(cores: frozenset[int], stat_file: Path = PROC_STAT) -> CpuReading | None:
    """Busy seconds on `cores` (all processes) and this process's CPU seconds; None where /proc/stat is
    absent."""
    try:
        lines = stat_file.read_text().splitlines()
    except OSError:
        return None  # not Linux: no per-core times to follow
    ticks = 0
    for line in lines:
        name, *values = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
            ticks += sum(int(values[i]) for i in BUSY_COLUMNS if i < len(values))
    times = os.times()
    return CpuReading(time.monotonic(), ticks / os.sysconf("SC_CLK_TCK"), times.user + times.system)


def others_busy(before: CpuReading, after: CpuReading) -> float:
    """Cores kept busy by other processes between two readings (0 when no time passed)."""
    wall = after.wall - before.wall
    if wall <= 0:
        return 0.0
    return max(0.0, ((after.busy - before.busy) - (after.own - before.own)) / wall)


def free_threads(budget: int, cores: int, busy: float) -> int:
    """The cores other processes leave free (each `TAKEN_SHARE` of a core they keep busy takes one), within
    `budget`, at least 1."""
    taken = math.floor(busy + 1 - TAKEN_SHARE)
    return max(1, min(budget, cores - taken))


class ThreadGovernor:
    """The thread count a process should run now; adapts to other processes' load when the budget was found
    (not set by `--threads`, `train.threads` or OMP_NUM_THREADS), else holds the budget."""

    def __init__(self, budget: CpuBudget, sample_s: float = SAMPLE_S, stat_file: Path = PROC_STAT) -> None:
        self.budget = budget
        self.cores = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
        self.sample_s, self.stat_file = sample_s, stat_file
        self.adaptive = budget.automatic and read_cpu(self.cores, stat_file) is not None
        self.threads = budget.threads
        self.busy = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> ThreadGovernor:
        """Sample in a daemon thread (when adaptive); returns self."""
        if self.adaptive and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="thread-governor", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def follow(self) -> int:
        """Size the calling thread's torch pool to the current count (a no-op when it already is); the
        count."""
        threads = self.threads
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        return threads

    def observe(self, busy: float) -> None:
        """Take one sample of other processes' load (cores busy) and the thread count that leaves them."""
        self.busy = busy
        threads = free_threads(self.budget.threads, len(self.cores) or affinity_cpus(), busy)
        if threads != self.threads:
            log.info(
                "torch threads %d -> %d: other processes kept %.1f of %d cores busy",
                self.threads,
                threads,
                busy,
                len(self.cores),
            )
            self.threads = threads

    def state(self) -> dict:
        """What /healthz and a run's summary report."""
        return {
            "threads": self.threads,
            "threads_budget": self.budget.threads,
            "threads_source": self.describe(),
            "threads_adaptive": self.adaptive,
            "others_busy_cores": round(self.busy, 2),
        }

    def describe(self) -> str:
        if not self.adaptive:
            return self.budget.source
        return f"{self.budget.source}; following other processes' load"

    def _run(self) -> None:
        before = read_cpu(self.cores, self.stat_file)
        while not self._stop.wait(self.sample_s):
            after = read_cpu(self.cores, self.stat_file)
            if before is not None and after is not None:
                self.observe(others_busy(before, after))
            before = after
