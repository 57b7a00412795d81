"""Is the tracking store there? A preflight the retrain flow runs before any task, so a PostgreSQL that is
down or refuses (or a tracking server that does not answer) fails the run at once, naming the URI with its
password masked, instead of after training, when the run would be logged. `check_database` does the same for
any SQLAlchemy URI (the Prefect server's database, before `python -m flows.server` starts it).

    check_tracking_store("postgresql://mlflow:secret@db:5432/mlflow")   # TrackingStoreError: ... mlflow:***@db ...
    check_tracking_store("http://mlflow.internal:5000")                 # a query that reaches its database
    check_database("postgresql+asyncpg://prefect:secret@db/prefect", "Prefect database")

SQLite needs no check (the file is created on first use); other schemes are left to MLflow.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pipeline.masking import error_reason, mask_url

DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")
HTTP_SCHEMES = ("http", "https")
# Long enough for a loaded server, short enough that a dead one fails the run in seconds, not minutes.
TIMEOUT_S = 10.0


class TrackingStoreError(RuntimeError):
    """The tracking store named by MLFLOW_TRACKING_URI cannot be reached or refuses the connection."""


def check_tracking_store(uri: str, timeout: float = TIMEOUT_S) -> None:
    """Raise TrackingStoreError naming `uri` (masked) when its store does not answer a query."""
    scheme = urlsplit(uri).scheme.split("+")[0]
    try:
        if scheme in DATABASE_SCHEMES:
            _query_database(uri, timeout)
        elif scheme in HTTP_SCHEMES:
            _query_server(uri, timeout)
    except TrackingStoreError:
        raise
    except Exception as error:  # the driver's own error types differ per database; each is re-raised here
        raise TrackingStoreError(_message(uri, error)) from error


def check_database(uri: str, what: str, timeout: float = TIMEOUT_S) -> None:
    """Raise TrackingStoreError naming `what` and `uri` (masked) when the database refuses a connection."""
    try:
        _query_database(uri, timeout)
    except Exception as error:  # the driver's own error types differ per database; each is re-raised here
        raise TrackingStoreError(_message(uri, error, what)) from error


def _query_database(uri: str, timeout: float) -> None:
    import sqlalchemy

    # An async driver (asyncpg, as Prefect's server uses) is checked through the synchronous one.
    uri = uri.replace("+asyncpg", "").replace("+aiosqlite", "")
    engine = sqlalchemy.create_engine(
        uri, connect_args={"connect_timeout": int(timeout)}, poolclass=sqlalchemy.NullPool
    )
    try:
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text("SELECT 1"))
    finally:
        engine.dispose()


def _query_server(uri: str, timeout: float) -> None:
    """A search that the server answers from its backend store: its /health answers even when the database
    behind it is down."""
    import httpx

    url = f"{uri.rstrip('/')}/api/2.0/mlflow/experiments/search"
    response = httpx.post(url, json={"max_results": 1}, timeout=timeout)
    if response.status_code >= 400:
        raise TrackingStoreError(_message(uri, f"HTTP {response.status_code}: {response.text[:300]}"))


def _message(uri: str, error: object, what: str = "MLflow tracking store") -> str:
    reason = error_reason(error, uri)  # a driver's message may quote the URI it was given, password and all
    if what != "MLflow tracking store":
        return f"{what} {mask_url(uri)} is not reachable ({reason})"
    return (
        f"MLflow tracking store {mask_url(uri)} is not reachable ({reason}); start it, or point "
        "MLFLOW_TRACKING_URI at one that is (unset, it is the local SQLite store)"
    )
