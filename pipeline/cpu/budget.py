"""How many CPU threads torch may use: the cores this process can really run on, not every core of the host.

torch's default thread count follows the affinity mask (`taskset`, a cpuset: OpenMP reads it) but not a
container's CPU quota (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`), and `os.cpu_count()`
follows neither: a process held to 1 CPU on a 64-core host runs 64 threads, and every parallel region waits
for a descheduled thread, so throughput falls far more than the share of the machine it lost. The budget here
is the smaller of the affinity mask's size and the quota rounded up; one setting overrides it (`decision serve
--threads N`, `train.threads`), and server workers or training ranks divide it between them, never multiply
it.

    budget = plan_threads(None, "--threads", share=2, sharing="workers")   # min(affinity, quota) // 2, at least 1
    apply_threads(budget)                                                  # torch's pools on budget.threads
    budget.describe()                                                      # "1 (affinity 2, split among 2 workers)"
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch

OMP_ENV = "OMP_NUM_THREADS"


@dataclass(frozen=True)
class CpuBudget:
    """The intra-op threads one process uses, and where that number came from, in words a user can check."""

    threads: int
    source: str
    """e.g. "affinity 2", "cgroup v2 quota 1.5 cpu (affinity 4)", "--threads 3", "OMP_NUM_THREADS=1"."""
    automatic: bool = False
    """Found from the CPU the process has (not set): `cpu.load.ThreadGovernor` may then run fewer threads
    while other processes keep some of those cores busy."""

    def describe(self) -> str:
        return f"{self.threads} ({self.source})"


@dataclass(frozen=True)
class CgroupFiles:
    """Where this process's cgroup membership and the cgroup file systems are read (a fake tree in tests)."""

    proc_self: Path = Path("/proc/self")
    cgroup_root: Path = Path("/sys/fs/cgroup")


def affinity_cpus() -> int:
    """The cores this process may run on (its affinity mask), which `os.cpu_count()` ignores."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # no affinity masks on this platform (macOS)


def cgroup_paths(files: CgroupFiles = CgroupFiles()) -> dict[str, str]:
    """{controllers: path} from /proc/self/cgroup, e.g. {"": "/app"} (v2) or {"cpu,cpuacct": "/docker/ab"}
    (v1)."""
    try:
        text = (files.proc_self / "cgroup").read_text()
    except OSError:
        return {}  # not Linux, or no /proc: no cgroup to read
    paths = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        paths[controllers] = path
    return paths


def cgroup_v2_quota(files: CgroupFiles = CgroupFiles()) -> float | None:
    """CPUs allowed by `cpu.max` ("QUOTA PERIOD", or "max ..." for none) of this process's v2 cgroup or any
    cgroup above it (the tightest applies); None without a limit."""
    path = cgroup_paths(files).get("")
    if path is None:
        return None
    return _tightest(_limit_v2(folder / "cpu.max") for folder in _upwards(files.cgroup_root, path))


def cgroup_v1_quota(files: CgroupFiles = CgroupFiles()) -> float | None:
    """CPUs allowed by `cpu.cfs_quota_us / cpu.cfs_period_us` (quota -1: none) of this process's v1 cpu cgroup
    or any above it; None without a limit. The hierarchy is mounted as `cpu,cpuacct` or `cpu` (often both)."""
    for controllers, path in cgroup_paths(files).items():
        if "cpu" not in controllers.split(","):
            continue
        mount = next(
            (m for m in (files.cgroup_root / controllers, files.cgroup_root / "cpu") if m.is_dir()), None
        )
        if mount is not None:
            return _tightest(_limit_v1(folder) for folder in _upwards(mount, path))
    return None


def usable_cpus(files: CgroupFiles = CgroupFiles()) -> CpuBudget:
    """min(the affinity mask's cores, the cgroup quota rounded up), at least 1, naming the limit that
    binds."""
    cores = affinity_cpus()
    for version, quota in (("v2", cgroup_v2_quota(files)), ("v1", cgroup_v1_quota(files))):
        if quota is not None and math.ceil(quota) < cores:
            return CpuBudget(
                max(1, math.ceil(quota)), f"cgroup {version} quota {quota:g} cpu (affinity {cores})", True
            )
    return CpuBudget(cores, f"affinity {cores}", True)


def plan_threads(
    setting: int | None,
    name: str,
    share: int = 1,
    sharing: str = "workers",
    files: CgroupFiles = CgroupFiles(),
) -> CpuBudget:
    """The threads of one of `share` processes (server workers, training ranks) that split one budget.

    Precedence: `setting` (the `name`d flag or params key) is the whole budget; else `OMP_NUM_THREADS`, which is
    one process's count, as OpenMP reads it (a launcher that sets it for its children has already divided); else
    `usable_cpus`. A budget is divided by `share`, at least 1 thread each.
    """
    if setting is not None:
        if setting < 1:
            raise ValueError(f"{name}: must be at least 1, got {setting}")
        return _split(CpuBudget(setting, f"{name} {setting}"), share, sharing)
    environment = omp_threads()
    if environment is not None:
        return CpuBudget(environment, f"{OMP_ENV}={environment}")
    return _split(usable_cpus(files), share, sharing)


def omp_threads() -> int | None:
    """`OMP_NUM_THREADS` when it holds a positive count (its first, for a nested list like "4,2"), else
    None."""
    first = os.environ.get(OMP_ENV, "").split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else None


def apply_threads(budget: CpuBudget) -> None:
    """Size torch's intra-op pool (and its inter-op pool, where that can still be sized) to
    `budget.threads`."""
    torch.set_num_threads(budget.threads)
    # torch sizes the inter-op pool once per process, before its first inter-op work, and raises after: a
    # process that trains or serves twice keeps the first size. Only `torch.jit.fork` and a few ops use that
    # pool.
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(budget.threads)


def child_environment(threads: int) -> dict[str, str]:
    """The variables that start a child process's OpenMP and MKL pools on `threads` (set before torch
    loads)."""
    return {OMP_ENV: str(threads), "MKL_NUM_THREADS": str(threads)}


def _split(budget: CpuBudget, share: int, sharing: str) -> CpuBudget:
    if share <= 1:
        return budget
    return replace(
        budget,
        threads=max(1, budget.threads // share),
        source=f"{budget.source}, split among {share} {sharing}",
    )


def _upwards(mount: Path, path: str) -> list[Path]:
    """The cgroup folder of `path` under `mount` and each folder above it, up to the mount itself. A container
    that sees its host's path but mounts only its own cgroup reads the mount (its cgroup) alone."""
    relative = Path(path.strip("/"))
    return [mount / relative, *(mount / parent for parent in relative.parents)]


def _tightest(limits) -> float | None:
    found = [limit for limit in limits if limit is not None]
    return min(found) if found else None


def _limit_v2(file: Path) -> float | None:
    text = _read(file)
    if text is None:
        return None
    quota, period = [*text.split(), "100000"][:2]  # the period may be left out when written
    return None if quota == "max" else int(quota) / int(period)


def _limit_v1(folder: Path) -> float | None:
    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    if quota is None or period is None or int(quota) <= 0:
        return None
    return int(quota) / int(period)


def _read(file: Path) -> str | None:
    try:
        return file.read_text().strip()
    except OSError:  # absent at this level (the root cgroup has no cpu.max), or not readable: no limit here
        return None
