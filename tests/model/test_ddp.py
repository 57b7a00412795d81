"""Data-parallel training under torchrun on the CPU (gloo, 2 ranks, tiny models, fp32): after k steps the
trained parameters equal one process's on the same global batch and seed, for both families and for LoRA, full
fine-tuning and the head alone; rank 0 alone writes; a rank that is killed or hangs fails the stage with its
error, not a hang."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

import psutil
import pytest
import torch

from pipeline.config import ConfigError, TrainConfig, ValidateConfig
from pipeline.data.split import TrainSource
from pipeline.rundir import RunFolder
from pipeline.stages.train import train_stage
from pipeline.training.controls import RunHooks
from pipeline.training.launch import RankFailed, rank_environment
from tests.ddp_ranks import first_window_gradients, saved_result, train_tiny

pytestmark = pytest.mark.slow

# Windows of 12 items cut into micro-batches of 4: each rank trains on 6 (two micro-batches of 4 and 2), so
# the accumulation over the window is split differently on one process and on two; only rounding may differ.
BASE = TrainConfig(
    micro_batch=4,
    grad_accum=3,
    max_steps=4,
    log_every=1,
    lora_r=4,
    lora_alpha=4,
    lora_lr=5e-3,
    full_lr=1e-3,
    head_lr=1e-3,
    warmup_steps=1,
    precision="fp32",
    head_width=32,
    checkpoint_every_minutes=0.0,
)
CASES = {
    "laya-lora": replace(BASE, family="laya", method="lora"),
    "joint-full": replace(BASE, family="joint", method="full"),
    # the default method: the head on a frozen backbone's cached features
    "joint-head": replace(BASE, family="joint", method="head"),
    # a layer plan visiting the tiny encoder's first layer twice: one shared module, its gradients summed per
    # rank and then over ranks
    "laya-lora-plan": replace(BASE, family="laya", method="lora", layer_plan=(0, 0, 1)),
}


def _two_ranks(config: TrainConfig, data, base, folder):
    """`tests/ddp_ranks.py` on 2 gloo ranks under torchrun, in the environment the stage's launcher gives
    them."""
    spec, out = folder / "spec.json", folder / "rank0.pt"
    spec.write_text(json.dumps({"data": str(data), "base": str(base), "config": asdict(config)}))
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(Path(__file__).parents[1] / "ddp_ranks.py"),
        str(spec),
        str(out),
    ]
    done = subprocess.run(command, env=rank_environment(2, None), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return saved_result(str(out))


def _with_signal(gradients: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per parameter, the elements whose first-window gradient is above rounding noise (1e-6 of the
    largest)."""
    top = max(g.abs().max().item() for g in gradients.values())
    return {name: g.abs() > 1e-6 * top for name, g in gradients.items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_ranks_train_the_parameters_one_process_trains(case, tiny_base, synthetic_train_file, tmp_path):
    config = CASES[case]
    initial, _ = train_tiny(str(synthetic_train_file), str(tiny_base), replace(config, max_steps=0))
    alone, alone_result = train_tiny(str(synthetic_train_file), str(tiny_base), config)
    ranked, ranked_result, ranked_gradients = _two_ranks(
        replace(config, nproc=2), synthetic_train_file, tiny_base, tmp_path
    )
    gradients = first_window_gradients(str(synthetic_train_file), str(tiny_base), config)
    # The all-reduced gradient of the first window is the one process's: the same items, scaled the same (Adam
    # would hide a wrong scale from the parameters). Rounding scales with a parameter's largest gradient: a
    # word embedding row summed over many occurrences (the joint family's isolated question text repeats in
    # every option's sequence) differed by 1.5e-7 where the largest entry was 0.16, once in 6,400 elements; a
    # wrong scale or a missing item is off by far more.
    for name, gradient in gradients.items():
        atol = max(1e-7, 1e-5 * gradient.abs().max().item())
        torch.testing.assert_close(ranked_gradients[name], gradient, rtol=1e-5, atol=atol, msg=name)

    assert ranked_result.world_size == 2 and alone_result.world_size == 1
    assert ranked_result.steps == alone_result.steps == config.max_steps
    assert ranked.keys() == alone.keys() and alone
    # Directions the loss does not depend on (a key bias under softmax, one bias shared by every option's
    # logit) get a gradient of pure rounding noise, which Adam scales to a full step either way: those are
    # left out.
    signal = _with_signal(gradients)
    assert sum(m.sum().item() for m in signal.values()) > 0.5 * sum(m.numel() for m in signal.values())
    for name in alone:
        torch.testing.assert_close(
            ranked[name][signal[name]], alone[name][signal[name]], rtol=1e-5, atol=1e-6, msg=name
        )
    if config.layer_plan is not None:  # the plan ran: without it the same steps train other parameters
        native, _ = train_tiny(str(synthetic_train_file), str(tiny_base), replace(config, layer_plan=None))
        assert any(not torch.allclose(native[name], alone[name], atol=1e-6) for name in alone)
    # Not trivially equal: training moved the parameters far beyond that tolerance.
    assert max((alone[n] - initial[n]).abs().max().item() for n in alone) > 1e-3
    # Each logged loss is the whole window's (summed over the ranks), as on one process.
    for (step_one, loss_one), (step_two, loss_two) in zip(
        alone_result.losses, ranked_result.losses, strict=True
    ):
        assert step_one == step_two and loss_two == pytest.approx(loss_one, rel=1e-5)
    assert ranked_result.decisions == alone_result.decisions
    assert ranked_result.allreduce_seconds > 0 and alone_result.allreduce_seconds == 0


def test_the_stage_on_two_ranks_is_written_and_scored_by_rank_0(tiny_base, synthetic_train_file, tmp_path):
    """`train_stage` with `nproc: 2` under torchrun: rank 0's logging steps and held-out checkpoints come back
    to this process, the fine-tune, held-out logits and summary are written once, and they report 2 ranks."""
    config = replace(CASES["laya-lora"], nproc=2)
    logged, evaluated, lines = [], [], []
    hooks = RunHooks(lines.append, logged.append, lambda step, metrics: evaluated.append(step))
    summary = train_stage(
        _run_folder(synthetic_train_file, tmp_path / "run"), tiny_base, config, "cpu", hooks
    )
    summary = summary.to_dict()
    run = RunFolder(tmp_path / "run")
    assert summary["world_size"] == 2 and summary["steps"] == config.max_steps
    assert json.loads(run.train_summary.read_text())["world_size"] == 2
    assert run.heldout.is_file() and run.checkpoint.is_file() and Path(summary["saved_to"]).is_dir()
    assert [entry["step"] for entry in logged] == list(range(1, config.max_steps + 1))
    assert evaluated == [c["step"] for c in summary["heldout_checkpoints"]] == [0, 1, 3, 4]
    assert any("training budget" in line for line in lines)  # rank 0's progress, relayed line by line
    assert summary["heldout"]["decisions"] > 0 and summary["allreduce_seconds"] > 0


def _run_folder(data: Path, run_dir: Path) -> Path:
    """A run folder holding `data` validated and split, as the validate stage leaves it for the train
    stage."""
    TrainSource(data).validated().save(RunFolder(run_dir).split)
    return run_dir


def _rank_process(rank: int, timeout_s: float = 120.0) -> psutil.Process:
    """This test's torchrun rank `rank`, once it has started."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in psutil.Process().children(recursive=True):
            try:
                if "pipeline.stages.train_ranks" in " ".join(child.cmdline()) and child.environ().get(
                    "RANK"
                ) == str(rank):
                    return child
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} never started")


def _live_children(before: set[int] = frozenset()) -> list[psutil.Process]:
    """This process's live children, leaving out `before` (servers other tests' fixtures keep running)."""
    return [
        c
        for c in psutil.Process().children(recursive=True)
        if c.pid not in before and c.is_running() and c.status() != "zombie"
    ]


def _child_pids() -> set[int]:
    return {c.pid for c in psutil.Process().children(recursive=True)}


def _long_run(**overrides) -> TrainConfig:
    # Far more steps than the test waits for, a checkpoint at every step: training has begun once one exists.
    return replace(
        CASES["laya-lora"], max_steps=100_000, checkpoint_every_steps=1, log_every=50, nproc=2, **overrides
    )


def _after_first_checkpoint(run_dir, action, acted: list[float]) -> threading.Thread:
    """Rank 1 gets `action` once rank 0 has written its first checkpoint; `acted` gets the time it did."""

    def act():
        rank = _rank_process(1)
        while not RunFolder(run_dir).checkpoint.exists():
            time.sleep(0.2)
        action(rank)
        acted.append(time.monotonic())

    thread = threading.Thread(target=act, daemon=True)
    thread.start()
    return thread


def test_a_killed_rank_fails_the_stage_with_its_signal(tiny_base, synthetic_train_file, tmp_path):
    run_dir, killed, before = tmp_path / "run", [], _child_pids()
    killer = _after_first_checkpoint(run_dir, lambda rank: os.kill(rank.pid, signal.SIGKILL), killed)
    with pytest.raises(RankFailed, match=r"rank 1 .*SIGKILL"):
        train_stage(_run_folder(synthetic_train_file, run_dir), tiny_base, _long_run(), "cpu")
    killer.join(timeout=5)
    # torchrun sees the dead rank and stops rank 0 at once, not after the process group's 30 minutes.
    assert time.monotonic() - killed[0] < 60
    assert not RunFolder(run_dir).train_summary.exists()
    assert not _live_children(before)


PARENT = """
import sys
from pipeline.config import TrainConfig
from pipeline.stages.train import train_stage
config = TrainConfig(**{config})
train_stage(sys.argv[1], sys.argv[2], config, "cpu")
"""


def test_killing_the_launching_process_takes_its_ranks_down(tiny_base, synthetic_train_file, tmp_path):
    """A flow worker killed mid-run (SIGKILL: no cleanup of its own) leaves no rank training on into the run
    folder a rerun will resume from."""
    run_dir = tmp_path / "run"
    script = PARENT.replace("{config}", repr(asdict(_long_run())))
    _run_folder(synthetic_train_file, run_dir)
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(run_dir), str(tiny_base)],
        env=rank_environment(1, None),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 180
        while not RunFolder(run_dir).checkpoint.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        below = psutil.Process(parent.pid).children(recursive=True)  # torchrun, its helpers and the ranks
        assert sorted(p.environ().get("RANK", "") for p in below if "RANK" in p.environ()) == ["0", "1"]
        parent.kill()
        parent.wait()
        _, alive = psutil.wait_procs(below, timeout=60)
        assert not alive, [(p.pid, p.name()) for p in alive]
    finally:
        for process in psutil.Process().children(recursive=True):
            process.kill()


def test_a_hung_rank_fails_the_stage_after_the_process_group_timeout(
    tiny_base, synthetic_train_file, tmp_path
):
    """A rank that stops answering (SIGSTOP) is not dead: rank 0 waits in the all-reduce until the timeout,
    then fails, and the stage fails with rank 0's timeout error."""
    run_dir, timeout_minutes, stopped, before = tmp_path / "run", 0.1, [], _child_pids()
    stopper = _after_first_checkpoint(run_dir, lambda rank: os.kill(rank.pid, signal.SIGSTOP), stopped)
    with pytest.raises(RankFailed, match=r"rank 0 ") as failure:
        train_stage(
            _run_folder(synthetic_train_file, run_dir),
            tiny_base,
            _long_run(dist_timeout_minutes=timeout_minutes),
            "cpu",
        )
    stopper.join(timeout=5)
    elapsed = time.monotonic() - stopped[0]
    assert "timed out" in str(failure.value).lower() or "timeout" in str(failure.value).lower()
    # Not before the timeout (rank 0 may have entered the all-reduce a step before the stop), and not long
    # after it (torchrun then takes the stopped rank down too).
    assert 60 * timeout_minutes - 1 <= elapsed < 60 * timeout_minutes + 90
    assert not _live_children(before)


def test_finetune_refuses_more_than_one_rank(tiny_base, synthetic_train_file, tmp_path):
    from pipeline.stages.finetune import finetune

    with pytest.raises(ConfigError, match=r"train\.nproc=2"):
        finetune(synthetic_train_file, tiny_base, tmp_path / "out", replace(BASE, nproc=2), device="cpu")


def test_decision_train_json_reports_the_world_size(tiny_base, synthetic_train_file, tmp_path, capsys):
    from pipeline.cli.main import main

    code = main(
        [
            "train",
            "--data",
            str(synthetic_train_file),
            "--base",
            str(tiny_base),
            "--out",
            str(tmp_path / "out"),
            "--nproc",
            "2",
            "--max-steps",
            "2",
            "--method",
            "lora",
            "--family",
            "laya",
            "--device",
            "cpu",
            "--json",
        ]
    )
    printed, err = capsys.readouterr()
    assert code == 0
    summary = json.loads(printed)  # one JSON object: rank 0's progress lines went to stderr
    assert "train lora: step 2/2, loss " in err
    assert summary["world_size"] == 2 and summary["steps"] == 2
    assert summary["saved_to"] and (tmp_path / "out").is_dir()


def test_two_ranks_train_every_candidate_and_rank_0_keeps_the_one_one_process_keeps(
    tiny_base, synthetic_train_file, tmp_path
):
    """`train.lexicon: auto` under torchrun: each rank trains both heads in turn, rank 0 alone scores them on
    the validation split and keeps one, as one process does."""
    split = ValidateConfig(holdout_fraction=0.2, validation_fraction=0.25, validation_min_decisions=10)
    config = replace(CASES["joint-head"], lexicon="auto", max_steps=6)
    summaries = {}
    for nproc in (1, 2):
        folder = tmp_path / f"run{nproc}"
        TrainSource(synthetic_train_file, split_config=split).validated().save(RunFolder(folder).split)
        summaries[nproc] = train_stage(folder, tiny_base, replace(config, nproc=nproc), "cpu").to_dict()
        assert {p.name for p in folder.glob("checkpoint*.pt")} == {
            "checkpoint.tokens.pt",
            "checkpoint.tfidf.pt",
        }
    one, two = summaries[1]["choice"], summaries[2]["choice"]
    assert two["kept"] == one["kept"] and summaries[2]["world_size"] == 2
    for name, figures in one["candidates"].items():
        # The two heads together report both heads' steps; the ensemble trains none of its own.
        heads = 2 if name == "ensemble" else 1
        assert two["candidates"][name]["steps"] == figures["steps"] == heads * config.max_steps
        # Close, not equal: each rank draws the lexical channel's dropout for its half of a window.
        assert two["candidates"][name]["loss"] == pytest.approx(figures["loss"], rel=1e-2)
