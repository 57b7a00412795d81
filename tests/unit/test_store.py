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
