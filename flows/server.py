"""`prefect server start`, after checking its database: a PostgreSQL that is down or refuses is named
(password masked) in one line, instead of the server's 185-line start-up traceback that does not name it.

    PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://prefect:PASSWORD@db:5432/prefect \\
      python -m flows.server --host 0.0.0.0 --port 4200        # any `prefect server start` arguments

Without PREFECT_API_DATABASE_CONNECTION_URL (SQLite in PREFECT_HOME) there is nothing to check.
"""

from __future__ import annotations

import os
import sys

from pipeline.mlops.store import TrackingStoreError, check_database

DATABASE_SETTING = "PREFECT_API_DATABASE_CONNECTION_URL"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if url := os.environ.get(DATABASE_SETTING):
        try:
            check_database(url, f"Prefect database ({DATABASE_SETTING})")
        except TrackingStoreError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    os.execv(sys.executable, [sys.executable, "-m", "prefect", "server", "start", *args])
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main())
