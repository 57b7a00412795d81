"""Training progress lines: every 10 steps or 30 s, whichever comes first, with loss, s/step and an ETA."""

from types import SimpleNamespace

from pipeline.config import TrainConfig
from pipeline.training.progress import StepLog, eta_text


def _run(step_seconds: list[float], log_every: int = 5) -> list[str]:
    lines, now = [], [0.0]
    log = StepLog(
        len(step_seconds),
        TrainConfig(method="lora", log_every=log_every),
        None,
        False,
        lines.append,
        lambda: now[0],
    )
    result = SimpleNamespace(steps=0, step_seconds=[])
    for seconds in step_seconds:
        now[0] += seconds
        result.steps += 1
        result.step_seconds.append(seconds)
        if log.due(result.steps):
            log.write(result, 1.0 / result.steps, 1e-4, now[0])
        else:
            log.tick(result, now[0])
    return lines


def test_a_line_every_ten_steps_and_at_the_end():
    lines = _run([1.0] * 25)
    assert [line.split(",")[0] for line in lines] == [f"train lora: step {s}/25" for s in (10, 20, 25)]
    assert "loss 0.1000" in lines[0] and "1.00 s/step" in lines[0] and "ETA 15s" in lines[0]
    assert lines[-1].endswith("ETA 0s")


def test_slow_steps_get_a_line_every_30_seconds():
    lines = _run([16.0] * 6)
    assert [line.split(",")[0] for line in lines] == [f"train lora: step {s}/6" for s in (2, 4, 6)]


def test_eta_reads_as_people_write_it():
    assert (eta_text(45), eta_text(365), eta_text(3720)) == ("45s", "6m05s", "1h02m")


def test_a_long_data_step_is_announced_while_it_runs_and_a_short_one_says_nothing():
    import time

    from pipeline.data.facts import announced

    lines: list[str] = []
    with announced(lines.append, "reading big.parquet", after_s=30):
        pass
    assert lines == []  # an error in a short step stays the one line the user reads
    with announced(lines.append, "reading big.parquet", after_s=0.05, every_s=0.1):
        time.sleep(0.5)
    assert len(lines) >= 2 and all(line.startswith("reading big.parquet (") for line in lines)
    settled = len(lines)
    time.sleep(0.3)
    assert len(lines) == settled  # nothing more once the step is over
