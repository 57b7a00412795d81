"""Tables as users export them (spreadsheets, pandas, Parquet writers, `datasets`): labels with stray spaces
or leading zeros, wide score ranges, id columns, BOMs, "NA" text, non-UTF-8 bytes, JSON arrays, decimal and
duration columns, mixed-type ids and YAML 1.1 words. Each reads as the user meant, or is refused in one
line."""

import datetime
import decimal
import json
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.cli.main import main
from pipeline.data.mapping import MappingError, flags_mapping, load_mapping, read_mapped, write_rows
from pipeline.data.read import iter_tables
from pipeline.data.shards import BadSource


def mapped(path, label="label", state="text", **flags):
    return read_mapped(
        path, load_mapping(flags_mapping([state] if isinstance(state, str) else state, label, **flags))
    )[0]


def write_csv(tmp_path, text: str, name="table.csv", encoding="utf-8") -> str:
    path = tmp_path / name
    path.write_bytes(text.encode(encoding))
    return str(path)


def test_spaces_around_a_label_are_no_part_of_it(tmp_path):
    table = write_csv(tmp_path, "text,label\na,positive\nb, positive\nc,positive \nd,negative\n")
    rows = mapped(table)
    assert rows.mapping.questions["label"].options == ("negative", "positive")
    assert [g["label"] for g in rows.columns.gold] == ["positive", "positive", "positive", "negative"]


def test_a_scores_levels_are_read_by_value_and_a_choices_ids_keep_their_zeros(tmp_path):
    table = write_csv(tmp_path, "text,stars,zip\na,1,02134\nb, 2,2134\nc,03,02134\nd,+4,02134\n")
    score = mapped(table, "stars", type="score")
    assert score.mapping.questions["stars"].options == ("1", "2", "3", "4")
    assert [g["stars"] for g in score.columns.gold] == [0, 1, 2, 3]
    assert mapped(table, "zip").mapping.questions["zip"].options == ("02134", "2134")  # two zip codes
    given = mapped(table, "stars", type="score", options=["1", "02", "3", "4"])  # given levels read alike
    assert [g["stars"] for g in given.columns.gold] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("labels", "said"),
    [
        (["1", "3000000"], "span 1..3000000: 3,000,000 levels"),  # an amount or an id taken for a score
        (["0", "50", "100"], "span 0..100: 101 levels"),  # a percentage
        ([f"{i}.5" for i in range(12)], "are 12 different numbers: 12 levels"),
    ],
)
def test_a_score_with_more_levels_than_a_score_has_is_refused_in_one_line(labels, said, tmp_path):
    table = write_csv(tmp_path, "text,r\n" + "".join(f"t{i},{label}\n" for i, label in enumerate(labels)))
    with pytest.raises(MappingError, match=f"the labels of column 'r' {said}, and a score has at most 10"):
        mapped(table, "r", type="score")


def test_an_id_column_taken_for_a_choice_is_refused_in_one_line(tmp_path):
    table = write_csv(tmp_path, "text,label\n" + "".join(f"t{i},id{i}\n" for i in range(300)))
    with pytest.raises(
        MappingError, match="holds 300 different labels, and a choice has at most 255 options"
    ):
        mapped(table)


def test_a_csv_with_a_byte_order_mark_keeps_its_first_column_as_text(tmp_path):
    table = write_csv(tmp_path, "\ufeffid,text,label\r\n007,great,positive\r\n008,bad,negative\r\n")
    [read] = list(iter_tables(table))
    assert read.column("id").to_pylist() == ["007", "008"]


def test_na_and_null_in_a_csv_are_text_and_only_an_empty_cell_is_null(tmp_path):
    table = write_csv(tmp_path, "text,label\nNA,NA\nnull,positive\nn/a,\nNaN,negative\n")
    rows = mapped(table)
    assert rows.columns.state == ["NA", "null", "n/a", "NaN"]  # as the same rows written as JSONL read
    assert rows.columns.gold == [{"label": "NA"}, {"label": "positive"}, {}, {"label": "negative"}]


@pytest.mark.parametrize("where", ["first", "late"])
@pytest.mark.parametrize("suffix", ["csv", "jsonl"])
def test_a_file_that_is_not_utf8_is_refused_saying_save_it_as_utf8(where, suffix, tmp_path, capsys):
    good = ["text,label\n"] if suffix == "csv" else []
    line = (
        (lambda text, label: f"{text},{label}\n")
        if suffix == "csv"
        else (lambda text, label: json.dumps({"text": text, "label": label}, ensure_ascii=False) + "\n")
    )
    rows = [line(f"row {i} " + "x" * 200, "pos") for i in range(30_000 if where == "late" else 1)]
    path = tmp_path / f"latin.{suffix}"
    path.write_bytes("".join(good + rows).encode() + line("café", "neg").encode("cp1252"))
    code = main(["map", "--data", str(path), "--state-column", "text", "--label-column", "label"])
    [said] = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and said == (
        f"decision map: {path}: not UTF-8 text (a file saved as Latin-1 or Windows-1252?); "
        "save it as UTF-8 and read it again"
    )


def test_a_json_array_is_refused_saying_how_to_write_json_lines(tmp_path):
    path = tmp_path / "records.json"
    path.write_text(json.dumps([{"text": "a", "label": "x"}, {"text": "b", "label": "y"}], indent=2))
    with pytest.raises(BadSource, match=r"one JSON array, not JSON lines.*lines=True"):
        mapped(str(path))


@pytest.mark.parametrize("suffix", ["jsonl", "csv"])
def test_a_binary_file_named_as_text_is_refused_saying_what_it_is_without_quoting_its_bytes(
    suffix, tmp_path, capsys
):
    # The error quoted ~150 bytes of the binary file, and a Parquet file was "not UTF-8 (Latin-1?)".
    parquet, binary = tmp_path / f"table.{suffix}", tmp_path / f"blob.{suffix}"
    pq.write_table(pa.table({"text": ["a"], "label": ["x"]}), parquet)
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    for path, said in (
        (parquet, f"a Parquet file named .{suffix}; rename it .parquet"),
        (binary, f"binary, not {suffix.upper()} text (a NUL byte within its first 4 KiB)"),
    ):
        assert main(["validate", str(path)]) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"decision validate: {path}: {said}"), line


def test_a_line_that_is_not_json_has_no_cells_and_its_raw_text_is_no_label(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(
        '{"text": "a", "questions": "billing"}\n{"text": "b", "questions": "shipping"}\n'
        '{"text": "c", "questions": "billing"\n'
    )
    rows = mapped(str(path), "questions", question="topic")
    assert rows.mapping.questions["topic"].options == ("billing", "shipping")
    assert rows.columns.state == ["a", "b", None]  # counted as missing_state, not dropped


def test_decimal_duration_and_binary_columns_become_json_values_of_the_state(tmp_path):
    path = tmp_path / "orders.parquet"
    pq.write_table(
        pa.table(
            {
                "text": ["a", "b"],
                "amount": pa.array([decimal.Decimal("1.50"), decimal.Decimal("2.00")], pa.decimal128(10, 2)),
                "wait": pa.array([datetime.timedelta(hours=2), None], pa.duration("s")),
                "raw": pa.array([b"hi", b"\xff"], pa.binary()),
                "label": ["pos", "neg"],
            }
        ),
        path,
    )
    rows = mapped(str(path), state=["text", "amount", "wait", "raw"])
    assert rows.columns.state == [
        {"text": "a", "amount": 1.5, "wait": "2:00:00", "raw": "hi"},
        {"text": "b", "amount": 2.0, "wait": None, "raw": "\ufffd"},
    ]


def test_ids_of_mixed_types_are_written_to_parquet_as_text(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"id": 1, "text": "a", "label": "pos"}\n{"id": "B-2", "text": "b", "label": "neg"}\n')
    mapping = load_mapping({"state": "text", "id": "id", "questions": {"label": {"column": "label"}}})
    out = write_rows(read_mapped(str(path), mapping)[0], tmp_path / "out.parquet")
    assert pq.read_table(out).column("id").to_pylist() == ["1", "B-2"]


def test_yaml_1_1_words_in_a_mapping_stay_the_labels_written(tmp_path):
    table = write_csv(tmp_path, "text,label,code\na,yes,007\nb,no,010\nc,maybe,007\n")
    spec = tmp_path / "mapping.yaml"
    spec.write_text(
        "state: text\nquestions:\n  label: {column: label, options: [yes, no, maybe]}\n"
        "  code: {column: code, options: [007, 010]}\n"
        "  flag: {column: label, type: noul, options: {yes: it says yes, no: it says no}}\n"
    )
    mapping = load_mapping(str(spec))
    assert mapping.questions["label"].options == ("yes", "no", "maybe")
    assert mapping.questions["code"].options == ("007", "010")
    assert mapping.questions["flag"].descriptions == ("it says no", "it says yes")
    labels = replace(mapping, questions={"label": mapping.questions["label"]})
    assert [g["label"] for g in read_mapped(table, labels)[0].columns.gold] == ["yes", "no", "maybe"]


def test_a_datasets_class_label_column_reads_as_its_names(tmp_path):
    datasets = pytest.importorskip("datasets")
    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])}
    )
    rows = {"text": ["awful", "lovely", "unlabelled"], "label": [0, 1, -1]}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows, features=features)}).save_to_disk(
        tmp_path / "reviews"
    )
    read = mapped(str(tmp_path / "reviews"))
    # The names, as `datasets` shows them (int2str), not options "0" and "1"; -1 (no label) is a blank cell.
    assert read.mapping.questions["label"].options == ("neg", "pos")
    assert read.columns.gold == [{"label": "neg"}, {"label": "pos"}, {}]


def test_a_plain_table_without_a_mapping_and_a_mapping_that_is_not_yaml_say_what_to_do(tmp_path, capsys):
    table = write_csv(tmp_path, "text,label\na,x\n")
    assert main(["validate", table]) == 2
    said = capsys.readouterr().err.strip()
    assert said.endswith("for a plain table give --mapping FILE, or --state-column and --label-column")
    spec = tmp_path / "mapping.yaml"
    spec.write_text("state: text\nquestions:\n  label: {column: label\n")
    assert main(["map", "--data", table, "--mapping", str(spec)]) == 2
    [said] = capsys.readouterr().err.strip().splitlines()
    assert said.startswith(f"decision map: mapping {spec}: not YAML (") and f"in {spec}, line 3" in said
    assert "<unicode string>" not in said


def test_the_preview_writes_a_timestamp_as_the_trained_state_does(tmp_path, capsys):
    path = tmp_path / "events.parquet"
    pq.write_table(
        pa.table({"text": ["a"], "when": [datetime.datetime(2024, 1, 1, 12)], "label": ["x"]}), path
    )
    assert (
        main(["map", "--data", str(path), "--state-column", "text", "when", "--label-column", "label"]) == 0
    )
    assert '"when": "2024-01-01T12:00:00"' in capsys.readouterr().out  # orjson's form, not str()'s "12:00:00"


def test_shards_that_encode_the_same_values_apart_read_as_one_source(tmp_path):
    # pandas writes text as large_string, polars as string; a writer may dictionary-encode it; an all-null
    # column of one shard has the null type. The values are the same kind: one source, not "another schema".
    folder = tmp_path / "shards"
    folder.mkdir()
    pq.write_table(
        pa.table(
            {
                "text": pa.array(["a", "b"], pa.large_string()),
                "label": ["x", "y"],
                "note": pa.array([None, None], pa.null()),
            }
        ),
        folder / "part-0.parquet",
    )
    pq.write_table(
        pa.table(
            {
                "text": pa.array(["c"], pa.string()),
                "label": pa.array(["x"]).dictionary_encode(),
                "note": ["seen"],
            }
        ),
        folder / "part-1.parquet",
    )
    rows = mapped(str(folder), state=["text", "note"])
    assert [s["text"] for s in rows.columns.state] == ["a", "b", "c"]
    assert [s["note"] for s in rows.columns.state] == [None, None, "seen"]
    assert [g["label"] for g in rows.columns.gold] == ["x", "y", "x"]
    pq.write_table(pa.table({"text": [1], "label": ["x"], "note": ["n"]}), folder / "part-2.parquet")
    with pytest.raises(
        BadSource, match=r"shard part-2.parquet has another schema than part-0.parquet \(text is int64"
    ):
        mapped(str(folder))
