"""A flow run from the command line stops on Ctrl-C or SIGTERM within seconds, its temporary API with it, and
one that will not run (another process holds its run) ends in one line.

Without `PREFECT_API_URL`, Prefect starts a temporary API server as a child process in the caller's process
group, so a terminal's Ctrl-C stopped the API together with the flow: the flow then spent minutes retrying the
dead API to report its crash, said "Finished in state Running()" and exited 1. And SIGTERM (a scheduler,
`timeout`, `kill`) ended the process without its exit handlers, leaving the server running. Here the temporary
API starts in a session of its own (the same server Prefect would start, registered where Prefect looks for
it, as Prefect's test harness does), SIGTERM unwinds as Ctrl-C does, and the API stops at exit as Prefect
stops it (after its log and event workers have sent what they hold: stopped before them, they retried it for a
minute):

    with stoppable_run():
        summary = retrain(...)        # KeyboardInterrupt on Ctrl-C or SIGTERM: the caller says so, exit 130

    except RunBusy as error:          # in the flow: its state says why in one line, the caller gets `error`
        return refused(error)
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS
from prefect.states import Failed, State

from pipeline.interrupts import terminate_as_interrupt

EXIT_INTERRUPTED = 130


class _OwnSession(subprocess.Popen):
    """Popen whose child leads a session of its own: a terminal's Ctrl-C reaches the flow, not the server."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **{**kwargs, "start_new_session": True})


@contextmanager
def stoppable_run() -> Iterator[None]:
    """Run a flow with a temporary API that only this process stops (where no server is named), and SIGTERM as
    KeyboardInterrupt."""
    if not (PREFECT_API_URL.value() or os.environ.get("PREFECT_API_URL")):
        _start_temporary_api()
    with terminate_as_interrupt():
        yield


def _start_temporary_api() -> None:
    """Prefect's own temporary server, in a session of its own; its `start` registers its stop at exit."""
    # Imported here: the server's module sets up Prefect's server side, which a flow run by a worker (or
    # against a named API) must not have.
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # the instance Prefect's clients find under no port, started here first
    popen = subprocess.Popen
    subprocess.Popen = _OwnSession  # only while this one server starts: nothing else runs yet
    try:
        server.start(timeout=PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
    finally:
        subprocess.Popen = popen


def refused(error: Exception) -> State:
    """A flow's end where it refuses to run: Failed with `error`'s words, logged as one line where a raised
    error logged Prefect's traceback, and `error` raised again to the caller (which says it and exits 2)."""
    return Failed(message=str(error), data=error)
