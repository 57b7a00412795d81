"""Prefect flows: thin orchestration over the stage functions in `pipeline`."""

import os

# Without a server, a flow starts Prefect's temporary API, which migrates a fresh home's database first: on
# this 2-core machine that took longer than Prefect's 20 s default, and `make run` on a fresh clone failed
# before any task ("Timed out while attempting to connect to ephemeral Prefect API server"). A caller's own
# value wins.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
# The temporary server's telemetry heartbeat writes to the same SQLite file as the flow run, and on a busy
# machine it printed "database is locked" tracebacks between a flow's lines (`decision retrain` run by hand;
# `make` and `decision` turn it off too).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
