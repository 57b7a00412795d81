"""Shared fixtures: the project root and small synthetic decision files."""

from pathlib import Path

import pytest

from pipeline.data import synthetic

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


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> Path:
    """A tiny random decision model in the Laya layout, written by laya itself."""
    from tests.tiny import write_tiny_base

    return write_tiny_base(tmp_path_factory.mktemp("tiny") / "base")


@pytest.fixture(scope="session")
def synthetic_train_file(tmp_path_factory) -> Path:
    """Clean synthetic rows (all three question types) to train on."""
    return synthetic.write_rows(
        synthetic.generate_rows(160, seed=11), tmp_path_factory.mktemp("train") / "rows.jsonl"
    )
