"""`decision finetune` and `decision evaluate` end to end on a tiny model and synthetic rows."""

import contextlib
import io
import json

import pytest
import torch

from pipeline.cli.main import main
from pipeline.data.leakage import overlap_warning
from pipeline.data.pins import current_md5
from pipeline.families import load_decision_model
from pipeline.families.laya_layout import load_model
from pipeline.rundir import RunFolder
from tests.tiny import pin_inputs

KEYS = {"run_dir", "validation", "train", "calibration", "export_dir", "tracked", "release"}


PARAMS = (
    "train:\n  micro_batch: 4\n  grad_accum: 2\n  lora_r: 4\n  precision: fp32\n"
    "validate:\n  holdout_max_decisions: 120\n  holdout_fraction: 0.3\n"
)


@pytest.fixture
def params(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(PARAMS)
    return path


@pytest.fixture(scope="module")
def finetuned(tiny_base, synthetic_train_file, tmp_path_factory):
    """One `decision finetune --json` of three steps, for the tests that read what it prints and writes (each
    ran the same fine-tune of its own): (the export folder, the summary it printed)."""
    folder = tmp_path_factory.mktemp("finetuned")
    (folder / "params.yaml").write_text(PARAMS)
    out = folder / "export"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(
            [
                "finetune",
                "--data",
                str(synthetic_train_file),
                "--base",
                str(tiny_base),
                "--out",
                str(out),
                "--max-steps",
                "3",
                "--params",
                str(folder / "params.yaml"),
                "--json",
            ]
        )
    assert code == 0
    return out, json.loads(printed.getvalue())


def test_finetune_json_has_the_stable_keys_and_exports_a_model(finetuned):
    out, summary = finetuned
    assert (
        set(summary) == KEYS and summary["tracked"] is None and summary["release"] is None
    )  # no flow: no MLflow
    assert set(summary["train"]) >= {
        "rows",
        "decisions",
        "skipped",
        "train_seconds",
        "s_per_step",
        "peak_memory_mb",
    }
    assert set(summary["calibration"]["heldout"]) == {
        "decisions",
        "base",
        "tuned",
        "calibrated",
        "bag_of_words",
    }
    for model in (
        "base",
        "tuned",
        "calibrated",
        "bag_of_words",
    ):  # a bag of words on the same held-out decisions
        assert set(summary["calibration"]["heldout"][model]) >= {"accuracy", "record_accuracy", "ece"}
    assert summary["export_dir"] == str(out)
    exported = load_model(out)
    assert exported.config["temperature"] == [
        summary["calibration"]["temperatures"][t] for t in ("choice", "score", "noul")
    ]
    manifest = json.loads((out / "manifest.json").read_text())
    assert {"data_md5", "base_md5", "git_commit", "params", "metrics"} <= set(manifest)


def test_train_and_finetune_take_a_users_unpinned_base_and_record_which_input_was_pinned(
    tiny_base, synthetic_train_file, params, tmp_path, capsys, monkeypatch
):
    project = tmp_path / "project"
    project.mkdir()
    (data,) = pin_inputs(project, synthetic_train_file)  # dvc.lock pins the data; the base is the user's own
    monkeypatch.chdir(project)
    expected = {
        "data": {"path": str(data), "pinned": True},
        "base": {"path": str(tiny_base), "pinned": False},
    }
    common = [
        "--data",
        str(data),
        "--base",
        str(tiny_base),
        "--max-steps",
        "2",
        "--params",
        str(params),
        "--json",
    ]
    assert main(["train", *common, "--out", str(tmp_path / "tune")]) == 0
    run = json.loads(capsys.readouterr().out)
    assert run["inputs"] == expected and run["pins"] == {"pinned/rows.jsonl": current_md5(data)}
    assert main(["finetune", *common, "--out", str(tmp_path / "export")]) == 0
    assert json.loads(capsys.readouterr().out)["train"]["inputs"] == expected
    assert json.loads((tmp_path / "export" / "manifest.json").read_text())["inputs"] == expected


def test_train_refuses_a_pinned_input_whose_bytes_differ(
    tiny_base, synthetic_train_file, params, tmp_path, capsys, monkeypatch
):
    (data,) = pin_inputs(tmp_path, synthetic_train_file)
    monkeypatch.chdir(tmp_path)
    with data.open("a") as handle:
        handle.write("\n")
    code = main(
        [
            "train",
            "--data",
            str(data),
            "--base",
            str(tiny_base),
            "--out",
            str(tmp_path / "tune"),
            "--params",
            str(params),
            "--json",
        ]
    )
    assert code == 1 and not (tmp_path / "tune").exists()
    assert "pinned/rows.jsonl: bytes differ from dvc.lock" in capsys.readouterr().err


def test_train_runs_on_the_threads_it_was_given_and_records_them(
    tiny_base, synthetic_train_file, params, tmp_path, capsys
):
    before = torch.get_num_threads()
    try:
        code = main(
            [
                "train",
                "--data",
                str(synthetic_train_file),
                "--slice",
                "0:40",
                "--base",
                str(tiny_base),
                "--out",
                str(tmp_path / "tune"),
                "--max-steps",
                "1",
                "--threads",
                "1",
                "--params",
                str(params),
                "--json",
            ]
        )
        assert code == 0 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    summary = json.loads(capsys.readouterr().out)
    assert (summary["threads"], summary["threads_source"]) == (1, "train.threads 1")


def test_finetune_with_eval_data_and_a_slice(tiny_base, synthetic_train_file, params, tmp_path, capsys):
    held = tmp_path / "held.jsonl"  # rows 40 on: not the slice trained on (the same file is refused)
    held.write_text("".join(synthetic_train_file.read_text().splitlines(keepends=True)[40:]))
    code = main(
        [
            "finetune",
            "--data",
            str(synthetic_train_file),
            "--eval-data",
            str(held),
            "--slice",
            "0:40",
            "--base",
            str(tiny_base),
            "--out",
            str(tmp_path / "e"),
            "--max-steps",
            "2",
            "--params",
            str(params),
            "--json",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert (
        summary["train"]["rows"] == 40 and summary["calibration"]["heldout"]["decisions"] == 3 * 120
    )  # all of --eval-data held out


def test_evaluation_rows_the_model_trained_on_are_counted_and_warned_of(
    tiny_base, synthetic_train_file, params, tmp_path, capsys
):
    held = tmp_path / "held.jsonl"  # rows 30-79: 10 of them (30-39) in the slice trained on
    held.write_text("".join(synthetic_train_file.read_text().splitlines(keepends=True)[30:80]))
    out = tmp_path / "export"
    data = ["--data", str(synthetic_train_file), "--slice", "0:40", "--eval-data", str(held)]
    run = ["--base", str(tiny_base), "--out", str(out), "--max-steps", "1", "--params", str(params), "--json"]
    code = main(["finetune", *data, *run])
    assert code == 0
    assert overlap_warning(10, 50) in capsys.readouterr().err
    validation = json.loads(RunFolder(tmp_path / "export.run").validation.read_text())
    assert validation["split"]["eval_overlap_rows"] == 10
    # The export keeps its training rows' fingerprints: evaluate counts the rows it trained on (0-39 of 0-59).
    assert json.loads((out / "manifest.json").read_text())["training_states"]["count"] == 40
    code = main(
        ["evaluate", "--model", str(out), "--data", str(synthetic_train_file), "--slice", ":60", "--json"]
    )
    output = capsys.readouterr()
    assert code == 0 and json.loads(output.out)["training_overlap"] == 40
    assert overlap_warning(40, 60) in output.err


def test_evaluate_writes_metrics_and_plots(tiny_base, synthetic_train_file, tmp_path, capsys):
    plots = tmp_path / "plots"
    code = main(
        [
            "evaluate",
            "--model",
            str(tiny_base),
            "--data",
            str(synthetic_train_file),
            "--slice",
            "0:60",
            "--plots",
            str(plots),
            "--json",
        ]
    )
    assert code == 0
    output = capsys.readouterr()
    report = json.loads(output.out)
    # A base keeps no training states: nothing to check, no warning.
    assert report["training_overlap"] is None and "warning" not in output.err
    assert set(report["metrics"]) == {"overall", "choice", "score", "noul"}
    assert report["metrics"]["overall"]["decisions"] == 180
    names = sorted(p.name for p in plots.iterdir())
    assert names == [
        "confusion_intensity.png",
        "confusion_is_negative.png",
        "confusion_tone.png",
        "reliability.png",
        "reliability_by_type.png",
    ]
    assert all((plots / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)


def test_evaluate_shows_what_the_certificates_automate_per_question_and_overall(
    tiny_base, synthetic_train_file, tmp_path, capsys
):
    """A model without certificates automates nothing ('not certified'); one certified to automate every tone
    answer covers all of them, its realised error the tone errors, with 95% intervals; a certificate for tone
    asked with other options is not applied."""
    from tests.tiny import certified_copy, tone_certificate

    flags = ["--data", str(synthetic_train_file), "--slice", "0:60"]
    assert main(["evaluate", "--model", str(tiny_base), *flags, "--json", "-q"]) == 0
    plain = json.loads(capsys.readouterr().out)["automation"]
    assert (
        not plain["certified"] and plain["overall"]["coverage"] == 0 and plain["overall"]["decisions"] == 180
    )
    assert plain["by_question"]["tone"]["certified"] is False and plain["overall"]["error"] is None
    assert main(["evaluate", "--model", str(tiny_base), *flags, "-q"]) == 0
    assert "certified automation: not certified (no certificates in the export): coverage 0 of 180" in (
        capsys.readouterr().out
    )
    certified = certified_copy(tiny_base, tmp_path / "certified", {"tone": tone_certificate(0.0)})
    assert main(["evaluate", "--model", str(certified), *flags, "--json", "-q"]) == 0
    report = json.loads(capsys.readouterr().out)
    tone, overall = report["automation"]["by_question"]["tone"], report["automation"]["overall"]
    assert tone["certified"] and tone["threshold"] == 0.0 and tone["automated"] == tone["decisions"] == 60
    assert tone["coverage"] == 1.0 and tone["error_low"] <= tone["error"] <= tone["error_high"]
    assert report["automation"]["by_question"]["intensity"]["coverage"] == 0
    assert overall["automated"] == 60 and overall["coverage"] == pytest.approx(1 / 3)
    assert overall["coverage_low"] < 1 / 3 < overall["coverage_high"] and overall["errors"] == tone["errors"]
    assert main(["evaluate", "--model", str(certified), *flags, "-q"]) == 0
    table = capsys.readouterr().out
    assert "certified automation (95% Clopper-Pearson intervals)" in table and "not certified" in table
    assert "1.000 [0.940, 1.000]" in table  # tone: 60 of 60 automated
    other = certified_copy(tiny_base, tmp_path / "other", {"tone": tone_certificate(0.0, ("a", "b", "c"))})
    assert main(["evaluate", "--model", str(other), *flags, "--json", "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["automation"]["overall"]["automated"] == 0


def test_a_cancel_during_calibration_exports_nothing(tiny_base, synthetic_train_file, tmp_path, monkeypatch):
    import pipeline.stages.finetune as stage
    from pipeline.config import TrainConfig
    from pipeline.data.split import TrainSource
    from pipeline.stages.finetune import finetune
    from pipeline.training.controls import CancelToken, RunControls

    cancel = CancelToken()
    original = stage.calibrate_stage

    def cancelled_while_fitting(*args, **kwargs):
        cancel.cancel("signal SIGINT")  # as a Ctrl-C arriving while the calibrator is fitted
        return original(*args, **kwargs)

    monkeypatch.setattr(stage, "calibrate_stage", cancelled_while_fitting)
    config = TrainConfig(micro_batch=4, grad_accum=2, lora_r=4, precision="fp32", max_steps=2)
    summary = finetune(
        TrainSource(synthetic_train_file),
        tiny_base,
        tmp_path / "export",
        config,
        controls=RunControls(cancel=cancel),
    )
    assert summary.cancelled and summary.export_dir is None
    assert not (tmp_path / "export").exists()


def test_finetune_writes_the_flows_run_files(finetuned):
    """One chain: the run folder holds what the flow's does (calibration report, expected answers, plots)."""
    out, summary = finetuned
    run = RunFolder(summary["run_dir"])
    assert run.root == out.parent / "export.run"
    for path in (
        run.split,
        run.train_summary,
        run.heldout,
        run.calibration,
        run.calibrator,
        run.expected_answers,
        run.calibration_report,
        run.calibration_report.with_suffix(".md"),
    ):
        assert path.is_file(), path
    assert (run.plots / "reliability_after.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads(
        run.validation.read_text()
    )  # the flow's validation report, its split summary included
    assert report["split"]["heldout_decisions"] > 0
    calibration = json.loads(run.calibration.read_text())
    assert summary["calibration"]["temperatures"] == calibration["temperatures"]
    assert (
        summary["calibration"]["heldout"]["calibrated"]["ece"] == calibration["heldout"]["calibrated"]["ece"]
    )
    # The novelty gate of the fine-tune's state vectors, carried by the export and loaded with it.
    assert run.novelty.is_file() and calibration["novelty"]["bank"] > 0
    assert {"certificates", "novelty"} <= set(json.loads((out / "manifest.json").read_text()))
    gate = load_decision_model(out).automation.gate
    assert gate.threshold == pytest.approx(calibration["novelty"]["threshold"], abs=1e-6)


def test_a_certify_override_of_a_question_the_data_never_asks_is_one_line_before_any_training(
    tiny_base, synthetic_train_file, params, tmp_path, capsys
):
    params.write_text(
        params.read_text() + "certify:\n  questions:\n    no_such_question: {target_error: 0.1}\n"
    )
    out = tmp_path / "export"
    common = ["--data", str(synthetic_train_file), "--base", str(tiny_base), "--params", str(params)]
    assert main(["finetune", *common, "--out", str(out), "--max-steps", "3"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "certify.questions: no_such_question: no such question in the data" in error[0]
    assert not out.exists() and not RunFolder(f"{out}.run").train_summary.exists()  # nothing was trained
