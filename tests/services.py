"""Real services a test starts and stops itself: a PostgreSQL cluster from Debian's binaries and an MLflow
tracking server on it. Nothing here assumes a service is already running.

    with postgres_cluster() as pg:                         # initdb + pg_ctl start on a free port
        uri = pg.create_database("mlflow")                 # postgresql://decision:…@127.0.0.1:PORT/mlflow
        with mlflow_server(uri, tmp / "artifacts", tmp / "mlflow.log") as tracking:   # http://127.0.0.1:PORT
            ...

A test that needs PostgreSQL is marked `postgres` and skips, naming what is missing, where the binaries or
the driver are absent. As root, the cluster is created and run as the `postgres` user (PostgreSQL refuses to
run as root) in a folder that user owns.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from pipeline.stages.smoke import free_port
from tests.flows.processes import background, tail

PG_BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)  # the newest major first
PG_USER = "decision"
ROOT = Path(__file__).resolve().parents[1]


def postgres_bin() -> Path | None:
    """The folder holding `initdb` and `pg_ctl`: on PATH, else Debian's /usr/lib/postgresql/<major>/bin."""
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    return next((d for d in PG_BIN_DIRS if (d / "initdb").exists()), None)


def postgres_missing() -> str | None:
    """Why PostgreSQL tests cannot run here, or None when they can."""
    if postgres_bin() is None:
        return "PostgreSQL binaries (initdb, pg_ctl) not found: apt-get install postgresql"
    for module in ("psycopg", "asyncpg"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} not installed: pip install -e '.[postgres]'"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a `postgres` user to run PostgreSQL as"
    return None


def require_postgres() -> None:
    reason = postgres_missing()
    if reason:
        pytest.skip(reason)


@dataclass(frozen=True)
class Postgres:
    """A running cluster: TCP on loopback, password authentication, one superuser."""

    port: int
    password: str
    data: Path
    bin_dir: Path

    def uri(self, database: str, driver: str = "postgresql") -> str:
        return f"{driver}://{PG_USER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A fresh database; its `postgresql://` URI (SQLAlchemy 2.1 reads it with psycopg 3, as MLflow
        does)."""
        import psycopg

        # autocommit: CREATE DATABASE cannot run inside a transaction.
        with psycopg.connect(self.uri("postgres"), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.uri(name)

    def stop(self) -> None:
        """Stop the server now (a database that went down); the cluster is deleted on exit as usual."""
        with contextlib.suppress(RuntimeError):
            _run(
                _as_postgres_user(
                    [str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"]
                )
            )


def _as_postgres_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@contextlib.contextmanager
def postgres_cluster() -> Iterator[Postgres]:
    """initdb a throwaway cluster, start it on a free port, stop it and delete it on exit."""
    require_postgres()
    bin_dir = postgres_bin()
    # Outside pytest's tmp folders: those are private to root, and the server runs as `postgres`.
    root = Path(tempfile.mkdtemp(prefix="decision-pg-"))
    data, password = root / "data", secrets.token_hex(8)
    (root / "pw").write_text(password)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(root / "pw", "postgres")
    port = free_port()
    cluster = Postgres(port, password, data, bin_dir)
    try:  # a failed initdb or start removes the folder too
        _run(
            _as_postgres_user(
                [
                    str(bin_dir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    PG_USER,
                    "--auth=scram-sha-256",
                    f"--pwfile={root / 'pw'}",
                    "-E",
                    "UTF8",
                ]
            )
        )
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        _run(
            _as_postgres_user(
                [
                    str(bin_dir / "pg_ctl"),
                    "-D",
                    str(data),
                    "-l",
                    str(root / "server.log"),
                    "-o",
                    options,
                    "-w",
                    "-t",
                    "60",
                    "start",
                ]
            )
        )
        yield cluster
    finally:
        if (data / "postmaster.pid").exists():
            cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


@contextlib.contextmanager
def mlflow_server(
    backend_uri: str, artifacts: Path, log: Path, env: dict[str, str] | None = None
) -> Iterator[str]:
    """`mlflow server` on `backend_uri` with proxied artifacts in `artifacts`, one worker on a free loopback
    port; its URL once /health answers."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        backend_uri,
        "--artifacts-destination",
        str(artifacts),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    # No job runner: it starts more processes and is not used here (0.4 GB of memory instead of 2.4 GB,
    # measured).
    server_env = (env or dict(os.environ)) | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    url = f"http://127.0.0.1:{port}"
    with background(command, server_env, log) as server:
        wait_answers(f"{url}/health", server, log)
        yield url


def wait_answers(url: str, server: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, f"{server.args[:4]} exited ({server.returncode}):\n{tail(log)}"
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer in {timeout} s:\n{tail(log)}")


def prefect_env(home: Path, api: str | None = None, **extra: str) -> dict[str, str]:
    """This process's environment without its PREFECT_* settings (`make test` exports the project's home),
    with a private Prefect home (and API URL); telemetry off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONUNBUFFERED": "1"}
    return env | ({"PREFECT_API_URL": api} if api else {}) | extra


@contextlib.contextmanager
def prefect_server(database_url: str | None, home: Path) -> Iterator[str]:
    """`python -m flows.server` (`prefect server start`) on a free loopback port, its database at
    `database_url` (`postgresql+asyncpg://…`; None: SQLite in `home`); its API URL once healthy."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    database = {"PREFECT_API_DATABASE_CONNECTION_URL": database_url} if database_url else {}
    # flows.server: `prefect server start` once its database answers (docs/scale-out.md's command).
    command = [sys.executable, "-m", "flows.server", "--host", "127.0.0.1", "--port", str(port), "--no-ui"]
    api = f"http://127.0.0.1:{port}/api"
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    with background(command, prefect_env(home, PYTHONPATH=path, **database), home / "server.log") as server:
        wait_answers(f"{api}/health", server, home / "server.log")
        yield api
