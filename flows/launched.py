"""A flow module run as its own process by a `decision` command: the parameters in, the flow's result out, as
files, so no command line is built twice (`pipeline.cli.launch` is the other side).

    python -m flows.retrain REQUEST.json RESULT.json     # what `decision retrain` runs; not typed by hand

REQUEST holds the flow's parameters by name. The flow runs with a temporary API only this process stops, and
SIGTERM as Ctrl-C (`flows.interrupts`); its result (`to_dict()`, or the dict it returned) is written to RESULT
as strict JSON. Exit 0 with a result; 2 where the flow refused to run (another process drives the run, an
input the flow's own checks refused), its reason on stderr; 130 when interrupted.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flows.interrupts import EXIT_INTERRUPTED, stoppable_run
from pipeline.strict_json import to_json

EXIT_REFUSED = 2
USAGE = (
    "this module is a flow's own process, started by `decision {command}` (see `decision {command} --help`)"
)


def run_launched(
    flow: Callable[..., Any],
    command: str,
    refused: tuple[type[Exception], ...],
    interrupted: str,
    argv: list[str] | None = None,
) -> int:
    """Run `flow` on the request file named in `argv` and write its result beside; the exit code.

    `refused`: the errors that end the run in one line (exit 2); `interrupted`: what Ctrl-C or SIGTERM
    says."""
    files = sys.argv[1:] if argv is None else argv
    if len(files) != 2:
        print(USAGE.format(command=command), file=sys.stderr)
        return EXIT_REFUSED
    request, result = (Path(name) for name in files)
    try:
        with stoppable_run():
            outcome = flow(**json.loads(request.read_text()))
    except refused as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        print(f"{command}: interrupted; {interrupted}", file=sys.stderr)
        return EXIT_INTERRUPTED
    result.write_text(to_json(outcome.to_dict() if hasattr(outcome, "to_dict") else outcome))
    return 0
