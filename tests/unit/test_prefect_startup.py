"""The flows give Prefect's temporary API time to migrate a fresh home on a slow machine (make run on a fresh
clone failed at Prefect's 20 s default), and a caller's own setting wins."""

import os
import subprocess
import sys

SETTING = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"


def startup_timeout(env: dict[str, str]) -> str:
    code = f"import flows, os; print(os.environ['{SETTING}'])"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_flows_raise_the_temporary_api_startup_timeout():
    env = {k: v for k, v in os.environ.items() if k != SETTING}
    assert int(startup_timeout(env)) >= 120


def test_a_callers_own_startup_timeout_wins():
    assert startup_timeout({**os.environ, SETTING: "45"}) == "45"
