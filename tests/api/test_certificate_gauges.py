"""`GET /metrics` shows each certificate as the monitor re-checked it on its latest window
(`decision_certificate_<gauge>{question}`), beside the drift gauges, read from `monitor/latest.json`."""

import json

from fastapi.testclient import TestClient

from pipeline.flywheel.gauges import CERTIFICATE_GAUGES, LATEST
from pipeline.flywheel.log import LogConfig
from pipeline.flywheel.recertify import CertificateCheck
from pipeline.serving.catalog import Catalog
from pipeline.serving.keys import KeyStore
from pipeline.serving.server import ServerConfig, create_app
from tests.api.conftest import wait_ready


def check(question: str, labelled: int, errors: int, lower: float) -> CertificateCheck:
    return CertificateCheck(
        question=question,
        target_error=0.05,
        delta=0.1,
        threshold=0.9,
        automated=50,
        labelled=labelled,
        errors=errors,
        error_upper_bound=0.26 if labelled else 1.0,
        error_lower_bound=lower,
    )


def samples(text: str, name: str) -> dict[str, float]:
    """{question: value} of one gauge in the exposition."""
    found = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            found[labels.split('question="', 1)[1].split('"', 1)[0]] = float(value)
    return found


def test_the_certificates_rechecked_on_the_latest_window_are_gauges_per_question(served_folder, tmp_path):
    folder = tmp_path / "inference"
    app = create_app(
        Catalog(str(served_folder)), KeyStore({}), ServerConfig(), log_config=LogConfig(str(folder))
    )
    with TestClient(app) as api:
        wait_ready(api)
        assert "decision_certificate_" not in api.get("/metrics").text  # no report yet: no gauges
        checks = {"tone": check("tone", 40, 6, 0.081), "is_negative": check("is_negative", 0, 0, 0.0)}
        summary = {
            "written_at": "2026-12-03T10:00:00+00:00",
            "gauges": {"drift_share": 0.1},
            "certificates": {q: c.to_dict() for q, c in checks.items()},
        }
        (folder / LATEST).parent.mkdir(parents=True)
        (folder / LATEST).write_text(json.dumps(summary))
        text = api.get("/metrics").text
    assert samples(text, "decision_certificate_broken") == {"is_negative": 0.0, "tone": 1.0}
    assert samples(text, "decision_certificate_realised_error") == {"tone": 0.15}  # none labelled: no error
    assert samples(text, "decision_certificate_automated_labelled") == {"is_negative": 0.0, "tone": 40.0}
    assert samples(text, "decision_certificate_error_lower_bound")["tone"] == 0.081
    assert samples(text, "decision_certificate_error_upper_bound") == {"is_negative": 1.0, "tone": 0.26}
    assert all(f"decision_certificate_{name}" in text for name in CERTIFICATE_GAUGES)
    assert "decision_monitor_drift_share 0.1" in text
