"""The tracking-store preflight: passwords never shown, an unreachable store named, SQLite left alone."""

import pytest

from pipeline.masking import mask_url
from pipeline.mlops.store import TrackingStoreError, check_tracking_store
from pipeline.stages.smoke import free_port


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("postgresql://mlflow:s3cret@db:5432/mlflow", "postgresql://mlflow:***@db:5432/mlflow"),
        ("postgresql+asyncpg://u:p%40ss@db/prefect", "postgresql+asyncpg://u:***@db/prefect"),
        ("https://alice:token@mlflow.example.com/", "https://alice:***@mlflow.example.com/"),
        ("postgresql://mlflow@db/mlflow", "postgresql://mlflow@db/mlflow"),
        ("sqlite:///mlflow/mlflow.db", "sqlite:///mlflow/mlflow.db"),
    ],
)
def test_mask_uri_hides_only_the_password(uri, shown):
    assert mask_url(uri) == shown


def test_a_tracking_server_that_does_not_answer_is_named_with_its_password_masked():
    url = f"http://bob:hunter2@127.0.0.1:{free_port()}"  # nothing listens on a fresh free port
    with pytest.raises(TrackingStoreError) as raised:
        check_tracking_store(url, timeout=2)
    assert "bob:***@127.0.0.1" in str(raised.value) and "hunter2" not in str(raised.value)


def test_sqlite_and_other_schemes_need_no_service(tmp_path):
    check_tracking_store(f"sqlite:///{tmp_path}/absent/mlflow.db")  # created on first use: nothing to check
    check_tracking_store("databricks")


@pytest.mark.parametrize(
    "command",
    [
        ["promote", "3", "--name", "tickets"],
        ["rollback", "--name", "tickets"],
        ["serve", "--model", "models:/tickets@champion", "--port", "1"],
        ["predict", "--model", "models:/tickets/2", "--data", "rows.jsonl", "--out", "scores.parquet"],
    ],
)
def test_a_registry_lookup_where_the_sqlite_store_is_absent_says_so_and_makes_none(
    command, tmp_path, monkeypatch, capsys
):
    # Run outside the project folder, MLflow made an empty mlflow/mlflow.db there and said "not found".
    from pipeline.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "rows.jsonl").write_text('{"state": "late", "questions": {"q": {"type": "noul"}}}\n')
    assert main(command) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"no MLflow store at {tmp_path / 'mlflow' / 'mlflow.db'}" in err[0], err
    assert "MLFLOW_TRACKING_URI" in err[0] and not (tmp_path / "mlflow").exists()
