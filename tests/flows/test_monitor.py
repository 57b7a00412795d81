"""The `monitor` flow on a real tiny registered model and a real inference folder: a drifted window is
reported on the version's MLflow run and in latest.json and emits `decision.drift.detected`; a window drawn
like the training rows is not drift, and its feedback is measured; a window too small judges nothing; a
certified version whose automated answers the feedback shows wrong too often emits
`decision.certificate.broken`."""

import datetime as dt
import json
import random
import time

import orjson
import pytest
import yaml

from pipeline.cli.main import main
from pipeline.data import synthetic
from pipeline.data.answers import parse_request
from pipeline.flywheel.gauges import read_gauges
from pipeline.flywheel.table import ParquetStore
from tests.flows.processes import record_launches

pytestmark = pytest.mark.slow

NAME = "tiny-model"
CERTIFIED = "certified-model"
END = dt.datetime(2026, 12, 3, 12, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def registered(tiny_base, synthetic_train_file, tmp_path_factory):
    """`tiny-model@champion`: the tiny base registered with the `data` tag the retrain flow sets, in a store
    of the module's own (MLFLOW_TRACKING_URI set for the module's tests)."""
    from pipeline.mlops.registry import client, register_export

    store = tmp_path_factory.mktemp("mlflow")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}/mlflow.db")
        patch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        version = register_export(tiny_base, NAME, tags={"data": str(synthetic_train_file)})
        client().set_registered_model_alias(NAME, "champion", version)
        yield version


@pytest.fixture(scope="module")
def certified(registered, tiny_base, synthetic_train_file, tmp_path_factory):
    """`certified-model@champion`: the tiny base exported with a certificate for tone (ε 0.05, δ 0.1, every
    answer automated), in the module's store."""
    from pipeline.mlops.registry import client, register_export
    from tests.tiny import certified_copy, tone_certificate

    folder = certified_copy(
        tiny_base, tmp_path_factory.mktemp("certified") / "export", {"tone": tone_certificate(0.0)}
    )
    version = register_export(folder, CERTIFIED, tags={"data": str(synthetic_train_file)})
    client().set_registered_model_alias(CERTIFIED, "champion", version)
    return version


@pytest.fixture(scope="module")
def served_model(tiny_base):
    from pipeline.families import load_decision_model

    return load_decision_model(tiny_base)


def params_file(folder, inference, **monitor):
    settings = {
        "inference": str(inference),
        "window_hours": 1.0,
        "min_decisions": 30,
        "reference_rows": 120,
        "drift_share": 0.3,
    }
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump({"monitor": settings | monitor}))
    return path


def log_window(store, model, version, rows, served_as=None, automated=()):
    """`rows` answered by the model as the server answers them, logged over the hour before END; the
    `automated` questions' answers marked as the server marks the answers it automated. The answers logged."""
    logged = []
    for i, row in enumerate(rows):
        [answered] = model.answer([parse_request(row["state"], row["questions"])])
        for qid in automated:
            answered.answers[qid]["x_automate"] = True
        logged.append(
            {
                "decision_id": f"d{i}",
                "time": END - dt.timedelta(minutes=59 - i % 59),
                "model": served_as or f"{NAME}/{version}",
                "model_version": version,
                "owner": None,
                "state": orjson.dumps(row["state"]).decode(),
                "questions": orjson.dumps(row["questions"]).decode(),
                "answers": orjson.dumps(answered.answers).decode(),
                "latency_ms": 5.0,
            }
        )
    store.append("decisions", logged)
    return [orjson.loads(row["answers"]) for row in logged]


def new_kind_of_traffic(n):
    """Long JSON tickets, asking only the tone and whether it is negative (no intensity)."""
    rng = random.Random(9)
    rows = synthetic.generate_rows(n, seed=21)
    return [
        {
            "state": {"ticket": i, "channel": rng.choice(["email", "chat"]), "notes": row["state"] * 3},
            "questions": {q: row["questions"][q] for q in ("tone", "is_negative")},
        }
        for i, row in enumerate(rows)
    ]


def read_events(event_id, timeout=30.0, name="decision.drift.detected"):
    """The events `name` the Prefect API stored, once `event_id` is among them (the server writes events in
    batches)."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter

    since = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            wanted = EventFilter(
                event=EventNameFilter(name=[name]),
                occurred=EventOccurredFilter(since=since),
            )  # `until` defaults to now: made anew
            events = client.read_events(
                filter=wanted, limit=50
            ).events  # the API's page limit (its client asks 100)
            if any(str(e.id) == event_id for e in events) or time.monotonic() > deadline:
                return events
            time.sleep(1)


def test_a_drifted_window_is_logged_on_the_versions_run_and_emits_the_event(
    prefect_harness, registered, served_model, tmp_path
):
    from flows.monitor import monitor
    from pipeline.mlops.registry import client

    inference = tmp_path / "inference"
    log_window(ParquetStore(inference), served_model, registered, new_kind_of_traffic(60))
    outcome = monitor(
        f"{NAME}@champion", window_end=END.isoformat(), params_file=str(params_file(tmp_path, inference))
    )
    result = outcome["result"]
    assert outcome["model"] == f"{NAME}/{registered}" and outcome["decisions"] == 60
    assert result["breached"] and {"state_chars", "state_kind", "question_mix"} <= set(result["drifted"])
    assert set(result["not_compared"]) == {
        "chosen.intensity",
        "confidence.intensity",
    }  # never asked in the window
    run_id = client().get_model_version(NAME, registered).run_id
    assert outcome["artifact"] == "monitoring/drift-20261203T120000Z.html"
    assert [a.path for a in client().list_artifacts(run_id, "monitoring")] == [outcome["artifact"]]
    [share] = client().get_metric_history(run_id, "monitor_drift_share")
    assert share.value == result["share"] and share.step == int(END.timestamp())
    gauges = read_gauges(inference)
    assert gauges["drift_share"] == result["share"] and gauges["window_decisions"] == 60
    assert (inference / "monitor" / "latest.html").stat().st_size > 10_000
    events = read_events(outcome["event"])
    [event] = [e for e in events if str(e.id) == outcome["event"]]
    assert event.resource.id == f"decision-model.{NAME}"
    assert event.payload["columns"] == result["drifted"] and event.payload["share"] == result["share"]


def test_a_window_like_the_training_rows_is_not_drift_and_its_feedback_is_measured(
    prefect_harness, registered, served_model, tmp_path
):
    from flows.monitor import monitor

    inference = tmp_path / "inference"
    store = ParquetStore(inference)
    rows = synthetic.generate_rows(80, seed=33)
    log_window(store, served_model, registered, rows)
    log_window(
        store, served_model, registered, rows[:5], served_as="other-model/4"
    )  # another model's traffic
    store.append(
        "feedback",
        [
            {
                "decision_id": f"d{i}",
                "question_id": "tone",
                "gold": json.dumps(rows[i]["gold"]["tone"]),
                "labelled_by": "import",
                "time": END,
            }
            for i in range(12)
        ],
    )
    outcome = monitor(
        f"{NAME}/{registered}", window_end=END.isoformat(), params_file=str(params_file(tmp_path, inference))
    )
    result = outcome["result"]
    assert outcome["decisions"] == 80 and outcome["event"] is None
    assert not result["breached"] and not {"state_chars", "state_kind", "question_mix"} & set(
        result["drifted"]
    )
    tone = next(a for a in result["accuracy"] if a["question"] == "tone")
    assert tone["decisions"] == 80 and tone["labelled"] == 12 and 0 <= tone["measured"] <= 1
    assert read_gauges(inference)["labelled_decisions"] == 12


def test_automated_answers_wrong_too_often_break_the_certificate_and_emit_the_event(
    prefect_harness, certified, served_model, tmp_path
):
    """Tone certified at ε 0.05: of 60 automated tone answers, 40 get feedback, 6 of them another option than
    the one answered. The lower bound (0.081 at δ 0.1) is above ε: broken, with its figures in the outcome, the
    event, latest.json's gauges and the version's run."""
    from flows.monitor import monitor
    from pipeline.data.answers import chosen_option
    from pipeline.flywheel.gauges import read_certificate_gauges
    from pipeline.mlops.registry import client
    from pipeline.scoring.certify import error_lower_bound

    inference = tmp_path / "inference"
    store = ParquetStore(inference)
    rows = synthetic.generate_rows(60, seed=33)
    answers = log_window(
        store, served_model, certified, rows, served_as=f"{CERTIFIED}/{certified}", automated=("tone",)
    )
    options = ("negative", "neutral", "positive")
    golds = []
    for i in range(40):
        chosen = chosen_option(answers[i]["tone"])
        golds.append(next(o for o in options if o != chosen) if i < 6 else chosen)
    store.append(
        "feedback",
        [
            {
                "decision_id": f"d{i}",
                "question_id": "tone",
                "gold": json.dumps(gold),
                "labelled_by": "import",
                "time": END,
            }
            for i, gold in enumerate(golds)
        ],
    )
    outcome = monitor(
        f"{CERTIFIED}@champion", window_end=END.isoformat(), params_file=str(params_file(tmp_path, inference))
    )
    [tone] = outcome["certificates"]
    assert (tone["question"], tone["automated"], tone["labelled"], tone["errors"]) == ("tone", 60, 40, 6)
    assert tone["status"] == "broken" and tone["error_lower_bound"] == pytest.approx(
        error_lower_bound(6, 40, 0.1)
    )
    assert tone["error_lower_bound"] > 0.05 and tone["error_upper_bound"] > tone["realised_error"] == 0.15
    assert outcome["certificate_event"] is not None
    [event] = [
        e
        for e in read_events(outcome["certificate_event"], name="decision.certificate.broken")
        if str(e.id) == outcome["certificate_event"]
    ]
    assert event.resource.id == f"decision-model.{CERTIFIED}" and event.payload["questions"] == ["tone"]
    assert event.payload["reason"].startswith("tone broken: 6 wrong of 40 automated with feedback (0.150)")
    gauges = read_certificate_gauges(inference)["tone"]
    assert gauges["broken"] == 1.0 and gauges["errors"] == 6.0 and gauges["automated"] == 60.0
    run_id = client().get_model_version(CERTIFIED, certified).run_id
    [broken] = client().get_metric_history(run_id, "certificate_tone_broken")
    assert broken.value == 1.0 and broken.step == int(END.timestamp())


def test_a_window_with_too_few_decisions_judges_nothing(prefect_harness, registered, served_model, tmp_path):
    from flows.monitor import monitor

    inference = tmp_path / "inference"
    log_window(ParquetStore(inference), served_model, registered, synthetic.generate_rows(10, seed=5))
    outcome = monitor(
        f"{NAME}@champion", window_end=END.isoformat(), params_file=str(params_file(tmp_path, inference))
    )
    assert outcome["result"] is None and outcome["event"] is None
    assert outcome["line"].endswith(
        "10 decisions from 2026-12-03T11:00:00+00:00 to 2026-12-03T12:00:00+00:00, "
        "fewer than 30: nothing judged"
    )
    assert read_gauges(inference) == {} and not (inference / "monitor").exists()


def test_bad_input_is_one_line_and_exit_2_before_a_flow_run(registered, tmp_path, capsys, monkeypatch):
    launched = record_launches(monkeypatch)
    model = ["monitor", "--model", f"{NAME}@champion"]
    refusals = {
        "no inference log there": [*model, "--inference", str(tmp_path / "typo")],
        "no such file": [*model, "--params", str(tmp_path / "params.yaml")],
        "no such file or folder": [
            *model,
            "--inference",
            str(tmp_path),
            "--reference",
            str(tmp_path / "rows.jsonl"),
        ],
    }
    for words, flags in refusals.items():
        assert main(flags) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("decision monitor: ") and words in err[0], err
    for flags, words in (
        (["--window-hours", "nan"], "a positive number of hours"),
        (["--window-end", "2999-01-01T00:00:00"], "in the future"),
    ):
        with pytest.raises(SystemExit) as refused:
            main([*model, *flags])
        assert refused.value.code == 2 and words in capsys.readouterr().err
    assert not launched
