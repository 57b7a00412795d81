"""The `batch-predict` flow scores as `decision predict` does, writes a dated file per run, and its shipped
deployment is scheduled but off."""

import datetime as dt

import pyarrow.parquet as pq
import yaml

from pipeline.cli.main import main
from pipeline.data import synthetic
from pipeline.data.mapping import load_mapping
from pipeline.stages.predict import predict_stage
from tests.flows.processes import record_launches


def test_the_flow_writes_the_dated_file_the_stage_writes(prefect_harness, tiny_base, tmp_path):
    from flows.batch_predict import batch_predict

    rows = [
        {k: v for k, v in row.items() if k != "gold"}
        for row in synthetic.generate_rows(12, seed=4, broken_every=5)
    ]
    data = synthetic.write_rows(rows, tmp_path / "rows.jsonl")
    summary = batch_predict(str(data), str(tiny_base), str(tmp_path / "scores-{date}.parquet"), batch_size=4)
    today = dt.datetime.now(dt.UTC).date().isoformat()
    assert summary["out"] == str(tmp_path / f"scores-{today}.parquet")
    assert summary["rows"] == 12 and 0 < summary["scored"] < 12 and summary["failed"]
    direct = predict_stage(str(tiny_base), data, tmp_path / "direct.parquet")
    assert pq.read_table(summary["out"]).equals(pq.read_table(direct.out))


def test_the_flow_reads_a_plain_table_through_its_mapping_parameter(prefect_harness, tiny_base, tmp_path):
    from flows.batch_predict import batch_predict

    data = tmp_path / "new.csv"
    data.write_text("text,channel\nthe order was late,email\n,chat\ngreat product,phone\n")
    mapping = {"state": "text", "questions": {"tone": {"column": "label", "options": ["bad", "good"]}}}
    summary = batch_predict(str(data), str(tiny_base), str(tmp_path / "flow.parquet"), mapping=mapping)
    assert summary["rows"] == 3 and summary["failed"] == {"missing_state": 1}
    direct = predict_stage(str(tiny_base), data, tmp_path / "direct.parquet", mapping=load_mapping(mapping))
    assert pq.read_table(summary["out"]).equals(pq.read_table(direct.out))


def test_the_shipped_deployment_is_scheduled_but_off(project_root):
    from flows.batch_predict import batch_predict

    shipped = yaml.safe_load((project_root / "prefect.yaml").read_text())
    deployment = next(d for d in shipped["deployments"] if d["name"] == "batch-predict")
    assert (
        deployment["entrypoint"] == "flows/batch_predict.py:batch_predict"
        and batch_predict.name == "batch-predict"
    )
    assert [s["active"] for s in deployment["schedules"]] == [False]
    assert set(deployment["parameters"]) <= set(batch_predict.parameters.properties)


def test_bad_input_is_one_line_and_exit_2_before_a_flow_run(tiny_base, tmp_path, capsys, monkeypatch):
    launched = record_launches(monkeypatch)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    data = synthetic.write_rows(synthetic.generate_rows(3, seed=4), tmp_path / "rows.jsonl")
    (tmp_path / "new.csv").write_text("text,y\nlate again,\n")
    out = ["--out", str(tmp_path / "scores.parquet")]
    refusals = {
        "no such folder": ["--data", str(data), "--model", str(tmp_path / "nope"), *out],
        "no MLflow store at": ["--data", str(data), "--model", "models:/nope/1", *out],
        "no such file": ["--data", str(tmp_path / "missing.jsonl"), "--model", str(tiny_base), *out],
        "a folder": ["--data", str(data), "--model", str(tiny_base), "--out", str(tmp_path)],
        "give a .parquet file": [
            "--data",
            str(data),
            "--model",
            str(tiny_base),
            "--out",
            str(tmp_path / "s.csv"),
        ],
        # A mapping whose options neither it nor the model gives: refused before the run, not in its
        # traceback.
        "take their options from the labels": [
            "--data",
            str(tmp_path / "new.csv"),
            "--model",
            str(tiny_base),
            *out,
            *("--state-column", "text"),
            *("--label-column", "y"),
        ],
        "lacks": [
            "--data",
            str(data),
            "--model",
            str(tiny_base),
            *out,
            *("--state-column", "text"),
            *("--label-column", "y"),
        ],
    }
    for words, flags in refusals.items():
        assert main(["predict", "--flow", *flags]) == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and error[0].startswith("decision predict: ") and words in error[0], (
            words,
            error,
        )
    assert not launched
    assert sorted(path.name for path in tmp_path.iterdir()) == ["new.csv", "rows.jsonl"]  # no store was made


def test_a_run_that_scores_no_row_is_exit_2_and_says_so(prefect_harness, tiny_base, tmp_path, capsys):
    data = synthetic.write_rows([{"id": "a", "state": "", "questions": {}}], tmp_path / "rows.jsonl")
    flags = ["--data", str(data), "--model", str(tiny_base), "--out", str(tmp_path / "s.parquet")]
    assert main(["predict", "--flow", *flags]) == 2
    said = capsys.readouterr()
    assert "refused: missing_questions 1" in said.out  # the reasons as words, not a Python dict
    assert said.err.strip().endswith(
        f"no row of {data} could be scored (missing_questions 1); each row's reason is in "
        f"{tmp_path / 's.parquet'}"
    )
