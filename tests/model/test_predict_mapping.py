"""Batch scoring of a plain table through a mapping (`decision predict --mapping` / the mapping flags): it
scores as the decision rows `decision map --write` gives, for both families; unlabelled tables take their
options from the mapping or from the options the model records it trained with, else exit 2; a missing column
exits 2 before any scoring and leaves no file; a folder of shards scores as the one file."""

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from pipeline.cli.main import main
from pipeline.data.answers import parse_request
from pipeline.data.mapping import load_mapping
from pipeline.families import load_decision_model, pick_family
from pipeline.families.base import Answered
from pipeline.families.exporting import MANIFEST
from pipeline.lineage import MAPPING_OPTIONS
from pipeline.scoring.calibrators import Calibrator
from pipeline.stages import predict as predict_module
from pipeline.stages.predict import predict_stage
from tests.tiny import load_joint_on

CALIBRATOR = Calibrator(temperatures=(2.0, 0.6, 1.7))
TICKETS = [
    {
        "id": "t1",
        "text": "the order was late",
        "channel": "email",
        "team": "shipping",
        "urgency": 3,
        "refund": "yes",
    },
    {
        "id": "t2",
        "text": "charged twice, terrible",
        "channel": "phone",
        "team": "billing",
        "urgency": 2,
        "refund": "no",
    },
    {"id": "t3", "text": None, "channel": None, "team": "shipping", "urgency": 1, "refund": "Yes"},
    {"id": "t4", "text": "great product", "channel": "chat", "team": None, "urgency": 0, "refund": None},
    {"id": "t5", "text": "bad, hate it", "channel": "email", "team": "billing", "urgency": 1, "refund": "1"},
]
LABELS = ("team", "urgency", "refund")
MAPPING = {
    "state": ["text", "channel"],
    "id": "id",
    "questions": {
        "department": {
            "column": "team",
            "instructions": "Which team?",
            "options": ["shipping", "billing", "product"],
        },
        "urgency": {"column": "urgency", "type": "score", "instructions": "How urgent?"},
        "wants_refund": {"column": "refund", "type": "noul", "instructions": "Money back?"},
    },
}
TRAINED = {"department": ["shipping", "billing", "product"], "urgency": ["0", "1", "2", "3"]}


def with_options(export: Path, folder: Path, options: dict | None) -> Path:
    """A copy of `export` whose manifest records `options` as a model trained through a mapping does (None:
    the manifest of a model trained on decision rows)."""
    shutil.copytree(export, folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest.pop(MAPPING_OPTIONS, None)
    (folder / MANIFEST).write_text(json.dumps(manifest | ({MAPPING_OPTIONS: options} if options else {})))
    return folder


@pytest.fixture(scope="module", params=["laya", "joint"])
def export(request, tiny_base, tmp_path_factory) -> Path:
    """A calibrated export of each family on the tiny base, recording the options it was trained with."""
    folder = tmp_path_factory.mktemp(request.param) / "export"
    if request.param == "laya":
        family = pick_family(tiny_base)
        family.export(family.load(tiny_base), folder, CALIBRATOR, {MAPPING_OPTIONS: TRAINED})
    else:
        family, loaded = load_joint_on(tiny_base)
        family.export(loaded, folder, CALIBRATOR, {MAPPING_OPTIONS: TRAINED})
    return folder


@pytest.fixture(scope="module")
def laya_export(tiny_base, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("laya") / "export"
    family = pick_family(tiny_base)
    family.export(family.load(tiny_base), folder, CALIBRATOR, {MAPPING_OPTIONS: TRAINED})
    return folder


def write_table(rows: list[dict], path: Path) -> Path:
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=2)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    else:
        pa_csv.write_csv(pa.Table.from_pylist(rows), path)
    return path


def unlabelled(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in LABELS} for row in rows]


def read_out(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_mapped_table_scores_as_the_rows_decision_map_writes(export, tmp_path, capsys, suffix):
    table = write_table(TICKETS, tmp_path / f"tickets{suffix}")
    (tmp_path / "m.json").write_text(json.dumps(MAPPING))
    mapping = ["--mapping", str(tmp_path / "m.json")]
    assert (
        main(["map", "--data", str(table), *mapping, "--write", str(tmp_path / "rows.jsonl"), "--json"]) == 0
    )
    capsys.readouterr()
    rows = predict_stage(str(export), tmp_path / "rows.jsonl", tmp_path / "rows.parquet", batch_size=2)
    common = ["predict", "--model", str(export), "--batch-size", "2", "-q", "--json"]
    assert main([*common, "--data", str(table), "--out", str(tmp_path / "table.parquet"), *mapping]) == 0
    assert json.loads(capsys.readouterr().out)["scored"] == rows.scored == 4
    by_table, by_rows = read_out(tmp_path / "table.parquet"), read_out(tmp_path / "rows.parquet")
    assert by_table == by_rows
    assert [o["row_id"] for o in by_table] == ["t1", "t2", "t3", "t4", "t5"]
    assert [o["error"] for o in by_table] == [
        None,
        None,
        "missing_state",
        None,
        None,
    ]  # kept, with its reason
    assert {json.dumps(sorted(json.loads(o["answers"]))) for o in by_table if o["answers"]} == {
        '["department", "urgency", "wants_refund"]'
    }


def test_an_unlabelled_table_takes_its_options_from_the_mapping(laya_export, tmp_path, capsys):
    plain = with_options(
        laya_export, tmp_path / "plain-export", None
    )  # records no options: the flags give them
    table = write_table([{"channel": r["channel"], "text": r["text"]} for r in TICKETS], tmp_path / "new.csv")
    out = tmp_path / "scores.parquet"
    flags = [
        "--state-column",
        "text",
        "--label-column",
        "team",
        "--question",
        "department",
        "--instructions",
        "Which team?",
        "--options",
        "shipping",
        "billing",
        "product",
    ]
    assert (
        main(["predict", "--model", str(plain), "--data", str(table), "--out", str(out), "-q", *flags]) == 0
    )
    scored = read_out(out)
    assert [o["row_id"] for o in scored] == ["0", "1", "2", "3", "4"]  # no id column: the row's index
    assert [o["error"] for o in scored] == [None, None, "missing_state", None, None]
    question = {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": ["shipping", "billing", "product"],
    }
    model = load_decision_model(plain)
    for row, o in zip(TICKETS, scored):
        if o["error"] is None:
            [served] = model.answer([parse_request(row["text"], {"department": question})])
            assert isinstance(served, Answered) and json.loads(o["answers"]) == served.answers
            assert o["department.label"] in question["criteria"]


def test_options_from_the_labels_come_from_the_model_or_exit_2_before_scoring(laya_export, tmp_path, capsys):
    table = write_table(unlabelled(TICKETS), tmp_path / "new.jsonl")  # no team, urgency or refund column
    (tmp_path / "m.json").write_text(json.dumps(MAPPING))
    args = ["--data", str(table), "--mapping", str(tmp_path / "m.json"), "-q"]
    out = tmp_path / "scores.parquet"
    assert main(["predict", "--model", str(laya_export), "--out", str(out), *args]) == 0
    answers = [json.loads(o["answers"]) for o in read_out(out) if o["answers"]]
    assert answers and all(list(a["urgency"]["probabilities"]) == ["0", "1", "2", "3"] for a in answers)

    plain = with_options(laya_export, tmp_path / "plain-export", None)
    never = tmp_path / "never.parquet"
    assert main(["predict", "--model", str(plain), "--out", str(never), *args]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "'urgency' (labels in column 'urgency')" in error[0], error
    assert "list them in the mapping" in error[0] and "department" not in error[0]  # given options suffice
    assert not never.exists() and not list(tmp_path.glob("*.partial"))


def test_a_mapped_score_is_labelled_as_the_table_labels_it(laya_export, tmp_path):
    # Star ratings 1..4 are levels 0..3 to the model (and in `answers`, as served); the `.label` column says
    # 1..4.
    rated = with_options(laya_export, tmp_path / "rated", TRAINED | {"urgency": ["1", "2", "3", "4"]})
    table = write_table(unlabelled(TICKETS), tmp_path / "new.jsonl")
    (tmp_path / "m.json").write_text(json.dumps(MAPPING))
    out = tmp_path / "scores.parquet"
    assert (
        main(
            [
                "predict",
                "--model",
                str(rated),
                "--data",
                str(table),
                "--mapping",
                str(tmp_path / "m.json"),
                "--out",
                str(out),
                "-q",
            ]
        )
        == 0
    )
    scored = [o for o in read_out(out) if o["answers"]]
    assert scored
    for o in scored:
        level = json.loads(o["answers"])["urgency"]["probabilities"]
        assert o["urgency.label"] == str(int(max(level, key=level.get)) + 1)
        assert o["department.label"] in ("shipping", "billing", "product")


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".jsonl"])
def test_a_column_the_table_lacks_exits_2_before_the_model_loads(
    laya_export, tmp_path, capsys, monkeypatch, suffix
):
    table = write_table(unlabelled(TICKETS), tmp_path / f"new{suffix}")
    out = tmp_path / "scores.parquet"
    monkeypatch.setattr(predict_module, "load_decision_model", lambda folder: pytest.fail("model loaded"))
    for flags, column in (
        (["--state-column", "body"], "'body'"),
        (["--state-column", "text", "channel", "tone"], "'tone'"),
    ):
        args = ["predict", "--model", str(laya_export), "--data", str(table), "--out", str(out), "-q"]
        assert main([*args, *flags, "--label-column", "team", "--options", "a", "b"]) == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and f"names column(s) {column} that the table lacks" in error[0], error
        assert "text" in error[0].split("its columns:")[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"new{suffix}"]


def test_new_rows_without_the_mapping_s_id_column_are_keyed_by_their_index_saying_so(laya_export, tmp_path):
    rows = [{k: v for k, v in row.items() if k != "id"} for row in unlabelled(TICKETS)]
    table = write_table(rows, tmp_path / "new.csv")
    said: list[str] = []
    out = tmp_path / "scores.parquet"
    predict_stage(str(laya_export), table, out, mapping=load_mapping(MAPPING), report=said.append)
    assert [o["row_id"] for o in read_out(out)] == ["0", "1", "2", "3", "4"]
    assert any("has no id column 'id': each row is keyed by its index" in line for line in said)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_folder_of_shards_scores_as_the_one_file(laya_export, tmp_path, fmt):
    rows = unlabelled(TICKETS) * 4
    rows = [row | {"id": f"r{i}"} for i, row in enumerate(rows)]
    mapping = load_mapping(MAPPING)
    one = predict_stage(
        str(laya_export),
        write_table(rows, tmp_path / f"all.{fmt}"),
        tmp_path / "one.parquet",
        mapping=mapping,
    )
    shards = tmp_path / "shards"
    shards.mkdir()
    for part, start in enumerate(range(0, len(rows), 7)):
        write_table(rows[start : start + 7], shards / f"part-{part}.{fmt}")
    many = predict_stage(
        str(laya_export),
        str(shards),
        tmp_path / "many.parquet",
        mapping=mapping,
        rows_per_chunk=3,
        batch_size=2,
    )
    assert one.rows == many.rows == 20 and one.failed == many.failed == {"missing_state": 4}
    assert read_out(tmp_path / "one.parquet") == read_out(tmp_path / "many.parquet")


def test_a_run_config_gives_the_mapping_decision_init_recorded(laya_export, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("{}\n")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "tickets.mapping.yaml").write_text(json.dumps(MAPPING))
    (tmp_path / "configs" / "tickets.yaml").write_text(
        "retrain: {model_name: tickets}\nvalidate: {mapping: configs/tickets.mapping.yaml}\n"
    )
    table = write_table(unlabelled(TICKETS), tmp_path / "new.parquet")
    args = ["predict", "--model", str(laya_export), "--data", str(table), "-q"]
    assert main([*args, "--run-config", "tickets", "--out", "by-run.parquet"]) == 0
    assert main([*args, "--mapping", "configs/tickets.mapping.yaml", "--out", "by-flag.parquet"]) == 0
    assert read_out(tmp_path / "by-run.parquet") == read_out(tmp_path / "by-flag.parquet")
    assert [o["row_id"] for o in read_out(tmp_path / "by-run.parquet")] == ["t1", "t2", "t3", "t4", "t5"]
    capsys.readouterr()
    assert main([*args, "--run-config", "nope", "--out", "never.parquet"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "--run-config nope" in error[0] and not (tmp_path / "never.parquet").exists()
    assert main(["predict", "--data", str(table), "--out", "never.parquet", "-q"]) == 2
    assert "--run-config NAME" in capsys.readouterr().err and not (tmp_path / "never.parquet").exists()


@pytest.mark.parametrize("family", ["laya", "joint"])
def test_train_then_export_keeps_the_options_a_mapped_table_trained_with(tiny_base, tmp_path, capsys, family):
    """`decision train` on a mapped table, then `decision export --adapter`: the export's manifest records the
    options, so an unlabelled table scores with no options in the mapping."""
    rows = [row | {"id": f"{row['id']}-{i}"} for i in range(8) for row in TICKETS]
    table = write_table(rows, tmp_path / "tickets.csv")
    labelled = {
        **MAPPING,
        "questions": {"urgency": MAPPING["questions"]["urgency"]},
    }  # options from the labels
    (tmp_path / "m.json").write_text(json.dumps(labelled))
    method = ["--method", "lora"] if family == "laya" else ["--method", "head"]
    train = [
        "train",
        "--data",
        str(table),
        "--mapping",
        str(tmp_path / "m.json"),
        "--base",
        str(tiny_base),
        "--family",
        family,
        *method,
        "--max-steps",
        "1",
        "--out",
        str(tmp_path / "ft"),
        "-q",
    ]
    assert main(train) == 0
    assert main(["export", "--adapter", str(tmp_path / "ft"), "--out", str(tmp_path / "export")]) == 0
    manifest = json.loads((tmp_path / "export" / MANIFEST).read_text())
    assert manifest[MAPPING_OPTIONS] == {"urgency": ["0", "1", "2", "3"]}
    new = write_table(unlabelled(TICKETS), tmp_path / "new.jsonl")
    out = tmp_path / "scores.parquet"
    predict = [
        "predict",
        "--model",
        str(tmp_path / "export"),
        "--data",
        str(new),
        "--mapping",
        str(tmp_path / "m.json"),
        "--out",
        str(out),
        "-q",
    ]
    assert main(predict) == 0
    answers = [json.loads(o["answers"]) for o in read_out(out) if o["answers"]]
    assert answers and all(list(a["urgency"]["probabilities"]) == ["0", "1", "2", "3"] for a in answers)
