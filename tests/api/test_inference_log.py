"""The inference log: every answered decision gets an id (header and body) and is written, off the hot path,
with its model, owner, state, questions, answers and latency; sampling, redaction, the off switch, and a log
that cannot be written (serving goes on, drops counted on /metrics)."""

import json
import os

import orjson
import pytest
from fastapi.testclient import TestClient

from pipeline.flywheel.log import LogConfig, hash_value, redact
from pipeline.flywheel.table import open_store
from pipeline.serving.catalog import Catalog
from pipeline.serving.keys import KeyStore, hash_key
from pipeline.serving.server import ServerConfig, create_app
from tests.api.conftest import QUESTIONS, wait_ready

KEYS = KeyStore({hash_key("alice-key"): "alice"})


def logged_app(folder, log: LogConfig, keys: KeyStore = KEYS):
    return create_app(Catalog(str(folder)), keys, ServerConfig(), log_config=log)


def ask(api, state, key="alice-key"):
    response = api.post(
        "/v1/systemone",
        json={"state": state, "questions": QUESTIONS},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status_code == 200, response.text
    return response


def metric(api, name: str) -> float:
    lines = [line for line in api.get("/metrics").text.splitlines() if line.startswith(name)]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_every_answer_carries_its_id_and_is_written_with_what_was_asked_and_answered(served_folder, tmp_path):
    log = LogConfig(str(tmp_path / "inference"), flush_s=0.2)
    with TestClient(logged_app(served_folder, log)) as api:
        wait_ready(api)
        answered = [ask(api, {"text": f"order {i} was late", "n": i}) for i in range(5)]
    ids = [r.json()["x_decision_id"] for r in answered]
    assert [r.headers["X-Decision-Id"] for r in answered] == ids and len(set(ids)) == 5
    rows = {row["decision_id"]: row for row in open_store(tmp_path / "inference").decisions().to_pylist()}
    assert set(rows) == set(ids)  # the shutdown flushed what the interval had not
    first = rows[ids[0]]
    assert first["owner"] == "alice" and first["model"] == answered[0].json()["model"]
    assert json.loads(first["state"]) == {"text": "order 0 was late", "n": 0}
    assert json.loads(first["answers"]) == answered[0].json()["answers"]
    # Each logged answer keeps its automation flag, for harvest, review and the monitor to read.
    assert json.loads(first["answers"])["tone"]["x_automate_reason"] == "not_certified"
    assert set(json.loads(first["questions"])) == set(QUESTIONS) and first["latency_ms"] > 0
    days = os.listdir(tmp_path / "inference" / "decisions")
    assert days and all(d.startswith("day=") for d in days)  # partitioned by day, as pandas/DuckDB read it


def test_the_log_flushes_on_its_interval_while_serving(served_folder, tmp_path):
    import time

    with TestClient(logged_app(served_folder, LogConfig(str(tmp_path / "inference"), flush_s=0.1))) as api:
        wait_ready(api)
        decision_id = ask(api, "late again").json()["x_decision_id"]
        deadline = time.monotonic() + 10
        while not open_store(tmp_path / "inference").decisions(ids=[decision_id]).num_rows:
            assert time.monotonic() < deadline, "not written within 10 s of a 0.1 s interval"
            time.sleep(0.05)
        assert metric(api, "decision_log_written_total") == 1


def test_sampling_writes_a_share_and_still_ids_every_answer(served_folder, tmp_path):
    with TestClient(logged_app(served_folder, LogConfig(str(tmp_path / "inference"), sample=0.3))) as api:
        wait_ready(api)
        ids = [ask(api, f"state {i}").json()["x_decision_id"] for i in range(60)]
    written = open_store(tmp_path / "inference").decisions().num_rows
    assert len(set(ids)) == 60 and 5 <= written <= 35  # 0.3 of 60 = 18; binomial sd 3.5


def test_redaction_drops_and_hashes_state_fields_before_writing(served_folder, tmp_path):
    log = LogConfig(
        str(tmp_path / "inference"), drop_fields=("customer.email",), hash_fields=("customer.id",)
    )
    state = {"customer": {"email": "a@b.c", "id": 42, "tier": "gold"}, "text": "late"}
    with TestClient(logged_app(served_folder, log)) as api:
        wait_ready(api)
        ask(api, state)
    (row,) = open_store(tmp_path / "inference").decisions().to_pylist()
    written = json.loads(row["state"])
    assert written == {"customer": {"id": hash_value(42), "tier": "gold"}, "text": "late"}
    assert "a@b.c" not in row["state"]


def test_redaction_leaves_text_states_and_missing_paths_alone():
    assert redact("plain text", ("a",), ("b",)) == "plain text"
    assert redact({"a": {"b": 1}}, ("a.x.y", "z"), ()) == {"a": {"b": 1}}
    assert hash_value("x").startswith("sha256:") and hash_value("x") == hash_value("x")


def test_the_off_switch_writes_nothing_and_feedback_says_why(served_folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with TestClient(logged_app(served_folder, LogConfig(None))) as api:
        wait_ready(api)
        decision_id = ask(api, "late").json()["x_decision_id"]
        refused = api.post(
            "/v1/feedback",
            json={"decision_id": decision_id, "gold": {"tone": "negative"}},
            headers={"Authorization": "Bearer alice-key"},
        )
    assert refused.status_code == 404 and "no inference log" in refused.json()["detail"]["message"]
    assert not (tmp_path / "inference").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_log_folder_that_cannot_be_written_never_stops_serving(served_folder, tmp_path):
    folder = tmp_path / "inference"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        _serve_through_failing_log(served_folder, folder)
    finally:
        folder.chmod(0o700)


def test_a_log_path_that_is_a_file_never_stops_serving(served_folder, tmp_path):
    """A path that cannot hold the log (here a file where the folder should be; a full disk fails the same
    way, with OSError, in the writer thread)."""
    blocked = tmp_path / "inference"
    blocked.write_text("not a folder")
    _serve_through_failing_log(served_folder, blocked)


def _serve_through_failing_log(served_folder, folder):
    with TestClient(logged_app(served_folder, LogConfig(str(folder), flush_s=0.1))) as api:
        wait_ready(api)
        for i in range(4):
            assert ask(api, f"late {i}").status_code == 200
        api.app.state.inference_log.flush()
        assert metric(api, 'decision_log_dropped_total{reason="write_error"}') == 4
        assert metric(api, "decision_log_written_total") == 0


def test_a_full_queue_drops_and_counts_instead_of_blocking(served_folder, tmp_path):
    log = LogConfig(str(tmp_path / "inference"), flush_s=60, max_queue=2)
    with TestClient(logged_app(served_folder, log)) as api:
        wait_ready(api)
        for i in range(5):
            ask(api, f"late {i}")
        assert metric(api, 'decision_log_dropped_total{reason="queue_full"}') == 3
        assert metric(api, "decision_log_queue_depth") == 2
    assert open_store(tmp_path / "inference").decisions().num_rows == 2


def test_the_decision_id_is_in_the_openapi_response(served_folder):
    with TestClient(logged_app(served_folder, LogConfig(None))) as api:
        schema = api.get("/openapi.json").json()["components"]["schemas"]["DecisionResponse"]
    assert "x_decision_id" in schema["properties"] and "decision_id" not in schema["properties"]
    assert orjson.loads(orjson.dumps(schema))  # serialisable as served


def test_a_full_disk_drops_the_batch_counts_it_and_the_next_flush_writes_again(tmp_path):
    import errno

    from pipeline.flywheel.log import InferenceLog, Served

    class FillsUp:
        """A store whose disk is full for one write, then has room again."""

        where, full, rows = "disk", True, []

        def append(self, table, rows):
            if self.full:
                self.full = False
                raise OSError(errno.ENOSPC, "No space left on device")
            self.rows.extend(rows)

    dropped = []
    store = FillsUp()
    log = InferenceLog(LogConfig("disk"), on_drop=lambda reason, n: dropped.append((reason, n)), store=store)
    served = Served(
        decision_id="a" * 32,
        model="m/1",
        model_version="1",
        owner=None,
        state="late",
        questions={"q": {"type": "noul"}},
        answers={"q": {"noul": 0.5}},
        latency_ms=1.0,
    )
    assert log.record(served) and log.flush() == 0
    assert dropped == [("write_error", 1)]
    assert log.record(served) and log.flush() == 1 and store.rows[0]["decision_id"] == "a" * 32


def test_the_drift_monitors_latest_summary_is_on_metrics(served_folder, tmp_path):
    from pipeline.flywheel.gauges import LATEST

    folder = tmp_path / "inference"
    with TestClient(logged_app(served_folder, LogConfig(str(folder)))) as api:
        wait_ready(api)
        assert "decision_monitor_" not in api.get("/metrics").text  # no report yet: no gauges
        (folder / LATEST).parent.mkdir(parents=True)
        summary = {
            "written_at": "2026-12-03T10:00:00+00:00",
            "gauges": {"drift_share": 0.6, "expected_accuracy": 0.81, "window_decisions": 150},
        }
        (folder / LATEST).write_text(json.dumps(summary))
        assert metric(api, "decision_monitor_drift_share") == 0.6
        assert metric(api, "decision_monitor_window_decisions") == 150
        assert metric(api, "decision_monitor_report_age_seconds") > 0
