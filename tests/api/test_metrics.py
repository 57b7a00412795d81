"""GET /metrics: request counts by status, latency and batch-size histograms, and the queue depth, in the
Prometheus text format."""

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import QUESTIONS, make_app, wait_ready


def _samples(client) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def test_metrics_count_requests_by_status_and_batches_by_size(served_folder):
    with TestClient(make_app(served_folder)) as client:
        wait_ready(client)
        before = _samples(client)
        assert before[("decision_queue_depth", ())] == 0
        for _ in range(3):
            assert (
                client.post("/v1/systemone", json={"state": "a fine day", "questions": QUESTIONS}).status_code
                == 200
            )
        assert client.post("/v1/systemone", json={"state": "x", "questions": {}}).status_code == 422
        assert client.get("/v1/systemone").status_code == 405  # no decision request: not counted as one
        after = _samples(client)
    assert after[("decision_requests_total", (("status", "200"),))] == 3
    assert after[("decision_requests_total", (("status", "422"),))] == 1
    assert ("decision_requests_total", (("status", "405"),)) not in after
    assert (
        after[("decision_request_seconds_count", ())] == 4 and after[("decision_request_seconds_sum", ())] > 0
    )
    assert after[("decision_batch_requests_count", ())] == 3  # one at a time: three batches of one request
    assert after[("decision_batch_questions_sum", ())] == 3 * len(QUESTIONS)
    assert ("decision_request_seconds_bucket", (("le", "+Inf"),)) in after
