"""A process whose thread budget was found (not set) runs fewer torch threads while other processes keep some
of its cores busy, and back up when they stop: other processes' load is read from /proc/stat per core (a fake
one here, and the real one beside a real busy process), less this process's own CPU time."""

import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from pipeline.cpu.budget import CpuBudget
from pipeline.cpu.load import CpuReading, ThreadGovernor, free_threads, others_busy, read_cpu

HEADER = "cpu  900 90 90 900 9 0 0 0 0 0\n"


def stat_text(*cores: tuple[int, int, int, int]) -> str:
    """A /proc/stat with one line per core: (user, nice, system, idle) ticks, the other columns 0."""
    lines = [
        f"cpu{i} {user} {nice} {system} {idle} 0 0 0 0 0 0"
        for i, (user, nice, system, idle) in enumerate(cores)
    ]
    return HEADER + "\n".join(lines) + "\nintr 1 2 3\nctxt 5\n"


def test_busy_time_is_summed_over_this_processs_cores_only(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(stat_text((100, 50, 100, 0), (300, 0, 0, 0), (5000, 0, 0, 0)))
    ticks = os.sysconf("SC_CLK_TCK")
    # user, nice and system of cores 0 and 1 (a niced process in another session competes as an equal); core 2
    # is not ours
    assert read_cpu(frozenset({0, 1}), stat).busy == pytest.approx(550 / ticks)
    assert read_cpu(frozenset({0}), tmp_path / "absent") is None


def test_others_busy_is_every_process_less_this_one_over_the_wall_time():
    before = CpuReading(wall=10.0, busy=100.0, own=20.0)
    # 4 s busy on our cores in 2 s, 2 of them ours
    assert others_busy(before, CpuReading(12.0, 104.0, 22.0)) == pytest.approx(1.0)
    assert others_busy(before, CpuReading(12.0, 102.0, 22.0)) == 0.0
    assert others_busy(before, CpuReading(12.0, 101.0, 22.0)) == 0.0  # never below 0 (ticks are coarse)
    assert others_busy(before, before) == 0.0


@pytest.mark.parametrize(
    ("budget", "cores", "busy", "threads"),
    [
        (2, 2, 0.0, 2),
        (2, 2, 0.3, 2),  # a light neighbour leaves both cores
        (2, 2, 0.5, 1),  # a pinned busy neighbour measures half its core while one of ours shares it
        (2, 2, 1.0, 1),
        (2, 2, 2.0, 1),  # never fewer than one
        (4, 4, 1.0, 3),
        (1, 4, 0.0, 1),  # never more than the budget (a quota of 1 on 4 cores)
        (2, 4, 1.0, 2),
    ],
)
def test_threads_are_the_cores_left_free_within_the_budget(budget, cores, busy, threads):
    assert free_threads(budget, cores, busy) == threads


def in_thread(function):
    """Run `function` in a fresh thread (a torch thread count belongs to its thread) and return its result."""
    result = []
    worker = threading.Thread(target=lambda: result.append(function()))
    worker.start()
    worker.join()
    return result[0]


def test_a_found_budget_follows_the_load_and_a_set_one_holds(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    found = ThreadGovernor(CpuBudget(2, "affinity 2", automatic=True))
    assert found.adaptive
    found.observe(1.0)
    assert (found.threads, in_thread(lambda: (found.follow(), torch.get_num_threads())[1])) == (1, 1)
    assert found.state() | {"others_busy_cores": 1.0} == found.state()
    found.observe(0.1)
    assert found.threads == 2
    held = ThreadGovernor(CpuBudget(2, "--threads 2"))
    assert not held.adaptive and held.describe() == "--threads 2"
    assert held.start()._thread is None  # nothing to sample


def test_the_sampler_reads_the_stat_file_until_stopped(tmp_path, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    stat = tmp_path / "stat"
    stat.write_text(stat_text((0, 0, 0, 0), (0, 0, 0, 0)))
    governor = ThreadGovernor(
        CpuBudget(2, "affinity 2", automatic=True), sample_s=0.05, stat_file=stat
    ).start()
    try:
        ticks = 0
        deadline = time.monotonic() + 10
        while governor.threads != 1 and time.monotonic() < deadline:
            ticks += 100 * os.sysconf("SC_CLK_TCK")  # another process busy far beyond one core
            stat.write_text(stat_text((ticks, 0, 0, 0), (0, 0, 0, 0)))
            time.sleep(0.02)
        assert governor.threads == 1
    finally:
        governor.stop()
    assert governor._thread is None


def test_a_real_busy_process_on_one_of_our_cores_is_seen():
    cores = sorted(os.sched_getaffinity(0))
    busy = subprocess.Popen(
        [sys.executable, "-c", "while True: pass"], preexec_fn=lambda: os.sched_setaffinity(0, {cores[-1]})
    )
    try:
        time.sleep(0.5)  # started
        before = read_cpu(frozenset(cores))
        time.sleep(1.0)
        seen = others_busy(before, read_cpu(frozenset(cores)))
    finally:
        busy.kill()
        busy.wait()
    # The busy loop holds at least half a core even beside this test and one other process on its core.
    assert seen >= 0.4
    assert free_threads(len(cores), len(cores), seen) == max(1, len(cores) - 1)
