"""Every source kind reads the same rows as one file does: a folder or glob of Parquet or JSONL shards, a
hive-partitioned Parquet set, a `datasets` save_to_disk folder (a DatasetDict's splits too); slices cross
shard boundaries without reading the shards outside them; `iter_tables` streams any of them; bad sources are
one line and exit 2 from the CLI."""

import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.data import synthetic
from pipeline.data.read import BadSource, RowSlice, iter_tables, raw_columns, read_columns, read_slice
from pipeline.data.shards import Shard
from pipeline.data.sources import open_source

ROWS = 100
SHARD = 25  # four shards of 25 rows, Parquet row groups of 7: slices cut groups and shards alike


@pytest.fixture(scope="module")
def rows():
    return synthetic.generate_rows(ROWS, seed=5, broken_every=9)


@pytest.fixture(scope="module")
def sources(tmp_path_factory, rows):
    """The same rows as one file of each format and as every kind of sharded source."""
    root = tmp_path_factory.mktemp("sources")
    for fmt in ("parquet", "jsonl"):
        synthetic.write_rows(rows, root / f"one.{fmt}", row_group_size=7)
        for i in range(ROWS // SHARD):
            synthetic.write_rows(rows[i * SHARD : (i + 1) * SHARD], root / fmt / f"part-{i:02d}.{fmt}", 7)
    (root / "parquet" / "_SUCCESS").write_text("")  # what Spark leaves: not a shard
    return root


def _same(a, b) -> bool:
    return a.state == b.state and a.questions == b.questions and a.gold == b.gold


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
@pytest.mark.parametrize("row_slice", [RowSlice(), RowSlice(20, 60), RowSlice(24, 26), RowSlice(75, None)])
def test_a_folder_and_a_glob_of_shards_read_as_the_one_file(sources, fmt, row_slice):
    whole, total = read_columns(sources / f"one.{fmt}", row_slice)
    for source in (sources / fmt, f"{sources}/{fmt}/part-*.{fmt}"):
        sharded, sharded_total = read_columns(source, row_slice)
        assert sharded_total == total == ROWS and _same(sharded, whole)


def test_shards_outside_the_slice_are_never_read(sources, monkeypatch):
    asked = []
    real = Shard.batches

    def spy(self, *args, **kwargs):
        asked.append(self.path.name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Shard, "batches", spy)
    _, total = read_slice(sources / "parquet", RowSlice(30, 45))
    assert asked == ["part-01.parquet"] and total == ROWS  # the others counted from their footers
    asked.clear()
    list(iter_tables(sources / "parquet", 8, RowSlice(20, 30)))
    assert asked == ["part-00.parquet", "part-01.parquet"]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_iter_tables_gives_the_slice_in_fixed_size_tables_across_shards(sources, fmt):
    tables = list(iter_tables(sources / fmt, 30, RowSlice(10, 95)))
    assert [t.num_rows for t in tables] == [30, 30, 25]
    whole, _ = read_columns(sources / f"one.{fmt}", RowSlice(10, 95))
    streamed = [raw_columns(t) for t in tables]
    assert [q for c in streamed for q in c.questions] == whole.questions
    assert [g for c in streamed for g in c.gold] == whole.gold


def test_a_hive_partitioned_parquet_set_keeps_its_partition_columns(tmp_path):
    table = pa.table(
        {
            "state": [f"s{i}" for i in range(20)],
            "questions": ["{}"] * 20,
            "lang": ["en", "fr"] * 10,
            "year": [2024, 2025] * 10,
        }
    )
    pq.write_to_dataset(table, tmp_path / "events", partition_cols=["lang", "year"])
    source = open_source(tmp_path / "events")
    assert source.kind == "partitioned" and len(source.shards) == 2
    read, total = read_slice(tmp_path / "events", RowSlice(8, 13))
    rows = read.to_pylist()
    # Files in path order (lang=en/ first); partitions become typed columns of every row.
    assert total == 20 and [r["state"] for r in rows] == ["s16", "s18", "s1", "s3", "s5"]
    assert [r["lang"] for r in rows] == ["en", "en", "fr", "fr", "fr"] and read.schema.field(
        "year"
    ).type == pa.int32()
    columns, _ = read_columns(tmp_path / "events")
    assert len(columns) == 20


def test_a_saved_dataset_and_a_dataset_dict_read_as_the_file_they_came_from(sources, tmp_path):
    datasets = pytest.importorskip("datasets")
    dataset = datasets.Dataset.from_parquet(str(sources / "one.parquet"))
    dataset.save_to_disk(str(tmp_path / "saved"), num_shards=3)
    datasets.DatasetDict({"train": dataset, "test": dataset.select(range(10, 20))}).save_to_disk(
        str(tmp_path / "dict")
    )
    whole, _ = read_columns(sources / "one.parquet", RowSlice(30, 70))
    saved = open_source(tmp_path / "saved")
    assert saved.kind == "saved" and len(saved.shards) == 3 and saved.fmt == "arrow"
    assert _same(read_columns(tmp_path / "saved", RowSlice(30, 70))[0], whole)
    assert _same(read_columns(tmp_path / "dict", RowSlice(30, 70))[0], whole)  # `train` by default
    test, total = read_columns(f"{tmp_path}/dict:test")
    assert total == 10 and _same(test, read_columns(sources / "one.parquet", RowSlice(10, 20))[0])
    with pytest.raises(BadSource, match=r"no split 'dev'.*train, test"):
        open_source(f"{tmp_path}/dict:dev")


def test_bad_sources_are_refused_before_any_row_is_read(sources, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadSource, match=r"empty: no \.parquet or \.jsonl shards there"):
        open_source(tmp_path / "empty")
    with pytest.raises(BadSource, match="matches no file"):
        open_source(f"{tmp_path}/*.parquet")
    mixed = tmp_path / "mixed"
    synthetic.write_rows(synthetic.generate_rows(3), mixed / "a.parquet")
    synthetic.write_rows(synthetic.generate_rows(3), mixed / "b.jsonl")
    with pytest.raises(BadSource, match=r"mixes jsonl \(b.jsonl\) and parquet \(a.parquet\) shards"):
        open_source(mixed)
    (tmp_path / "csvs").mkdir()
    (tmp_path / "csvs" / "a.csv").write_text("state\nx\n")
    with pytest.raises(BadSource, match="shards must be Parquet or JSONL"):
        open_source(tmp_path / "csvs")


@pytest.mark.parametrize("shard", ["part-0.jsonl", "part-0.parquet"])
def test_a_json_description_beside_the_shards_is_no_shard(shard, tmp_path):
    # A pretty-printed info.json was read as JSON lines: its lines counted as rows (invalid_json), or beside
    # Parquet the folder was refused as mixed.
    folder = tmp_path / "data"
    synthetic.write_rows(synthetic.generate_rows(4), folder / shard)
    (folder / "info.json").write_text('{\n  "rows": 4,\n  "license": "CC0"\n}\n')
    opened = open_source(folder)
    assert [s.path.name for s in opened.shards] == [shard]
    assert read_columns(folder)[1] == 4
    spark = tmp_path / "spark"  # a folder of .json files alone is JSON lines
    synthetic.write_rows(synthetic.generate_rows(3), spark / "part-0.jsonl").rename(spark / "part-0.json")
    assert read_columns(spark)[1] == 3


def test_shards_whose_schemas_differ_are_refused_naming_the_shard_and_the_difference(tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    pq.write_table(pa.table({"state": ["a"], "questions": ["{}"], "gold": ["{}"]}), folder / "p0.parquet")
    pq.write_table(pa.table({"state": ["b"], "questions": ["{}"], "gold": [1]}), folder / "p1.parquet")
    pq.write_table(pa.table({"state": ["c"], "questions": ["{}"]}), folder / "p2.parquet")
    with pytest.raises(
        BadSource, match=r"shard p1\.parquet has another schema than p0\.parquet \(gold is int64"
    ):
        open_source(folder)
    (folder / "p1.parquet").unlink()
    with pytest.raises(BadSource, match=r"p2\.parquet .*no column gold"):
        open_source(folder)


def _decision(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_the_cli_says_one_line_and_exits_2_for_an_empty_folder_and_a_hub_id_offline(tmp_path, capsys):
    from pipeline.cli.main import main

    (tmp_path / "empty").mkdir()
    # In this process (a fresh one spends seconds importing the libraries): a fresh `decision validate`'s one
    # line, with nothing else on stderr, is the offline Hub id's below and the unreachable Hub's test's.
    assert main(["validate", str(tmp_path / "empty")]) == 2
    done = capsys.readouterr()
    assert done.out == ""
    assert done.err.strip().splitlines() == [
        f"decision validate: {tmp_path / 'empty'}: no .parquet or .jsonl shards there; put the data files in "
        "it or name a file"
    ]
    pytest.importorskip("datasets")
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    done = _decision("validate", "hf:nobody/no-such-set:train", env=offline)
    lines = [line for line in done.stderr.strip().splitlines() if line.startswith("decision validate:")]
    assert done.returncode == 2 and len(lines) == 1
    assert "hf:nobody/no-such-set:train: cannot load it from the Hugging Face Hub" in lines[0]
    assert "save_to_disk(FOLDER)` and pass FOLDER" in lines[0]


def test_an_empty_cell_of_a_one_column_csv_stays_a_row(tmp_path):
    table = tmp_path / "notes.csv"
    table.write_text("text\nfirst\n\nthird\n")  # what a CSV writer makes of ["first", None, "third"]
    [read] = list(iter_tables(table))
    assert read.column("text").to_pylist() == ["first", None, "third"]


@pytest.mark.parametrize("first", [True, False])
def test_a_row_too_long_to_stream_is_named_as_such_not_as_a_bad_file(tmp_path, first):
    path = tmp_path / "long.csv"
    rows = ["a,x"] * (0 if first else 10) + ["b" * 12_000_000 + ",y", "c,x"]
    path.write_text("text,label\n" + "\n".join(rows) + "\n")
    with pytest.raises(BadSource, match="a row \\(line\\) too long to read in blocks of 4 MiB"):
        read_slice(path)


def test_a_hub_id_where_the_hub_cannot_be_reached_is_one_line_at_once(tmp_path):
    pytest.importorskip("datasets")
    closed = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}  # port 9: nothing listens
    done = _decision("validate", "hf:nobody/no-such-set:train", env=closed)
    # One line, not a retry per attempt before it: the Hub is not tried once its endpoint takes no connection.
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(
        "decision validate: hf:nobody/no-such-set:train: the Hugging Face Hub cannot be "
        "reached from here (127.0.0.1:9: "
    )
    assert "set HF_HUB_OFFLINE=1" in done.stderr
