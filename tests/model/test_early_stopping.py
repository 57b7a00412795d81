"""Early stopping on the validation split: checks spread over the budget, a stop after `patience` checks
without a lower validation loss, the best check's weights kept, and a clear refusal where it cannot run."""

import json
from dataclasses import replace

import pytest
import torch

from pipeline.cli.main import main
from pipeline.config import ConfigError, TrainConfig
from pipeline.data import synthetic
from pipeline.data.validate import validate_rows
from pipeline.families.laya.items import build_items
from pipeline.families.laya.training import laya_batch_task, prepare_model
from pipeline.families.laya_layout import load_model
from pipeline.training.checkpoint import Checkpointer
from pipeline.training.controls import CancelToken, RunControls, RunHooks
from pipeline.training.early_stop import EarlyStopping, check_steps, validation_loss
from pipeline.training.loop import train
from tests.tiny import contrary_row

CPU = torch.device("cpu")
CONFIG = TrainConfig(
    method="full",
    micro_batch=4,
    grad_accum=2,
    full_lr=3e-3,
    head_lr=3e-3,
    epochs=12,
    min_steps=0,
    log_every=5,
    precision="fp32",
    threads=1,
    warmup_steps=0,
)


def test_checks_are_spread_over_the_budget_and_end_at_its_last_step():
    assert check_steps(100, 4) == {25, 50, 75, 100}
    assert check_steps(3, 20) == {1, 2, 3}
    assert max(check_steps(977, 20)) == 977 and len(check_steps(977, 20)) == 20


def test_a_run_whose_validation_loss_rises_stops_after_its_patience_and_keeps_the_best_weights(tiny_base):
    loaded = load_model(tiny_base)
    prepare_model(loaded.model, CONFIG)
    rows = synthetic.generate_rows(24, seed=5)
    items = build_items(validate_rows(rows).records, loaded)[0]
    contrary = build_items(validate_rows([contrary_row(r) for r in rows]).records, loaded)[0]
    task = laya_batch_task(loaded.tokenizer.pad_token_id)
    config = replace(CONFIG, early_stopping=2, validation_checks=12)
    lines = []
    stopper = EarlyStopping(contrary, config, task, lines.append)
    result = train(loaded.model, items, config, CPU, task, RunHooks(report=lines.append), stopper=stopper)

    losses = [loss for _, loss in stopper.checks]
    assert result.steps < result.planned_steps, "the validation loss rose, so the run stops early"
    best = losses.index(min(losses))
    assert len(losses) == best + 1 + 2, "it stops after exactly `patience` checks without a lower loss"
    assert result.early_stopping["best_step"] == stopper.checks[best][0] < result.steps
    assert result.early_stopping["restored_best"] and any("stopped early" in line for line in lines)

    def batch(chunk):
        return task.collate(chunk)

    kept = validation_loss(loaded.model, contrary, task, batch, None, config.eval_batch_size)
    assert kept == pytest.approx(min(losses), rel=1e-5), "the model ends with the best check's weights"


def test_early_stopping_is_refused_without_a_validation_split_or_with_several_ranks(
    tiny_base, synthetic_train_file, tmp_path, capsys
):
    with pytest.raises(ConfigError, match="nproc"):
        TrainConfig(early_stopping=3, nproc=2)
    params = tmp_path / "params.yaml"
    params.write_text("train:\n  early_stopping: 3\nvalidate:\n  validation_fraction: 0\n")
    code = main(
        [
            "finetune",
            "--data",
            str(synthetic_train_file),
            "--base",
            str(tiny_base),
            "--out",
            str(tmp_path / "out"),
            "--max-steps",
            "3",
            "--params",
            str(params),
        ]
    )
    assert code == 2  # a config error, said in one line before anything trains
    assert "train.early_stopping needs a validation split" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_finetune_reports_its_checks_and_best_step(tiny_base, synthetic_train_file, tmp_path, capsys):
    params = tmp_path / "params.yaml"
    params.write_text(
        "train:\n  micro_batch: 4\n  lora_r: 4\n  precision: fp32\n  threads: 1\n"
        "  early_stopping: 3\n  validation_checks: 4\n"
        "validate:\n  validation_fraction: 0.2\n  validation_min_decisions: 30\n"
    )
    code = main(
        [
            "finetune",
            "--data",
            str(synthetic_train_file),
            "--base",
            str(tiny_base),
            "--out",
            str(tmp_path / "out"),
            "--max-steps",
            "8",
            "--params",
            str(params),
            "--json",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    stopping = summary["train"]["early_stopping"]
    assert [step for step, _ in stopping["checks"]] == [2, 4, 6, 8][: len(stopping["checks"])]
    assert stopping["best_step"] in {step for step, _ in stopping["checks"]}
    assert stopping["ended_at"] == summary["train"]["steps"]


def _stopping_run(tiny_base, config, checkpoints=None, stop_after=None):
    loaded = load_model(tiny_base)
    torch.manual_seed(0)
    prepare_model(loaded.model, config)
    rows = synthetic.generate_rows(24, seed=5)
    items = build_items(validate_rows(rows).records, loaded)[0]
    contrary = build_items(validate_rows([contrary_row(r) for r in rows]).records, loaded)[0]
    task = laya_batch_task(loaded.tokenizer.pad_token_id)
    cancel = CancelToken()

    def on_log(entry):  # stopped after a checkpoint: the steps since it are lost, as in a kill
        if stop_after is not None and entry["step"] >= stop_after:
            cancel.cancel("test")

    result = train(
        loaded.model,
        items,
        config,
        CPU,
        task,
        RunHooks(on_log=on_log),
        RunControls(cancel=cancel, checkpoints=checkpoints),
        stopper=EarlyStopping(contrary, config, task),
    )
    return result, {n: p.detach().clone() for n, p in loaded.model.named_parameters() if p.requires_grad}


def test_a_resumed_run_stops_where_the_whole_run_stops_with_the_same_weights(tiny_base, tmp_path):
    config = replace(
        CONFIG,
        early_stopping=2,
        validation_checks=12,
        log_every=1,
        checkpoint_every_steps=4,
        checkpoint_every_minutes=0.0,
    )
    whole, whole_params = _stopping_run(tiny_base, config)
    assert whole.steps < whole.planned_steps and len(whole.early_stopping["checks"]) >= 3
    stop = whole.early_stopping["checks"][1][0] + 2  # past the second check, and past a checkpoint
    stopped, _ = _stopping_run(tiny_base, config, Checkpointer(tmp_path / "checkpoint.pt", config), stop)
    assert stopped.cancelled
    resumed, resumed_params = _stopping_run(
        tiny_base, config, Checkpointer(tmp_path / "checkpoint.pt", config)
    )
    assert resumed.resumed_from_step > 0
    assert resumed.early_stopping == whole.early_stopping
    assert all(torch.equal(resumed_params[n], whole_params[n]) for n in whole_params)


def test_a_sweeps_pruner_sees_every_check_and_stops_the_run_without_putting_weights_back(tiny_base):
    loaded = load_model(tiny_base)
    prepare_model(loaded.model, CONFIG)
    rows = synthetic.generate_rows(24, seed=5)
    items = build_items(validate_rows(rows).records, loaded)[0]
    task = laya_batch_task(loaded.tokenizer.pad_token_id)
    config = replace(CONFIG, validation_checks=6)  # no early stopping: the checks only feed the pruner
    asked = []

    def prune(step, loss):
        asked.append((step, loss))
        return len(asked) == 3  # the pruner gives up on the third check

    lines = []
    stopper = EarlyStopping(items, config, task, lines.append, prune)
    result = train(loaded.model, items, config, CPU, task, RunHooks(report=lines.append), stopper=stopper)
    assert asked == [tuple(check) for check in result.early_stopping["checks"]] and len(asked) == 3
    assert result.steps == asked[-1][0] == result.early_stopping["pruned_at"] < result.planned_steps
    assert not result.early_stopping["restored_best"], "a pruned run keeps its last weights"
    assert any(line.startswith("pruned at step") for line in lines)


def test_without_a_pruner_or_patience_a_watched_run_trains_its_whole_budget(tiny_base):
    loaded = load_model(tiny_base)
    prepare_model(loaded.model, CONFIG)
    items = build_items(validate_rows(synthetic.generate_rows(12, seed=5)).records, loaded)[0]
    task = laya_batch_task(loaded.tokenizer.pad_token_id)
    config = replace(CONFIG, validation_checks=4, epochs=2)
    stopper = EarlyStopping(items, config, task, prune=lambda step, loss: False)
    result = train(loaded.model, items, config, CPU, task, RunHooks(), stopper=stopper)
    assert result.steps == result.planned_steps and len(result.early_stopping["checks"]) == 4
    assert result.early_stopping["pruned_at"] is None and not result.early_stopping["restored_best"]
