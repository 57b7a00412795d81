"""`decision compare A B`: a paired record bootstrap per question on the same rows, from the CLI and in
numbers."""

import json

import numpy as np
import pytest

from pipeline.cli.main import main
from pipeline.mlops.registry import parse_version_uri
from pipeline.scoring.decisions import ScoredDecision
from pipeline.scoring.paired import per_question_differences
from tests.tiny import certified_copy, tone_certificate


def _scored(right: list[bool], questions: list[str], confident: float = 0.9):
    """Two-option decisions, one per record, gold 0; the model puts `confident` on gold where `right`."""
    decisions = [ScoredDecision(2, 0, i, q, (1.0, 0.0)) for i, q in enumerate(questions)]
    probabilities = [
        np.array([confident, 1 - confident]) if r else np.array([1 - confident, confident]) for r in right
    ]
    return decisions, probabilities


def test_a_question_where_b_is_always_right_is_b_beyond_noise_and_an_equal_one_is_not():
    questions = ["better"] * 200 + ["same"] * 200
    rng = np.random.default_rng(0)
    same = list(rng.random(200) < 0.7)
    a = _scored([False] * 200 + same, questions)
    b = _scored([True] * 200 + same, questions)
    rows = {r.question: r for r in per_question_differences(a, b)}
    assert list(rows) == ["all", "better", "same"]
    assert rows["better"].accuracy_gain == 1.0 and rows["better"].verdict == "B more accurate"
    assert rows["same"].accuracy_gain == 0.0 and rows["same"].verdict == "no difference beyond noise"
    assert rows["all"].decisions == 400 and rows["all"].accuracy_gain_low > 0
    flipped = {r.question: r for r in per_question_differences(b, a)}
    assert flipped["better"].verdict == "A more accurate" and flipped["better"].nll_gain < 0


def test_a_small_difference_on_few_records_is_noise():
    questions = ["q"] * 20
    a = _scored([True] * 14 + [False] * 6, questions)
    b = _scored([True] * 15 + [False] * 5, questions)
    _, row = per_question_differences(a, b)
    assert row.accuracy_gain == pytest.approx(0.05)
    assert (
        row.accuracy_gain_low <= 0 <= row.accuracy_gain_high and row.verdict == "no difference beyond noise"
    )


def test_too_few_records_name_no_winner_however_the_interval_falls():
    # One record right for B and wrong for A gave "B more accurate" with the interval [+1, +1].
    for n in (1, 19):
        _, row = per_question_differences(_scored([False] * n, ["q"] * n), _scored([True] * n, ["q"] * n))
        assert row.accuracy_gain_low == 1.0 and row.records == n
        assert row.verdict == f"too few records to tell ({n} < 20)" and row.b_less_accurate is False


def test_models_sharing_no_decision_are_refused():
    with pytest.raises(ValueError, match="share no decision"):
        per_question_differences(_scored([True], ["q"]), ([], []))


def test_version_uris_are_told_from_alias_uris_and_folders():
    assert parse_version_uri("models:/decision-model/7") == ("decision-model", "7")
    assert parse_version_uri("models:/decision-model@champion") is None
    assert parse_version_uri("runs/a/export") is None


def test_the_cli_compares_a_base_with_its_fine_tune_per_question(
    tiny_base, synthetic_train_file, tmp_path, capsys, monkeypatch
):
    params = tmp_path / "params.yaml"
    params.write_text(
        "train:\n  micro_batch: 4\n  grad_accum: 2\n  lora_r: 4\n  precision: fp32\n"
        "validate:\n  holdout_max_decisions: 120\n  holdout_fraction: 0.3\n"
    )
    out = tmp_path / "export"
    assert (
        main(
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
                str(params),
                "--json",
            ]
        )
        == 0
    )
    capsys.readouterr()
    common = ["--data", str(synthetic_train_file), "--params", str(params), "--json", "-q"]
    assert main(["compare", str(tiny_base), str(out), *common]) == 0
    result = json.loads(capsys.readouterr().out)
    names = [q["question"] for q in result["questions"]]
    assert names == ["all", "intensity", "is_negative", "tone"] and result["rows"] == "held-out"
    assert result["questions"][0]["decisions"] == sum(q["decisions"] for q in result["questions"][1:])
    assert main(["compare", str(out), str(out), *common]) == 0
    itself = json.loads(capsys.readouterr().out)["questions"][0]
    assert itself["accuracy_gain"] == 0 and itself["nll_gain"] == 0
    assert itself["verdict"] == "no difference beyond noise"
    assert main(["compare", str(out), str(out), "--all-rows", *common]) == 0
    assert json.loads(capsys.readouterr().out)["records"] > result["records"]
    # What each side's certificates automate on the same rows: none for A, every tone answer for B.
    plain = certified_copy(out, tmp_path / "plain", None)
    certified = certified_copy(out, tmp_path / "certified", {"tone": tone_certificate(0.0)})
    assert main(["compare", str(plain), str(certified), *common]) == 0
    automation = json.loads(capsys.readouterr().out)["automation"]
    assert not automation["a"]["certified"] and automation["a"]["overall"]["coverage"] == 0
    tone = automation["b"]["by_question"]["tone"]
    assert tone["coverage"] == 1.0 and tone["automated"] == tone["decisions"] > 0
    assert tone["error_low"] <= tone["error"] <= tone["error_high"]
    assert automation["b"]["by_question"]["intensity"]["certified"] is False
    assert main(["compare", str(plain), str(certified), *common[:-2], "-q"]) == 0
    shown = capsys.readouterr().out  # a wide table: the coverage and error columns
    assert "cov. A" in shown and "err. B" in shown and "not cert." in shown
    assert "certified automation of A" in shown and "not certified (no certificates in the export)" in shown
    assert "certified automation of B" in shown and "1.000 [" in shown
    monkeypatch.setenv("COLUMNS", "100")  # a narrow terminal: lines per question
    assert main(["compare", str(plain), str(certified), *common[:-2], "-q"]) == 0
    assert "  automated: A not certified; B coverage 1.000, error 0." in capsys.readouterr().out


@pytest.mark.parametrize(
    "missing, store, said",
    [
        ("nope", False, "no such folder"),
        ("models:/nope/1", False, "no MLflow store at"),
        ("models:/nope/1", True, "not found"),
    ],
)
def test_a_missing_model_is_one_line_naming_its_side_and_exit_2(
    missing, store, said, tiny_base, synthetic_train_file, tmp_path, capsys, monkeypatch
):
    from pipeline.mlops.registry import ensure_experiment

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    if store:
        ensure_experiment()
    missing = missing if missing.startswith("models:/") else str(tmp_path / missing)
    common = ["--data", str(synthetic_train_file), "--all-rows", "-q"]
    for args, side in (([missing, str(tiny_base)], "A"), ([str(tiny_base), missing], "B")):
        assert main(["compare", *args, *common]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        err = [line for line in lines if " INFO mlflow" not in line]  # MLflow making a fresh store says so
        assert len(err) == 1 and err[0].startswith(f"decision compare: {side} ({missing}): "), err
        assert said in err[0]
    assert (tmp_path / "mlflow.db").exists() == store


def test_data_too_small_for_a_heldout_split_says_so_and_points_at_all_rows(
    synthetic_train_file, tiny_base, tmp_path, capsys
):
    one_row = tmp_path / "one.jsonl"
    one_row.write_text(synthetic_train_file.read_text().splitlines()[0] + "\n")
    code = main(["compare", str(tiny_base), str(tiny_base), "--data", str(one_row)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "no held-out rows" in err[0] and "1 usable row" in err[0] and "--all-rows" in err[0]


def test_a_plain_base_is_no_side_of_a_comparison(tiny_base, synthetic_train_file, tmp_path, capsys):
    # A plain encoder folder was scored with a fresh, untrained head and given a verdict.
    from tests.tiny import write_tiny_encoder

    encoder = write_tiny_encoder(tmp_path / "bert", "bert")
    args = ["compare", str(encoder), str(tiny_base), "--data", str(synthetic_train_file), "--all-rows", "-q"]
    assert main(args) == 2
    assert f"decision compare: A ({encoder}): not an export" in capsys.readouterr().err


def test_b_is_checked_before_a_is_scored(tiny_base, synthetic_train_file, tmp_path, capsys, monkeypatch):
    # A was scored in full (minutes on real data) before a B that is not there was refused.
    import pipeline.stages.compare as compare_stage

    monkeypatch.setattr(compare_stage, "score_records", lambda *args: pytest.fail("A was scored"))
    args = [
        "compare",
        str(tiny_base),
        str(tmp_path / "nope"),
        "--data",
        str(synthetic_train_file),
        "--all-rows",
    ]
    assert main(args) == 2
    assert f"decision compare: B ({tmp_path / 'nope'}): no such folder" in capsys.readouterr().err
