"""One process at a time: an exclusive lock on a file for as long as a process holds it (released if it dies).

with held_exclusively(Path("runs/3f2a/run.lock"), lambda: RunBusy("another process is running it")):
    ...                                             # a second process gets RunBusy at once, not a wait
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def held_exclusively(path: Path, busy: Callable[[], Exception]) -> Iterator[None]:
    """Hold `path` locked (made with its folder where missing, holding this process's id); `busy()` is raised
    at once where another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise busy() from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
