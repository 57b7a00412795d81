"""Prefect flows: thin orchestration over the stage functions in `pipeline`."""

import os

# Without a server, a flow starts Prefect's temporary API, which migrates a fresh home's database first: on this
# 2-core machine that took longer than Prefect's 20 s default, and `make run` on a fresh clone failed before any
# task ("Timed out while attempting to connect to ephemeral Prefect API server"). A caller's own value wins.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
