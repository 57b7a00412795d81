"""The retrain flow on a tiny project: tracking, registry, smoke test, gate, resume, pins (and running without
them), rollback."""

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from tests.flows.conftest import write_tiny_params
from tests.tiny import pin_inputs, write_learnable_rows

pytestmark = pytest.mark.slow


def run_flow(params, lock=None, owner=None):
    return retrain(str(params), lock=str(lock or params.parent / "dvc.lock"), owner=owner)


def retrain(*args, **kwargs):
    from flows.retrain import retrain as flow

    return flow(*args, **kwargs)


def test_a_first_run_is_tracked_registered_smoke_tested_and_promoted(
    prefect_harness, mlflow_store, tiny_params
):
    from pipeline.mlops.promotion import CHALLENGER, CHAMPION, current
    from pipeline.mlops.registry import client

    summary = run_flow(tiny_params, owner="alice")
    assert summary.release.version == "1" and summary.release.promoted and summary.release.smoke.passed
    assert current("tiny-model", CHAMPION) == "1" and current("tiny-model", CHALLENGER) == "1"
    version = client().get_model_version("tiny-model", "1")
    assert version.tags["smoke"] == "passed" and version.tags["gate"] == "promote"
    assert version.tags["owner"] == "alice"  # the flow's `owner` parameter
    assert version.tags["data_pinned"] == "true" and "allow_unpinned" not in version.tags
    assert "no champion yet" in version.tags["gate_reasons"]
    # The export carries its int8 encoder with a report that passes (the smoke test served fp32).
    assert version.tags["int8"] == "passes" and 0.5 <= float(version.tags["int8_argmax_agreement"]) <= 1.0
    assert (Path(summary.export_dir) / "int8.json").is_file()
    assert summary.tracked.revision.previous_version is None and not summary.tracked.revision.changed
    data_md5 = hashlib.md5(
        Path(yaml.safe_load(tiny_params.read_text())["retrain"]["data"]).read_bytes()
    ).hexdigest()
    assert version.tags["data_md5"] == data_md5 and version.tags["idempotency_key"] == summary.tracked.key

    run = client().get_run(summary.tracked.mlflow_run_id)
    assert run.data.params["train.max_steps"] == "4" and run.data.params["promote.max_ece"] == "1.0"
    assert (
        run.data.tags["prefect_flow_run_id"]
        and run.data.tags["idempotency_key"] == summary.tracked.key
        and run.data.tags["owner"] == "alice"
    )
    for name in (
        "base_accuracy",
        "calibrated_accuracy",
        "calibrated_ece",
        "tuned_brier",
        "temperature_noul",
        "train_seconds",
        "peak_memory_mb",
    ):
        assert name in run.data.metrics, name
    # How the states fit the window (from training) and their sizes (from validation), never silent.
    assert {
        "state_rows",
        "state_rows_truncated",
        "state_tokens_dropped",
        "state_longest_tokens",
        "state_window",
        "state_chars_longest",
        "state_rows_over_chars",
    } <= set(run.data.metrics)
    assert run.data.metrics["state_rows"] > 0 and run.data.tags["state_truncation"] == "end"
    assert len(client().get_metric_history(run.info.run_id, "loss")) == 4  # one point per logged step
    # Logged live, from the run opened when training started: held-out figures of the base (step 0), at a
    # third and two thirds of the way, and of the fine-tune; the before/after table is the run's description.
    heldout = client().get_metric_history(run.info.run_id, "heldout_accuracy")
    assert sorted(m.step for m in heldout) == [0, 1, 3, 4]
    assert run.info.status == "FINISHED" and run.info.start_time <= min(m.timestamp for m in heldout)
    assert "| calibrated |" in run.data.tags["mlflow.note.content"]
    # A bag of words on the same held-out decisions, beside the fine-tune: in the summary, the note and the
    # metrics.
    words = summary.heldout["bag_of_words"]
    assert words["rows"] > 0 and "| bag of words |" in run.data.tags["mlflow.note.content"]
    assert run.data.metrics["accuracy_over_bag_of_words"] == pytest.approx(
        summary.heldout["calibrated"]["accuracy"] - words["accuracy"]
    )
    artifacts = {
        a.path
        for folder in ("plots", "validation", "export")
        for a in client().list_artifacts(run.info.run_id, folder)
    }
    assert {
        "plots/reliability_after.png",
        "plots/reliability_by_type.png",
        "plots/loss_curve.png",
        "validation/report.json",
        "export/manifest.json",
    } <= artifacts
    # The calibration report travels with the run (artifacts, metrics) and the version (tags).
    calibration = {a.path for a in client().list_artifacts(run.info.run_id, "calibration")}
    assert {
        "calibration/calibration_report.json",
        "calibration/calibration_report.md",
        "calibration/calibrator.json",
        "calibration/expected_answers.npz",
    } <= calibration
    assert {
        "calibration_overall_ece",
        "calibration_overall_ece_high",
        "calibration_overall_nll",
        "calibration_choice_classwise_ece",
    } <= set(run.data.metrics)
    assert version.tags["calibrator"] in ("type_temperature", "question_temperature", "vector_scaling")
    low, high = (float(x) for x in version.tags["calibration_ece"].split("[")[1].rstrip("]").split(","))
    assert low <= float(version.tags["calibration_ece"].split()[0]) <= high
    assert float(version.tags["smoke_trained_agreement"]) >= 0.995
    inputs = run.inputs.dataset_inputs
    assert [i.dataset.digest for i in inputs] == [data_md5]
    # The model card: the version's description and the run's model_card.md, the same text.
    card = version.description
    for section in (
        "# tiny-model version 1",
        "## Data",
        "## Training",
        "## Intended use",
        "## Held-out figures",
        "## Calibration",
        "## Automation",
        "## Warnings and known limits",
        "## Provenance",
    ):
        assert section in card, section
    assert data_md5 in card and "accuracy [95% CI]" in card and run.data.tags["calibrator_fitted_on"] in card
    assert "temperature as fitted, with its 95% bootstrap interval" in card
    assert run.data.tags["calibrator_fitted_on"].startswith("validation split")  # no held-out label fitted it
    assert run.data.metrics["validation_decisions"] > 0
    assert "model_card.md" in {a.path for a in client().list_artifacts(run.info.run_id)}
    # Its certificates travel with the version (tags), the run (metrics, the coverage-risk plot) and the card.
    certificates = summary.calibration.certificates
    assert certificates and version.tags["certified_questions"].endswith(f"of {len(certificates)}")
    assert all(version.tags[f"certificate_{q}"].startswith("ε ") for q in certificates)
    assert {f"coverage_{q}" for q in certificates} <= set(run.data.metrics)
    assert "plots/coverage_risk.png" in artifacts and "| question | ε | δ | threshold |" in card


def test_a_crash_after_export_resumes_without_redoing_finished_work(
    prefect_harness, mlflow_store, tiny_params, monkeypatch
):
    import pipeline.stages.export
    import pipeline.stages.track
    import pipeline.stages.train
    from pipeline.mlops.registry import client
    from pipeline.mlops.tracking import KEY_TAG

    calls = {"train": 0, "export": 0, "log": 0}
    real_train, real_export, real_log = (
        pipeline.stages.train.train_stage,
        pipeline.stages.export.export_stage,
        pipeline.stages.track.track_run,
    )

    def counted(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        return wrapper

    def crashing_log(result, run_id=None):
        calls["log"] += 1
        if calls["log"] <= 3:  # the first try and both retries of the first flow run
            raise ConnectionError("tracking store unreachable")
        return real_log(result, run_id)

    monkeypatch.setattr(pipeline.stages.train, "train_stage", counted("train", real_train))
    monkeypatch.setattr(pipeline.stages.export, "export_stage", counted("export", real_export))
    monkeypatch.setattr(pipeline.stages.track, "track_run", crashing_log)
    with pytest.raises(ConnectionError):
        run_flow(tiny_params)
    summary = run_flow(tiny_params)
    assert calls == {"train": 1, "export": 1, "log": 4}  # training and export ran once, across both runs
    key = summary.tracked.key
    runs = client().search_runs(
        [r.experiment_id for r in client().search_experiments()], f"tags.{KEY_TAG} = '{key}'"
    )
    # One run: the one opened when training started (its live curve kept), finished by the resumed flow.
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert len(client().get_metric_history(runs[0].info.run_id, "loss")) == 4
    assert [str(v.version) for v in client().search_model_versions("name='tiny-model'")] == ["1"]
    assert (
        run_flow(tiny_params).release.version == "1"
    )  # the same key again: no second run, no second version
    assert len(client().search_runs([runs[0].info.experiment_id])) == 1


def test_a_tampered_dataset_stops_the_flow_before_training(
    prefect_harness, mlflow_store, tiny_params, monkeypatch
):
    import pipeline.stages.train
    from pipeline.data.pins import PinMismatch

    params = yaml.safe_load(tiny_params.read_text())
    data = tiny_params.parent / "pinned.jsonl"
    data.write_bytes(Path(params["retrain"]["data"]).read_bytes())
    tampered = write_tiny_params(tiny_params.parent, data, params["retrain"]["base"])  # pins it in dvc.lock
    with data.open("a") as handle:
        handle.write(json.dumps({"state": "extra", "questions": {}, "gold": {}}) + "\n")
    monkeypatch.setattr(
        pipeline.stages.train, "train_stage", lambda *a, **k: pytest.fail("trained on tampered data")
    )
    with pytest.raises(PinMismatch, match=r"pinned\.jsonl: bytes differ from dvc\.lock"):
        run_flow(tampered)


def test_unpinned_data_stops_the_flow_before_any_task_naming_the_path_and_the_command(
    prefect_harness, mlflow_store, tmp_path, synthetic_train_file, tiny_base, monkeypatch
):
    import pipeline.stages.train
    import pipeline.stages.validate
    from pipeline.data.pins import Unpinned

    monkeypatch.setattr(pipeline.stages.validate, "validate_stage", lambda *a, **k: pytest.fail("validated"))
    monkeypatch.setattr(pipeline.stages.train, "train_stage", lambda *a, **k: pytest.fail("trained"))
    data, base = pin_inputs(tmp_path, synthetic_train_file, tiny_base)
    params = write_tiny_params(tmp_path, data, base, pin=False)
    (tmp_path / "dvc.lock").unlink()
    with pytest.raises(Unpinned) as error:
        run_flow(params)
    message = str(error.value)
    assert "dvc.lock is missing" in message and "--allow-unpinned" in message
    assert f"{data}: not pinned; pin it with `dvc add pinned/rows.jsonl`" in message
    assert f"{base}: not pinned; pin it with `dvc add pinned/base`" in message

    pin_inputs(
        tmp_path, base
    )  # a dvc.lock that pins the base only; dvc.yaml says which stage writes the data
    (tmp_path / "dvc.yaml").write_text(
        yaml.safe_dump({"stages": {"dataset": {"cmd": "make-rows", "outs": ["pinned/rows.jsonl"]}}})
    )
    with pytest.raises(Unpinned) as error:
        run_flow(params)
    message = str(error.value)
    assert f"{data}: not pinned; pin it with `dvc repro dataset`" in message and str(base) not in message


def test_allow_unpinned_trains_tags_the_run_and_version_and_the_gate_holds_it(
    prefect_harness, mlflow_store, tmp_path, synthetic_train_file, tiny_base
):
    from pipeline.mlops.promotion import (
        CHAMPION,
        UNPINNED_REASON,
        UNPINNED_TAG,
        PromotionRefused,
        current,
        promote_version,
    )
    from pipeline.mlops.registry import client

    params = write_tiny_params(tmp_path, synthetic_train_file, tiny_base, pin=False)  # no dvc.lock at all
    summary = retrain(str(params), lock=str(tmp_path / "dvc.lock"), allow_unpinned=True)
    # The first version of a model is promoted unless something holds it ("no champion yet"): here the gate
    # does.
    assert not summary.release.promoted and current("tiny-model", CHAMPION) is None
    assert UNPINNED_REASON in summary.release.gate.reasons and summary.release.smoke.passed
    assert summary.train.inputs == {
        "data": {"path": str(synthetic_train_file), "pinned": False},
        "base": {"path": str(tiny_base), "pinned": False},
    }
    version = client().get_model_version("tiny-model", summary.release.version)
    run = client().get_run(summary.tracked.mlflow_run_id)
    for tags in (version.tags, run.data.tags):
        assert (
            tags[UNPINNED_TAG] == "true" and tags["data_pinned"] == "false" and tags["base_pinned"] == "false"
        )
    assert version.tags["gate"] == "hold"
    manifest = json.loads(
        Path(client().download_artifacts(run.info.run_id, "export/manifest.json", str(tmp_path))).read_text()
    )
    assert manifest["inputs"] == summary.train.inputs

    with pytest.raises(PromotionRefused, match=r"unpinned inputs.*--force"):
        promote_version("tiny-model", summary.release.version)
    promote_version("tiny-model", summary.release.version, force=True)
    assert current("tiny-model", CHAMPION) == summary.release.version


def test_a_worse_candidate_is_held_as_challenger_and_rollback_restores_the_champion(
    prefect_harness, mlflow_store, tmp_path, synthetic_train_file, tiny_base
):
    from pipeline.mlops.promotion import (
        CHALLENGER,
        CHAMPION,
        PromotionRefused,
        current,
        history,
        promote_version,
        rollback,
    )
    from pipeline.mlops.registry import client

    data = write_learnable_rows(tmp_path / "learnable.jsonl", 400)
    trained = write_tiny_params(
        tmp_path,
        data,
        tiny_base,
        validate={"holdout_max_decisions": 120},
        train={"max_steps": 60, "lora_lr": 0.005, "head_lr": 0.003},
    )
    first = run_flow(trained)
    untrained = write_tiny_params(
        tmp_path, data, tiny_base, validate={"holdout_max_decisions": 120}, train={"max_steps": 0}
    )
    second = run_flow(untrained)
    assert (
        second.tracked.revision.previous_version == first.release.version
        and not second.tracked.revision.changed
    )
    # the same data, and the run says why it is a new version all the same
    assert (
        f"(unchanged since version {first.release.version}; a new version for its params ("
        in second.tracked.revision.line()
    )
    assert "train.max_steps 60 -> 0" in second.tracked.revision.line()
    candidate, champion = (
        second.heldout["calibrated"]["accuracy"],
        first.heldout["calibrated"]["accuracy"],
    )
    assert candidate < champion, "the untrained model should be worse for this test to mean anything"
    assert not second.release.promoted and any(
        "accuracy" in r and "<" in r for r in second.release.gate.reasons
    )
    assert (
        current("tiny-model", CHAMPION) == first.release.version
        and current("tiny-model", CHALLENGER) == second.release.version
    )

    promote_version("tiny-model", second.release.version, why="test: by hand")
    assert current("tiny-model", CHAMPION) == second.release.version
    assert (
        rollback("tiny-model") == first.release.version
        and current("tiny-model", CHAMPION) == first.release.version
    )
    moves = [(h["alias"], h["from"], h["to"]) for h in history("tiny-model")]
    assert moves[-1] == ("champion", second.release.version, first.release.version)
    with pytest.raises(PromotionRefused):
        rollback("tiny-model")  # version 1 was the first champion: nothing earlier

    client().set_model_version_tag("tiny-model", second.release.version, "smoke", "failed")
    with pytest.raises(PromotionRefused, match="--force"):
        promote_version("tiny-model", second.release.version)
    assert promote_version("tiny-model", second.release.version, force=True)
    assert current("tiny-model", CHAMPION) == second.release.version
    moves = history("tiny-model")
    assert not promote_version(
        "tiny-model", second.release.version, force=True
    )  # the champion already: no move
    assert history("tiny-model") == moves and rollback("tiny-model") == first.release.version


def test_a_gate_asking_for_a_margin_over_the_bag_of_words_holds_a_version_that_lacks_it(
    prefect_harness, mlflow_store, tmp_path, synthetic_train_file, tiny_base
):
    from pipeline.mlops.promotion import CHAMPION, current

    # A margin no model reaches: the first version is held, and the gate says by how much it fell short.
    params = write_tiny_params(
        tmp_path, synthetic_train_file, tiny_base, promote={"min_accuracy_over_bag_of_words": 1.0}
    )
    summary = run_flow(params)
    words = summary.heldout["bag_of_words"]["accuracy"]
    assert not summary.release.promoted and current("tiny-model", CHAMPION) is None
    assert f"the bag of words' {words:.4f} + 1.0" in "; ".join(summary.release.gate.reasons)
