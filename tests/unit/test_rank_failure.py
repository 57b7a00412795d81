"""Which rank a failed data-parallel run blames, read from torchrun's failure record."""

from pipeline.training.launch import describe_failure

# torchrun's record from a CI run where rank 1 was SIGKILLed and rank 0, stopped with SIGTERM, was observed
# first.
KILLED_BUT_OBSERVED_SECOND = """\
============================================================
pipeline.stages.train_ranks FAILED
------------------------------------------------------------
Failures:
[0]:
  time      : 2026-12-04_11:45:35
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 17107)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 17107
------------------------------------------------------------
Root Cause (first observed failure):
[1]:
  time      : 2026-12-04_11:45:34
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 17106)  (SIGTERM)
  error_file: /tmp/torchelastic/error.json
  traceback : Traceback (most recent call last):
    File "pipeline/stages/train_ranks.py", line 78, in main
  RuntimeError: Connection reset by peer
============================================================""".splitlines()

A_RANKS_OWN_ERROR = """\
============================================================
pipeline.stages.train_ranks FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-04_11:45:34
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 17106)
  error_file: /tmp/torchelastic/error.json
  traceback : Traceback (most recent call last):
    File "pipeline/stages/train_ranks.py", line 78, in main
  ValueError: a shard holds no rows
============================================================""".splitlines()


def test_a_rank_killed_by_a_signal_is_blamed_even_when_torchrun_saw_its_peer_fail_first():
    message = describe_failure(["some rank output", *KILLED_BUT_OBSERVED_SECOND], -9, 2)
    assert message.startswith(
        "data-parallel training on 2 ranks failed: rank 1 (local_rank: 1) (exit code -9"
    )
    assert "SIGKILL" in message.splitlines()[0]


def test_a_ranks_own_error_is_blamed_as_torchrun_s_root_cause():
    first = describe_failure(A_RANKS_OWN_ERROR, 1, 2).splitlines()[0]
    assert first.startswith("data-parallel training on 2 ranks failed: rank 1 (local_rank: 1) (exit code 1")
    assert first.endswith("ValueError: a shard holds no rows")


def test_peers_stopped_by_torchrun_s_sigterm_are_not_blamed():
    peer = ["[1]:", "  rank      : 0 (local_rank: 0)", "  exitcode  : -15 (pid: 1)  (SIGTERM)"]
    at = A_RANKS_OWN_ERROR.index("  <NO_OTHER_FAILURES>")
    record = [*A_RANKS_OWN_ERROR[:at], *peer, *A_RANKS_OWN_ERROR[at + 1 :]]
    assert (
        ": rank 1 (local_rank: 1) (exit code 1 (pid: 17106))"
        in describe_failure(record, 1, 2).splitlines()[0]
    )


def test_a_hung_rank_s_timeout_is_blamed_not_the_peer_torchrun_then_killed():
    """Rank 1 stopped answering: rank 0 timed out in its all-reduce (the root cause), and torchrun, whose
    SIGTERM a stopped process ignores, SIGKILLed rank 1 after it."""
    timed_out = [
        line.replace("1 (local_rank: 1)", "0 (local_rank: 0)").replace(
            "ValueError: a shard holds no rows",
            "RuntimeError: Timed out waiting 6000ms for recv operation to complete",
        )
        for line in A_RANKS_OWN_ERROR
    ]
    peer = ["[1]:", "  rank      : 1 (local_rank: 1)", "  exitcode  : -9 (pid: 2)  (SIGKILL)"]
    at = timed_out.index("  <NO_OTHER_FAILURES>")
    first = describe_failure([*timed_out[:at], *peer, *timed_out[at + 1 :]], 1, 2).splitlines()[0]
    assert first.startswith("data-parallel training on 2 ranks failed: rank 0 (local_rank: 0) (exit code 1")
    assert first.endswith("Timed out waiting 6000ms for recv operation to complete")


def test_without_a_failure_record_the_ranks_last_lines_are_shown():
    message = describe_failure(["loading", "Killed"], 137, 2)
    assert message == "data-parallel training on 2 ranks failed (torchrun exit 137):\nloading\nKilled"
