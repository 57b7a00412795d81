"""The evaluation protocol: nothing fitted reads a held-out label.

The calibrator is chosen and fitted on the validation split carved from the training rows, and the held-out
rows are scored once. Two runs whose held-out rows differ only in their gold labels must fit the same weights
and the same calibrator, and report different held-out figures.
"""

import json

import pytest
from safetensors.torch import load_file

from pipeline.cli.main import main
from pipeline.data import synthetic
from pipeline.rundir import RunFolder
from tests.tiny import contrary_row


@pytest.fixture
def params(tmp_path):
    path = tmp_path / "params.yaml"
    # One thread: the same arithmetic in both runs (a thread count the load governor changes mid-run would not
    # be). Two out-of-fold folds, not five, and two micro-batches a step, not eight: every fitted part stays
    # under the protocol's check, at a fraction of its cost.
    path.write_text(
        "train:\n  micro_batch: 4\n  grad_accum: 2\n  lora_r: 4\n  precision: fp32\n  threads: 1\n"
        "  out_of_fold_folds: 2\n"
        "validate:\n  validation_fraction: 0.2\n  validation_min_decisions: 30\n"
    )
    return path


def _finetune(data, eval_data, base, params, out, capsys, *extra: str) -> dict:
    code = main(
        [
            "finetune",
            "--data",
            str(data),
            "--eval-data",
            str(eval_data),
            "--base",
            str(base),
            "--out",
            str(out),
            "--max-steps",
            "4",
            "--params",
            str(params),
            "--json",
            *extra,
        ]
    )
    assert code == 0
    return json.loads(capsys.readouterr().out)


def _weights(run: RunFolder) -> dict:
    return {
        f"{p.name}:{k}": v
        for p in sorted(run.finetune.rglob("*.safetensors"))
        for k, v in load_file(p).items()
    }


@pytest.mark.parametrize("family", ["laya", "joint"])
def test_changing_held_out_labels_changes_no_fitted_parameter(
    family, tiny_base, synthetic_train_file, params, tmp_path, capsys
):
    heldout = synthetic.generate_rows(60, seed=12)
    original = synthetic.write_rows(heldout, tmp_path / "heldout.jsonl")
    relabelled = synthetic.write_rows([contrary_row(r) for r in heldout], tmp_path / "relabelled.jsonl")
    family_flag = ("--family", family)
    first = _finetune(synthetic_train_file, original, tiny_base, params, tmp_path / "a", capsys, *family_flag)
    second = _finetune(
        synthetic_train_file, relabelled, tiny_base, params, tmp_path / "b", capsys, *family_flag
    )
    runs = RunFolder(first["run_dir"]), RunFolder(second["run_dir"])

    assert first["calibration"]["calibrator"]["fitted_on"].startswith("validation split")
    weights = [_weights(run) for run in runs]
    assert weights[0] and weights[0].keys() == weights[1].keys()
    assert all((weights[0][k] == weights[1][k]).all() for k in weights[0])
    assert runs[0].calibrator.read_text() == runs[1].calibrator.read_text()
    assert (
        first["calibration"]["heldout"]["calibrated"]["loss"]
        != second["calibration"]["heldout"]["calibrated"]["loss"]
    )  # the labels were read


def test_without_a_validation_split_the_run_says_its_calibrator_saw_held_out_labels(
    tiny_base, synthetic_train_file, tmp_path, capsys
):
    params = tmp_path / "params.yaml"
    params.write_text(
        "train:\n  micro_batch: 4\n  grad_accum: 2\n  lora_r: 4\n  precision: fp32\n"
        "validate:\n  validation_fraction: 0\n"
    )
    held = tmp_path / "held.jsonl"  # other rows than the training data's (the same file is refused)
    held.write_text("".join(synthetic_train_file.read_text().splitlines(keepends=True)[100:]))
    summary = _finetune(synthetic_train_file, held, tiny_base, params, tmp_path / "c", capsys)
    assert summary["calibration"]["calibrator"]["fitted_on"].startswith("held-out rows, cross-fitted")
    assert not RunFolder(summary["run_dir"]).validation_logits.exists()
