"""SIGTERM (a scheduler, `timeout` or `kill` stopping the job) unwinds as Ctrl-C does, so a command or a
flow's process cleans up as it would on Ctrl-C: no partial file left, its run marked as it ended.

    with terminate_as_interrupt():
        write_every_row()        # KeyboardInterrupt on SIGTERM too
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt in the main thread while this is held; the previous handler after."""

    def interrupt(number, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
