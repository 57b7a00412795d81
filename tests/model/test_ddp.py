"""Data-parallel training under torchrun on the CPU (gloo, 2 ranks, tiny models, fp32): after k steps the trained
parameters equal one process's on the same global batch and seed, for both families and for LoRA and full fine-
tuning; rank 0 alone writes; a rank that is killed or hangs fails the stage with its error, not a hang."""

import json
import os
import signal
import threading
import time
from dataclasses import replace

import psutil
import pytest
import torch

from pipeline.config import ConfigError, TrainConfig
from pipeline.rundir import RunFolder
from pipeline.stages.train import train_stage
from pipeline.training.launch import RankFailed

pytestmark = pytest.mark.slow

# Windows of 12 items cut into micro-batches of 4: each rank trains on 6 (two micro-batches of 4 and 2), so the
# accumulation over the window is split differently on one process and on two; only rounding may differ.
BASE = TrainConfig(micro_batch=4, grad_accum=3, max_steps=4, log_every=1, lora_r=4, lora_alpha=4, lora_lr=5e-3,
                   full_lr=1e-3, head_lr=1e-3, warmup_steps=1, precision="fp32", head_width=32,
                   checkpoint_every_minutes=0.0)  # fmt: skip
CASES = {
    "laya-lora": replace(BASE, family="laya", method="lora"),
    "joint-full": replace(BASE, family="joint", method="full"),
}


def _trained_parameters(run_dir) -> dict[str, torch.Tensor]:
    """The trainable parameters after the last step, as the checkpoint holds them (fp32, unlike the fp16 export)."""
    return torch.load(RunFolder(run_dir).checkpoint, weights_only=False)["parameters"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_ranks_train_the_parameters_one_process_trains(case, tiny_base, synthetic_train_file, tmp_path):
    config = CASES[case]
    logged, evaluated = [], []
    alone = train_stage(synthetic_train_file, tiny_base, tmp_path / "one", config, device="cpu", progress=False)
    ranked = train_stage(synthetic_train_file, tiny_base, tmp_path / "two", replace(config, nproc=2),
                         device="cpu", progress=False, on_log=logged.append,
                         on_eval=lambda step, metrics: evaluated.append(step))  # fmt: skip

    assert alone["world_size"] == 1 and ranked["world_size"] == 2
    assert ranked["steps"] == alone["steps"] == config.max_steps
    one, two = _trained_parameters(tmp_path / "one"), _trained_parameters(tmp_path / "two")
    assert one.keys() == two.keys() and one
    initial = torch.load(RunFolder(tmp_path / "one").checkpoint, weights_only=False)  # the checkpoint is the end
    assert initial["step"] == config.max_steps
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-5, atol=1e-6, msg=name)
    # The loss of each window is the whole window's, and rank 0's steps and held-out checkpoints come back here.
    for (step_one, loss_one), (step_two, loss_two) in zip(alone["losses"], ranked["losses"], strict=True):
        assert step_one == step_two and loss_two == pytest.approx(loss_one, rel=1e-5)
    assert [entry["step"] for entry in logged] == list(range(1, config.max_steps + 1))
    assert evaluated == [checkpoint["step"] for checkpoint in ranked["heldout_checkpoints"]] and 0 in evaluated
    assert ranked["heldout"]["tuned"]["accuracy"] == pytest.approx(alone["heldout"]["tuned"]["accuracy"])
    assert ranked["allreduce_seconds"] > 0 and alone["allreduce_seconds"] == 0


def test_the_parameters_differ_when_a_rank_trains_on_other_items(tiny_base, synthetic_train_file, tmp_path):
    """The equality above can fail: another seed (another order of items) moves the parameters well past it."""
    config = CASES["laya-lora"]
    train_stage(synthetic_train_file, tiny_base, tmp_path / "one", config, device="cpu", progress=False)
    train_stage(synthetic_train_file, tiny_base, tmp_path / "two", replace(config, nproc=2, seed=1), device="cpu",
                progress=False)  # fmt: skip
    one, two = _trained_parameters(tmp_path / "one"), _trained_parameters(tmp_path / "two")
    assert any(not torch.allclose(one[name], two[name], rtol=1e-5, atol=1e-6) for name in one)


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


def _long_run(tmp_path, **overrides) -> TrainConfig:
    # Far more steps than the test waits for, a checkpoint at every step: training has begun once one exists.
    return replace(CASES["laya-lora"], max_steps=100_000, checkpoint_every_steps=1, log_every=50, nproc=2, **overrides)


def _after_first_checkpoint(run_dir, action) -> threading.Thread:
    def act():
        rank = _rank_process(1)
        while not RunFolder(run_dir).checkpoint.exists():
            time.sleep(0.2)
        action(rank)

    thread = threading.Thread(target=act, daemon=True)
    thread.start()
    return thread


def test_a_killed_rank_fails_the_stage_with_its_signal(tiny_base, synthetic_train_file, tmp_path):
    run_dir = tmp_path / "run"
    killer = _after_first_checkpoint(run_dir, lambda rank: os.kill(rank.pid, signal.SIGKILL))
    started = time.monotonic()
    with pytest.raises(RankFailed, match=r"rank 1 .*SIGKILL"):
        train_stage(synthetic_train_file, tiny_base, run_dir, _long_run(tmp_path), device="cpu", progress=False)
    killer.join(timeout=5)
    # torchrun sees the dead rank and stops rank 0 at once: well inside the process group's timeout.
    assert time.monotonic() - started < 60 * CASES["laya-lora"].dist_timeout_minutes
    assert not RunFolder(run_dir).train_summary.exists()
    assert not [c for c in psutil.Process().children(recursive=True) if c.is_running() and c.status() != "zombie"]


def test_a_hung_rank_fails_the_stage_after_the_process_group_timeout(tiny_base, synthetic_train_file, tmp_path):
    """A rank that stops answering (SIGSTOP) is not dead: rank 0 waits in the all-reduce until the timeout,
    then fails, and the stage fails with rank 0's timeout error."""
    run_dir, timeout_minutes = tmp_path / "run", 0.1
    stopper = _after_first_checkpoint(run_dir, lambda rank: os.kill(rank.pid, signal.SIGSTOP))
    started = time.monotonic()
    with pytest.raises(RankFailed, match=r"rank 0 ") as failure:
        train_stage(synthetic_train_file, tiny_base, run_dir, _long_run(tmp_path, dist_timeout_minutes=timeout_minutes),
                    device="cpu", progress=False)  # fmt: skip
    stopper.join(timeout=5)
    elapsed = time.monotonic() - started
    assert "timed out" in str(failure.value).lower() or "timeout" in str(failure.value).lower()
    assert elapsed >= 60 * timeout_minutes


def test_finetune_refuses_more_than_one_rank(tiny_base, synthetic_train_file, tmp_path):
    from pipeline.stages.finetune import finetune

    with pytest.raises(ConfigError, match="train.nproc=2"):
        finetune(synthetic_train_file, tiny_base, tmp_path / "out", replace(BASE, nproc=2), device="cpu")


def test_decision_train_json_reports_the_world_size(tiny_base, synthetic_train_file, tmp_path, capsys):
    from pipeline.cli.main import main

    code = main(["train", "--data", str(synthetic_train_file), "--base", str(tiny_base), "--out",
                 str(tmp_path / "out"), "--nproc", "2", "--max-steps", "2", "--method", "lora", "--family", "laya",
                 "--device", "cpu", "--json"])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0
    summary = json.loads(printed)  # one JSON object: rank 0's progress lines went to stderr
    assert summary["world_size"] == 2 and summary["steps"] == 2
    assert summary["saved_to"] and (tmp_path / "out").is_dir()
