"""`python -m pipeline.cli ...` runs the `decision` command (what the smoke test starts a server with)."""

import sys

from pipeline.cli.main import main

sys.exit(main())
