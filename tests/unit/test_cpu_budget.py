"""torch's threads follow the CPU a process really has: its affinity mask and its cgroup's CPU quota (v2 and
v1, read from a fake /proc/self and /sys/fs/cgroup here), one setting overrides them, and workers or ranks
divide the budget between them."""

import pytest
import torch

from pipeline.cpu.budget import CgroupFiles, CpuBudget, apply_threads, plan_threads, usable_cpus
from pipeline.training.launch import rank_environment


@pytest.fixture
def cores(monkeypatch):
    """Set this process's affinity mask to `n` cores, and clear OMP_NUM_THREADS (a caller's would win)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    def fake(n: int) -> None:
        monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(n)))

    return fake


@pytest.fixture
def tree(tmp_path):
    """A fake /proc/self and /sys/fs/cgroup: `tree(cgroup_lines, {relative file: text})`."""

    def make(membership: str, files: dict[str, str]) -> CgroupFiles:
        proc, root = tmp_path / "proc/self", tmp_path / "sys/fs/cgroup"
        proc.mkdir(parents=True)
        (proc / "cgroup").write_text(membership)
        root.mkdir(parents=True)
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        return CgroupFiles(proc, root)

    return make


@pytest.fixture
def torch_threads():
    """Put torch's thread count back after a test that sets it (the test process runs on)."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_a_v2_quota_of_one_cpu_gives_one_thread(cores, tree):
    cores(4)
    files = tree(
        "0::/app.slice/decision.service\n", {"app.slice/decision.service/cpu.max": "100000 100000\n"}
    )
    assert usable_cpus(files) == CpuBudget(1, "cgroup v2 quota 1 cpu (affinity 4)", automatic=True)


def test_no_v2_quota_leaves_the_affinity_mask(cores, tree):
    cores(4)
    files = tree("0::/app\n", {"app/cpu.max": "max 100000\n"})
    assert usable_cpus(files) == CpuBudget(4, "affinity 4", automatic=True)


def test_a_fractional_quota_rounds_up_and_a_parent_cgroups_quota_applies(cores, tree):
    cores(8)
    files = tree(
        "0::/pod/container\n", {"pod/cpu.max": "150000 100000\n", "pod/container/cpu.max": "max 100000\n"}
    )
    assert usable_cpus(files) == CpuBudget(2, "cgroup v2 quota 1.5 cpu (affinity 8)", automatic=True)


def test_a_quota_above_the_affinity_mask_leaves_the_mask(cores, tree):
    cores(2)
    files = tree("0::/\n", {"cpu.max": "400000 100000\n"})  # a container's own cgroup, seen as the root
    assert usable_cpus(files) == CpuBudget(2, "affinity 2", automatic=True)


def test_a_v1_quota_over_its_period_gives_the_threads(cores, tree):
    cores(4)
    membership = "5:memory:/docker/ab\n4:cpu,cpuacct:/docker/ab\n0::/\n"
    files = tree(
        membership,
        {
            "cpu,cpuacct/docker/ab/cpu.cfs_quota_us": "200000\n",
            "cpu,cpuacct/docker/ab/cpu.cfs_period_us": "100000\n",
        },
    )
    assert usable_cpus(files) == CpuBudget(2, "cgroup v1 quota 2 cpu (affinity 4)", automatic=True)


def test_a_v1_quota_of_minus_one_is_no_limit(cores, tree):
    cores(4)
    files = tree("1:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"})
    assert usable_cpus(files) == CpuBudget(4, "affinity 4", automatic=True)


def test_a_container_that_mounts_only_its_own_v1_cgroup_reads_the_mount(cores, tree):
    """/proc/self/cgroup names the host's path; the container's mount holds only its own cgroup, at the
    top."""
    cores(4)
    files = tree(
        "3:cpu:/docker/0123abcd\n", {"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}
    )
    assert usable_cpus(files) == CpuBudget(1, "cgroup v1 quota 1 cpu (affinity 4)", automatic=True)


def test_an_affinity_mask_of_one_core_gives_one_thread(cores, tree):
    cores(1)
    assert usable_cpus(tree("0::/\n", {})) == CpuBudget(1, "affinity 1", automatic=True)


def test_no_proc_self_cgroup_leaves_the_affinity_mask(cores, tmp_path):
    cores(3)
    assert usable_cpus(CgroupFiles(tmp_path / "none", tmp_path / "none")) == CpuBudget(
        3, "affinity 3", automatic=True
    )


def test_the_setting_wins_over_the_quota_and_omp_num_threads(cores, tree, monkeypatch):
    cores(4)
    files = tree("0::/app\n", {"app/cpu.max": "100000 100000\n"})
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert plan_threads(3, "--threads", files=files) == CpuBudget(3, "--threads 3")


def test_omp_num_threads_is_one_process_count_and_wins_over_detection(cores, tree, monkeypatch):
    cores(4)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    files = tree("0::/\n", {})
    assert plan_threads(None, "--threads", share=2, files=files) == CpuBudget(2, "OMP_NUM_THREADS=2")
    monkeypatch.setenv("OMP_NUM_THREADS", "not a number")
    assert plan_threads(None, "--threads", files=files) == CpuBudget(4, "affinity 4", automatic=True)


def test_workers_divide_the_budget_never_below_one_thread(cores, tree):
    cores(4)
    files = tree("0::/\n", {})
    assert plan_threads(None, "--threads", share=2, files=files) == CpuBudget(
        2, "affinity 4, split among 2 workers", automatic=True
    )
    assert plan_threads(6, "--threads", share=3, files=files).threads == 2
    assert plan_threads(1, "train.threads", share=2, sharing="ranks", files=files) == CpuBudget(
        1, "train.threads 1, split among 2 ranks"
    )


def test_a_setting_below_one_is_refused_by_name():
    with pytest.raises(ValueError, match="--threads: must be at least 1, got 0"):
        plan_threads(0, "--threads")


def test_apply_sets_torchs_threads(torch_threads):
    apply_threads(CpuBudget(1, "--threads 1"))
    assert torch.get_num_threads() == 1
    apply_threads(
        CpuBudget(2, "--threads 2")
    )  # again: the inter-op pool keeps its first size, without an error
    assert torch.get_num_threads() == 2


def test_torchrun_ranks_start_with_their_share(cores, monkeypatch):
    cores(4)
    monkeypatch.setattr(
        "pipeline.cpu.budget.usable_cpus", lambda files: CpuBudget(4, "affinity 4")
    )  # any cgroup
    environment = rank_environment(2, None, threads=None)
    assert (environment["OMP_NUM_THREADS"], environment["MKL_NUM_THREADS"]) == ("2", "2")
    assert rank_environment(2, None, threads=6)["OMP_NUM_THREADS"] == "3"
