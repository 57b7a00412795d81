"""Arrow-range slicing: the same rows from every format, clear errors for bad slices and unreadable files."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.data.read import BadSlice, RowSlice, UnreadableInput, read_columns
from pipeline.data.validate import validate_file


def test_slice_returns_exactly_the_requested_rows(synthetic_file, synthetic_rows):
    columns, total = read_columns(synthetic_file, RowSlice(30, 47))
    assert total == len(synthetic_rows)
    assert len(columns) == 17
    whole, _ = read_columns(synthetic_file)
    assert columns.questions == whole.questions[30:47]


def test_every_format_gives_the_same_report(tmp_path, synthetic_rows):
    from pipeline.data import synthetic

    reports = [
        validate_file(synthetic.write_rows(synthetic_rows, tmp_path / f"r.{fmt}"), RowSlice(5, 90)).report
        for fmt in ("jsonl", "parquet", "csv")
    ]
    assert reports[0].skipped == reports[1].skipped == reports[2].skipped
    assert reports[0].kept == reports[1].kept == reports[2].kept
    assert reports[0].examples["invalid_json"]["row"] >= 5  # rows are numbered in the file, not the slice


def test_parquet_reads_only_overlapping_row_groups(tmp_path):
    path = tmp_path / "groups.parquet"
    pq.write_table(pa.table({"questions": [str(i) for i in range(100)]}), path, row_group_size=10)
    columns, total = read_columns(path, RowSlice(25, 32))
    assert total == 100 and columns.questions == [str(i) for i in range(25, 32)]


@pytest.mark.parametrize("text", ["5:5", "9:3", "-1:4", "abc", "3"])
def test_malformed_slices_are_refused(text):
    with pytest.raises(BadSlice):
        RowSlice.parse(text)


def test_out_of_range_slice_is_a_clear_error(synthetic_file):
    with pytest.raises(BadSlice, match="selects no rows"):
        read_columns(synthetic_file, RowSlice(10_000, 10_010))


def test_open_ended_slice_reads_to_the_end(synthetic_file, synthetic_rows):
    columns, _ = read_columns(synthetic_file, RowSlice.parse("100:"))
    assert len(columns) == len(synthetic_rows) - 100


def test_unreadable_inputs(tmp_path):
    with pytest.raises(UnreadableInput, match="no such file"):
        read_columns(tmp_path / "missing.jsonl")
    (tmp_path / "blob.bin").write_bytes(b"\x89PNG\r\n")
    with pytest.raises(UnreadableInput, match="unknown table format"):
        read_columns(tmp_path / "blob.bin")
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(UnreadableInput, match="not a decision table"):
        read_columns(tmp_path / "other.csv")
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(UnreadableInput):
        read_columns(tmp_path / "broken.parquet")
