"""Shared fixtures: the project root and small synthetic decision files."""

from pathlib import Path

import pytest

from pipeline import synthetic

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def project_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def synthetic_rows():
    return synthetic.generate_rows(120, seed=3, broken_every=6)


@pytest.fixture(scope="session", params=["jsonl", "parquet", "csv"])
def synthetic_file(request, tmp_path_factory, synthetic_rows) -> Path:
    path = tmp_path_factory.mktemp("synthetic") / f"rows.{request.param}"
    return synthetic.write_rows(synthetic_rows, path, row_group_size=16)
