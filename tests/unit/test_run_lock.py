"""One process runs a run at a time: two retrains of one key shared its checkpoint and MLflow run, and the
second crashed reading the checkpoint the first was writing."""

import pytest

from pipeline.rundir import RunBusy, RunFolder


def test_a_second_driver_of_a_run_is_refused_at_once_and_the_lock_goes_with_the_first(tmp_path):
    run = RunFolder(tmp_path / "runs" / "3f2a")
    busy = r"another process is running this run \(.*run.lock is locked\)"
    with run.driven(), pytest.raises(RunBusy, match=busy), run.driven():
        pass
    with run.driven():  # released: the next run may go
        assert (run.root / "run.lock").read_text().isdigit()
