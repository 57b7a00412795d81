"""Batch scoring (`decision predict`): answers equal the served answers, row by row, for both families;
unlabelled rows are scored; a refused row keeps its reason code; the output is whole or absent."""

import json
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from pipeline.cli.main import main
from pipeline.data import synthetic
from pipeline.data.answers import chosen_option, parse_request
from pipeline.data.validate import validate_rows
from pipeline.families import load_decision_model, pick_family
from pipeline.families.base import Answered
from pipeline.scoring.calibrators import Calibrator
from pipeline.stages import predict as predict_module
from pipeline.stages.predict import predict_stage
from tests.api.conftest import QUESTIONS
from tests.tiny import load_joint_on

# Temperatures away from 1, so answers that skipped the export's calibration could not equal the served ones.
CALIBRATOR = Calibrator(temperatures=(2.0, 0.6, 1.7))
STATES = [
    "the battery died after a day",
    "ok",
    {"text": "nested", "meta": {"stars": 2, "tags": ["x", None]}},
    "a " + "very " * 80 + "long review of a phone that broke",
    ["turn one", {"speaker": "b", "said": "fine"}],
]
ONE_OPTION = {"type": "choice", "instructions": "Pick", "criteria": ["only"]}
# One refused row per reason: (row, its code).
BAD_ROWS = [
    ({"state": "s", "questions": "{not json"}, "invalid_json"),
    ({"state": "", "questions": QUESTIONS}, "missing_state"),
    ({"state": "s", "questions": {}}, "missing_questions"),
    ({"state": "s", "questions": {f"q{i}": QUESTIONS["positive"] for i in range(65)}}, "too_many_questions"),
    ({"state": "s", "questions": {"q": {"type": "rank", "criteria": ["a", "b"]}}}, "unknown_question_type"),
    (
        {"state": "s", "questions": {"q": {"type": "score", "criteria": {"0": "low", "1": "high"}}}},
        "bad_criteria",
    ),
    ({"state": "s", "questions": {"q": {"type": "choice", "criteria": ["a", "a"]}}}, "repeated_options"),
    ({"state": "x" * 200_001, "questions": QUESTIONS}, "too_long"),
    ({"state": "s", "questions": {"tone": QUESTIONS["tone"], "one": ONE_OPTION}}, "too_few_options"),
]


@pytest.fixture(scope="module", params=["laya", "joint"])
def export(request, tiny_base, tmp_path_factory) -> Path:
    """A calibrated export of each family on the tiny base."""
    folder = tmp_path_factory.mktemp(request.param) / "export"
    if request.param == "laya":
        family = pick_family(tiny_base)
        family.export(family.load(tiny_base), folder, CALIBRATOR, {"family": "laya"})
    else:
        family, loaded = load_joint_on(tiny_base)
        family.export(loaded, folder, CALIBRATOR, {"family": "joint"})
    return folder


def unlabelled_rows(n: int) -> list[dict]:
    """Rows without gold: every state shape, each with a different subset of the questions, and an id."""
    subsets = [
        QUESTIONS,
        {"tone": QUESTIONS["tone"]},
        {"positive": QUESTIONS["positive"], "tone": QUESTIONS["tone"]},
    ]
    return [
        {"id": f"r-{i}", "state": STATES[i % len(STATES)], "questions": subsets[i % len(subsets)]}
        for i in range(n)
    ]


def read_out(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def served_answers(folder: Path, row: dict) -> dict:
    """What the Decision API answers for the row: the HTTP-free serving function, one request alone."""
    [result] = load_decision_model(folder).answer([parse_request(row["state"], row["questions"])])
    assert isinstance(result, Answered)
    return result.answers


def test_batch_answers_equal_the_served_answers_row_by_row(export, tmp_path):
    rows = unlabelled_rows(12)
    data = synthetic.write_rows(rows, tmp_path / "rows.jsonl")
    result = predict_stage(str(export), data, tmp_path / "scores.parquet", batch_size=5)
    out = read_out(tmp_path / "scores.parquet")
    assert (result.rows, result.scored, result.failed) == (12, 12, {})
    assert [o["row"] for o in out] == list(range(12)) and [o["row_id"] for o in out] == [
        r["id"] for r in rows
    ]
    for row, scored in zip(rows, out):
        answers = json.loads(scored["answers"])
        assert answers == served_answers(export, row)  # identical: same rounding, same calibration
        assert scored["error"] is None and scored["input_tokens"] > 0
        for qid in QUESTIONS:  # flattened from the first row's questions; null where a row did not ask it
            answer = answers.get(qid)
            assert scored[f"{qid}.label"] == (chosen_option(answer) if answer else None)
            expected = answer and answer.get("confidence", answer.get("x_confidence"))
            assert scored[f"{qid}.confidence"] == expected


def test_every_source_format_shards_and_chunking_give_the_same_file(tiny_base, tmp_path):
    rows = [{k: v for k, v in row.items() if k != "gold"} for row in synthetic.generate_rows(40, seed=5)]
    outputs = []
    for fmt, chunk, batch in (("jsonl", 1024, 64), ("parquet", 7, 3), ("csv", 5, 2), ("jsonl", 3, 1)):
        data = synthetic.write_rows(rows, tmp_path / f"rows-{chunk}.{fmt}", row_group_size=6)
        out = tmp_path / f"scores-{fmt}-{chunk}.parquet"
        predict_stage(str(tiny_base), data, out, batch_size=batch, rows_per_chunk=chunk)
        outputs.append(read_out(out))
    for fmt in ("parquet", "jsonl"):  # a folder of shards, rows numbered across them
        shards = tmp_path / f"shards-{fmt}"
        shards.mkdir()
        for part, start in enumerate(range(0, 40, 15)):
            synthetic.write_rows(rows[start : start + 15], shards / f"part-{part}.{fmt}", row_group_size=4)
        predict_stage(str(tiny_base), str(shards), tmp_path / f"scores-{fmt}.parquet", rows_per_chunk=6)
        outputs.append(read_out(tmp_path / f"scores-{fmt}.parquet"))
    assert len(outputs[0]) == 40 and [o["row"] for o in outputs[0]] == list(range(40))
    for other in outputs[1:]:
        assert other == outputs[0]


def test_a_refused_row_keeps_the_reason_validation_gives_it(tiny_base, tmp_path):
    good = unlabelled_rows(2)
    rows = [good[0], *[row for row, _ in BAD_ROWS], good[1]]
    data = synthetic.write_rows(rows, tmp_path / "rows.jsonl")
    result = predict_stage(str(tiny_base), data, tmp_path / "scores.parquet", batch_size=4)
    out = read_out(tmp_path / "scores.parquet")
    assert [o["error"] for o in out] == [None, *[code for _, code in BAD_ROWS], None]
    assert result.scored == 2 and result.failed == {code: 1 for _, code in BAD_ROWS}
    for scored in out[1:-1]:
        assert scored["answers"] is None and scored["error_message"] and scored["tone.label"] is None
    for row, code in BAD_ROWS:
        if code == "too_few_options":
            continue  # a data row may hold one option; only the API refuses it
        gold = {qid: "a" for qid in row["questions"]} if isinstance(row["questions"], dict) else {"q": "a"}
        skipped = validate_rows([{**row, "gold": gold}]).report.skipped
        assert code == next(iter(skipped)), (code, skipped)


def test_labelled_rows_score_as_unlabelled_ones(tiny_base, tmp_path):
    rows = synthetic.generate_rows(6, seed=2)
    unlabelled = [{k: v for k, v in row.items() if k != "gold"} for row in rows]
    with_gold = predict_stage(
        str(tiny_base), synthetic.write_rows(rows, tmp_path / "a.jsonl"), tmp_path / "a.parquet"
    )
    without = predict_stage(
        str(tiny_base), synthetic.write_rows(unlabelled, tmp_path / "b.jsonl"), tmp_path / "b.parquet"
    )
    assert with_gold.scored == without.scored == 6
    assert read_out(tmp_path / "a.parquet") == read_out(tmp_path / "b.parquet")


def test_an_interrupted_run_leaves_no_file_and_keeps_the_old_one(tiny_base, tmp_path, monkeypatch):
    data = synthetic.write_rows(unlabelled_rows(10), tmp_path / "rows.jsonl")
    out = tmp_path / "scores.parquet"
    out.write_bytes(b"yesterday's scores")
    calls = []

    def interrupted_on_the_second_chunk(model, rows, batch_size):
        calls.append(len(rows))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(model, rows, batch_size)

    real = predict_module.answer_rows
    monkeypatch.setattr(predict_module, "answer_rows", interrupted_on_the_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        predict_stage(str(tiny_base), data, out, rows_per_chunk=4)
    assert calls == [4, 4]  # a chunk was written before the interruption
    assert out.read_bytes() == b"yesterday's scores" and sorted(p.name for p in tmp_path.iterdir()) == [
        "rows.jsonl",
        "scores.parquet",
    ]


def test_the_command_prints_a_summary_and_refuses_bad_input_with_exit_2(tiny_base, tmp_path, capsys):
    data = synthetic.write_rows(unlabelled_rows(3), tmp_path / "rows.jsonl")
    out = tmp_path / "scores.parquet"
    assert (
        main(["predict", "--model", str(tiny_base), "--data", str(data), "--out", str(out), "--json", "-q"])
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["rows"] == summary["scored"] == 3 and summary["rows_per_second"] > 0 and out.is_file()

    refusals = {
        "no such folder": ["--model", str(tmp_path / "nope"), "--data", str(data)],
        "no such file": ["--model", str(tiny_base), "--data", str(tmp_path / "missing.jsonl")],
        "not a model folder": ["--model", str(tmp_path), "--data", str(data)],
    }
    for words, flags in refusals.items():
        assert main(["predict", *flags, "--out", str(tmp_path / "never.parquet"), "-q"]) == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and words in error[0], (words, error)
    with pytest.raises(SystemExit) as refused:  # argparse: usage, then the one line
        main(
            [
                "predict",
                "--model",
                str(tiny_base),
                "--data",
                str(data),
                "--out",
                str(out),
                "--batch-size",
                "0",
            ]
        )
    assert refused.value.code == 2 and "--batch-size: '0': expected a whole number" in capsys.readouterr().err
    assert not (tmp_path / "never.parquet").exists()


def test_a_file_of_which_no_row_scores_says_why_and_exits_2(tiny_base, tmp_path, capsys):
    data = synthetic.write_rows([row for row, _ in BAD_ROWS[:3]], tmp_path / "rows.jsonl")
    out = tmp_path / "scores.parquet"
    assert main(["predict", "--model", str(tiny_base), "--data", str(data), "--out", str(out), "-q"]) == 2
    error = capsys.readouterr().err
    assert "no row" in error and "invalid_json 1" in error and "missing_state 1" in error
    assert [o["error"] for o in read_out(out)] == ["invalid_json", "missing_state", "missing_questions"]


def test_a_parquet_file_without_questions_is_refused_before_the_model_loads(tiny_base, tmp_path, monkeypatch):
    import pyarrow as pa

    data = tmp_path / "table.parquet"
    pq.write_table(pa.table({"text": ["a", "b"], "label": [0, 1]}), data)
    monkeypatch.setattr(predict_module, "load_decision_model", lambda folder: pytest.fail("model loaded"))
    with pytest.raises(predict_module.UnreadableInput, match="no column named questions"):
        predict_stage(str(tiny_base), data, tmp_path / "scores.parquet")
    assert orjson.dumps(sorted(p.name for p in tmp_path.iterdir())) == b'["table.parquet"]'


@pytest.fixture(scope="module")
def store(tiny_base, tmp_path_factory):
    """A store of the module's own where tiny_base is registered once as tiny-model, its champion (a
    registration loads the model and answers with it, and a fresh store migrates its tables: seconds each):
    (its URI, the version)."""
    from pipeline.mlops.registry import client, register_export

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        version = register_export(tiny_base, "tiny-model")
        client().set_registered_model_alias("tiny-model", "champion", version)
    return uri, version


@pytest.fixture
def champion(store, monkeypatch) -> str:
    """The module's store as the test's tracking store: the champion's version."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store[0])
    return store[1]


def test_a_registry_alias_scores_as_its_version_is_served(tiny_base, tmp_path, champion):
    version = champion
    rows = unlabelled_rows(3)
    data = synthetic.write_rows(rows, tmp_path / "rows.jsonl")
    result = predict_stage("models:/tiny-model@champion", data, tmp_path / "scores.parquet")
    assert result.model == f"tiny-model/{version}" and result.scored == 3
    out = read_out(tmp_path / "scores.parquet")
    assert [json.loads(o["answers"]) for o in out] == [served_answers(tiny_base, row) for row in rows]
    assert pq.read_schema(tmp_path / "scores.parquet").metadata[b"decision.model"] == result.model.encode()


def test_evaluate_scores_a_registered_version_as_its_folder(
    tiny_base, synthetic_train_file, champion, capsys
):
    # evaluate took a folder only, where predict and compare take models:/NAME@ALIAS too.
    version = champion
    capsys.readouterr()
    reports = {}
    for model in (str(tiny_base), "models:/tiny-model@champion"):
        assert (
            main(
                [
                    "evaluate",
                    "--model",
                    model,
                    "--data",
                    str(synthetic_train_file),
                    "--slice",
                    "0:40",
                    "--json",
                    "-q",
                ]
            )
            == 0
        )
        reports[model] = json.loads(capsys.readouterr().out)
    by_alias = reports["models:/tiny-model@champion"]
    assert (
        by_alias["served_as"] == f"tiny-model/{version}"
        and by_alias["model"] == "models:/tiny-model@champion"
    )
    assert by_alias["metrics"] == reports[str(tiny_base)]["metrics"]
    assert (
        main(["evaluate", "--model", "models:/tiny-model@nosuch", "--data", str(synthetic_train_file)]) == 2
    )
    assert "models:/tiny-model@nosuch" in capsys.readouterr().err


def test_a_terminated_command_exits_130_and_leaves_no_file(tiny_base, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    rows = unlabelled_rows(3) * 1000  # long enough to be stopped midway
    data = synthetic.write_rows(rows, tmp_path / "rows.jsonl")
    out = tmp_path / "scores.parquet"
    command = [
        sys.executable,
        "-m",
        "pipeline.cli",
        "predict",
        "--model",
        str(tiny_base),
        "--data",
        str(data),
        "--out",
        str(out),
        "-q",
    ]
    process = subprocess.Popen(
        command, cwd=Path(__file__).resolve().parents[2], stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".scores.parquet.*.partial")):
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 130
    assert "interrupted" in process.stderr.read()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl"]


def test_question_columns_come_from_the_first_readable_row_even_past_the_first_chunk(tiny_base, tmp_path):
    rows = [{"id": f"bad-{i}", "state": "", "questions": QUESTIONS} for i in range(7)] + unlabelled_rows(3)
    data = synthetic.write_rows(rows, tmp_path / "rows.jsonl")
    out = tmp_path / "scores.parquet"
    result = predict_stage(str(tiny_base), data, out, rows_per_chunk=3)  # chunks 1-2 hold no readable row
    scored = read_out(out)
    assert result.rows == 10 and [r["row_id"] for r in scored] == [row["id"] for row in rows]
    assert {"tone.label", "tone.confidence", "positive.label"} <= set(scored[0])
    assert all(r["tone.label"] is None for r in scored[:7]) and scored[7]["tone.label"] is not None


def test_two_runs_writing_one_out_stage_apart_and_the_file_is_one_runs_whole(
    tiny_base, tmp_path, monkeypatch
):
    import os
    import subprocess
    import sys

    out = tmp_path / "scores.parquet"
    inputs = {n: synthetic.write_rows(unlabelled_rows(n), tmp_path / f"rows{n}.jsonl") for n in (60, 20)}
    predict = ["predict", "--model", str(tiny_base), "--out", str(out), "-q"]
    other, rename = [], os.replace

    def rename_after_another_run(source, target):
        # This run's file is staged: another `decision predict` process writes the same OUT, start to end,
        # before this run renames its own in (runs started side by side overlapped only by chance, and a
        # second fresh process cost ~8 s of imports).
        if Path(source).name.startswith(f".{out.name}.") and not other:
            command = [sys.executable, "-m", "pipeline.cli", *predict, "--data", str(inputs[60])]
            root = Path(__file__).resolve().parents[2]
            other.append(subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300))
        rename(source, target)

    monkeypatch.setattr(os, "replace", rename_after_another_run)
    codes = [main([*predict, "--data", str(inputs[20])]), other[0].returncode]
    assert codes == [0, 0], other[0].stderr
    # Each run renamed its own complete file in: the last rename (this run's) wins, whole (a shared staging
    # file mixed them).
    assert len(read_out(out)) == 20 and not list(tmp_path.glob(".scores.parquet.*"))


@pytest.mark.parametrize("name", ["scores.csv", "scores.jsonl", "scores"])
def test_an_out_that_is_not_a_parquet_name_is_refused(name, tiny_base, tmp_path, capsys):
    data = synthetic.write_rows(unlabelled_rows(2), tmp_path / "rows.jsonl")
    assert (
        main(["predict", "--model", str(tiny_base), "--data", str(data), "--out", str(tmp_path / name)]) == 2
    )
    assert "the scores are written as Parquet; give a .parquet file" in capsys.readouterr().err
    assert not (tmp_path / name).exists()


def test_a_jsonl_row_is_read_as_the_api_reads_its_body(tiny_base, tmp_path):
    # A key given twice is refused, not its last value scored; an escaped unpaired surrogate keeps the row's
    # id and is the request's invalid_text (the API's 422s); messages name the row's fields, not an HTTP
    # body's.
    question = {"q": {"type": "noul", "instructions": "Positive?"}}
    data = tmp_path / "rows.jsonl"
    data.write_text(
        '{"id": "twice", "state": "one", "state": "two", "questions": ' + json.dumps(question) + "}\n"
        '{"id": "lone", "state": "bad \\ud800 text", "questions": ' + json.dumps(question) + "}\n"
        '{"id": "repeats", "state": "s", "questions": {"q": {"type": "choice", "criteria": ["a", "a"]}}}\n'
        '{"id": "fine", "state": "ok", "questions": ' + json.dumps(question) + "}\n"
    )
    predict_stage(str(tiny_base), data, tmp_path / "scores.parquet")
    refused = {r["row_id"]: (r["error"], r["error_message"]) for r in read_out(tmp_path / "scores.parquet")}
    assert refused["twice"] == (
        "invalid_json",
        "key 'state' is given twice in one JSON object; give each key once",
    )
    assert refused["lone"][0] == "invalid_text" and refused["lone"][1].startswith(
        "state: text holds an unpaired"
    )
    assert refused["repeats"][1].startswith("questions.q.criteria: ") and refused["fine"] == (None, None)
