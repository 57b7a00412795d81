"""`python -m flows.server` names a Prefect database that is down (password masked) and never starts the
server."""

import os
import subprocess
import sys
from pathlib import Path

from pipeline.stages.smoke import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_a_prefect_database_that_is_down_is_named_before_the_server_starts(tmp_path):
    url = f"postgresql+asyncpg://prefect:topsecret@127.0.0.1:{free_port()}/prefect"  # nothing listens there
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {
        "PREFECT_HOME": str(tmp_path),
        "PREFECT_API_DATABASE_CONNECTION_URL": url,
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-m", "flows.server", "--port", str(free_port()), "--no-ui"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert url.replace("topsecret", "***") in done.stderr and "topsecret" not in done.stderr
    assert "Prefect database (PREFECT_API_DATABASE_CONNECTION_URL)" in done.stderr
