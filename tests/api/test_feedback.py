"""`POST /v1/feedback`: outcomes for logged decisions, checked with the training rows' contract, by the key
that made the decision (or an admin key), stored whole or not at all, idempotent per (decision, question)."""

import json

import pytest
from fastapi.testclient import TestClient

from pipeline.flywheel.feedback import read_feedback_file
from pipeline.flywheel.log import LogConfig
from pipeline.flywheel.table import open_store
from pipeline.serving.catalog import Catalog
from pipeline.serving.keys import KeyStore, hash_key
from pipeline.serving.server import ServerConfig, create_app
from tests.api.conftest import QUESTIONS, wait_ready

KEYS = KeyStore(
    {hash_key("alice-key"): "alice", hash_key("bob-key"): "bob", hash_key("ops-key"): "ops"},
    frozenset({hash_key("ops-key")}),
)


@pytest.fixture()
def api(served_folder, tmp_path):
    app = create_app(
        Catalog(str(served_folder)),
        KEYS,
        ServerConfig(),
        log_config=LogConfig(str(tmp_path / "inference"), flush_s=30),
    )
    with TestClient(app) as client:
        yield wait_ready(client)


def bearer(key):
    return {"Authorization": f"Bearer {key}"} if key else {}


def decide(api, key="alice-key") -> str:
    response = api.post("/v1/systemone", json={"state": "late", "questions": QUESTIONS}, headers=bearer(key))
    return response.json()["x_decision_id"]


def send(api, body, key="alice-key"):
    return api.post("/v1/feedback", json=body, headers=bearer(key))


def stored(tmp_path) -> list[dict]:
    return open_store(tmp_path / "inference").feedback().to_pylist()


def test_a_label_sent_at_once_is_stored_even_before_the_decision_was_flushed(api, tmp_path):
    decision_id = decide(api)  # the log flushes every 30 s: the feedback handler must flush it first
    gold = {"tone": "negative", "intensity": 2, "positive": {"label": "false", "probabilities": [0.9, 0.1]}}
    response = send(api, {"decision_id": decision_id, "gold": gold})
    assert response.status_code == 200, response.text
    assert response.json() == {"stored": 3, "decisions": 1}
    rows = {row["question_id"]: row for row in stored(tmp_path)}
    assert {q: json.loads(r["gold"]) for q, r in rows.items()} == gold
    assert {r["labelled_by"] for r in rows.values()} == {"alice"}


def test_a_resent_label_replaces_the_earlier_one(api, tmp_path):
    decision_id = decide(api)
    for label in ("negative", "positive", "neutral"):
        assert send(api, {"decision_id": decision_id, "gold": {"tone": label}}).status_code == 200
    (row,) = stored(tmp_path)
    assert json.loads(row["gold"]) == "neutral"


def test_many_items_in_one_request(api, tmp_path):
    ids = [decide(api) for _ in range(3)]
    body = [{"decision_id": i, "gold": {"tone": "positive"}} for i in ids]
    assert send(api, body).json() == {"stored": 3, "decisions": 3}
    assert {r["decision_id"] for r in stored(tmp_path)} == set(ids)


def test_only_the_deciding_key_or_an_admin_may_label(api, tmp_path):
    decision_id = decide(api, "alice-key")
    body = {"decision_id": decision_id, "gold": {"tone": "negative"}}
    refused = send(api, body, "bob-key")
    assert refused.status_code == 403 and "another key" in refused.json()["detail"]["message"]
    assert send(api, body, None).status_code == 401
    assert send(api, body, "ops-key").status_code == 200
    assert [r["labelled_by"] for r in stored(tmp_path)] == ["ops"]
    keyless = decide(api, None)  # a keyless decision on a keyed server: only an admin may label it
    refused = send(api, {"decision_id": keyless, "gold": {"tone": "negative"}}, "alice-key")
    assert refused.status_code == 403 and "was made without an API key" in refused.json()["detail"]["message"]
    unkeyed = send(api, {"decision_id": keyless, "gold": {"tone": "negative"}}, None)
    assert unkeyed.status_code == 401 and "admin key only" in unkeyed.json()["detail"]["message"]
    assert send(api, {"decision_id": keyless, "gold": {"tone": "negative"}}, "ops-key").status_code == 200


@pytest.mark.parametrize(
    ("gold", "named"),
    [
        ({"mood": "negative"}, "asked no question 'mood'"),
        ({"tone": "furious"}, "'furious' is not an option of 'tone'"),
        ({"intensity": 7}, "7 is not an option of 'intensity'"),
        ({"positive": "maybe"}, "'maybe' is not an option of 'positive'"),
        ({"tone": {"label": "negative", "probabilities": [0.5, 0.9, 0.1]}}, "summing to 1"),
        # labels of a kind no option can be: refused by name, never a 500
        ({"tone": ["negative"]}, "['negative'] is not an option of 'tone'"),
        ({"tone": {"label": {"a": 1}}}, "{'a': 1} is not an option of 'tone'"),
        ({"intensity": "9" * 5000}, "'99999"),  # past Python's 4,300-digit limit on int(), quoted cut short
        ({"tone": {"label": "negative", "probabilities": [False, True, False]}}, "summing to 1"),
        ({"tone": {"label": "negative", "note": 2**70}}, "cannot be stored as JSON"),
    ],
)
def test_gold_that_does_not_fit_the_question_is_a_422_naming_it(api, tmp_path, gold, named):
    decision_id = decide(api)
    refused = send(api, {"decision_id": decision_id, "gold": gold})
    assert refused.status_code == 422
    (error,) = refused.json()["detail"]
    assert named in error["msg"] and error["loc"][-1] == next(iter(gold)) and len(error["msg"]) < 300
    assert stored(tmp_path) == []


def test_one_bad_item_stores_nothing_and_every_problem_is_named(api, tmp_path):
    good, other = decide(api), decide(api)
    body = [
        {"decision_id": good, "gold": {"tone": "negative"}},
        {"decision_id": other, "gold": {"tone": "furious"}},
        {"decision_id": "no-such-decision", "gold": {"tone": "negative"}},
    ]
    refused = send(api, body)
    assert refused.status_code == 404
    message = refused.json()["detail"]["message"]
    assert "no-such-decision" in message and "furious" in message
    assert stored(tmp_path) == []


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"decision_id": "x"},
        {"decision_id": "x", "gold": {}},
        {"decision_id": "", "gold": {"a": 1}},
        {"decision_id": 3, "gold": {"tone": "negative"}},
        [],
        "text",
        [{"decision_id": "x", "gold": "negative"}],
    ],
)
def test_malformed_bodies_are_a_422(api, body):
    assert send(api, body).status_code == 422


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"decision_id": "x"}, ["body", "item", "gold"]),
        ([{"decision_id": "x"}], ["body", "items", 0, "gold"]),
        ([], ["body", "items"]),
        (5, ["body", "item"]),
    ],
)
def test_a_malformed_body_is_one_error_at_its_field_not_one_per_form_of_body(api, body, loc):
    # one item or a list: the body's JSON kind says which form it is, so the other form's failure is not
    # reported
    [detail] = send(api, body).json()["detail"]
    assert detail["loc"] == loc


def test_the_feedback_file_forms_read_back_as_items(tmp_path):
    jsonl = tmp_path / "labels.jsonl"
    jsonl.write_text(
        '{"decision_id": "a", "gold": {"tone": "negative"}}\n'
        '{"decision_id": "b", "question": "tone", "label": "positive"}\n'
        '{"decision_id": "b", "question": "intensity", "label": 2}\n'
    )
    csv = tmp_path / "labels.csv"
    csv.write_text("decision_id,question,label,state\nc,tone,neutral,late\nd,tone,,not labelled yet\n")
    # Flat rows keep the lines their labels came from (a refusal names them).
    assert read_feedback_file(jsonl) == [
        {"decision_id": "a", "gold": {"tone": "negative"}, "lines": {"tone": 1}},
        {
            "decision_id": "b",
            "gold": {"tone": "positive", "intensity": 2},
            "lines": {"tone": 2, "intensity": 3},
        },
    ]
    assert read_feedback_file(csv) == [
        {"decision_id": "c", "gold": {"tone": "neutral"}, "lines": {"tone": 2}}
    ]


def test_a_spreadsheet_s_byte_order_mark_and_a_bad_line_are_read_as_a_person_means_them(tmp_path):
    csv = tmp_path / "labels.csv"
    csv.write_bytes(b"\xef\xbb\xbfdecision_id,question,label\nc,tone,neutral\n")  # Excel's "CSV UTF-8"
    assert read_feedback_file(csv) == [
        {"decision_id": "c", "gold": {"tone": "neutral"}, "lines": {"tone": 2}}
    ]
    jsonl = tmp_path / "labels.jsonl"
    jsonl.write_text('{"decision_id": "a", "gold": {"tone": "negative"}}\n\n{"decision_id": "b", "gold": {\n')
    with pytest.raises(ValueError, match="line 3 is not JSON"):
        read_feedback_file(jsonl)


def test_one_question_labelled_twice_in_one_body_keeps_the_last_label(api, tmp_path):
    decision_id = decide(api)
    body = [
        {"decision_id": decision_id, "gold": {"tone": "negative"}},
        {"decision_id": decision_id, "gold": {"tone": "neutral"}},
    ]
    response = send(api, body)
    assert response.status_code == 200 and response.json() == {"stored": 1, "decisions": 1}
    assert [json.loads(row["gold"]) for row in stored(tmp_path)] == ["neutral"]


@pytest.mark.parametrize("decision_id", ["abc\u0000", "x" * 201, "tab\tbed"])
def test_a_decision_id_no_store_could_hold_is_a_422_before_any_lookup(api, tmp_path, decision_id):
    refused = send(api, {"decision_id": decision_id, "gold": {"tone": "negative"}})
    assert refused.status_code == 422 and len(refused.content) < 1_000
    assert "is no decision id" in refused.json()["detail"][0]["msg"]


def test_what_the_caller_sent_comes_back_bounded_however_much_is_wrong(api, tmp_path):
    unknown = send(api, {"decision_id": "d" * 150, "gold": {"tone": "negative"}})
    assert unknown.status_code == 404 and len(unknown.content) < 1_000
    decision_id = decide(api)
    gold = {f"q{i}-" + "x" * 1_000: "negative" for i in range(5_000)}
    refused = send(api, {"decision_id": decision_id, "gold": gold})
    assert refused.status_code == 422 and len(refused.content) < 20_000
    errors = refused.json()["detail"]
    assert len(errors) == 21 and errors[-1]["msg"].startswith("and 4,980 more problems")


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        (
            "columns.csv",
            "id,q,lab\n1,tone,negative\n",
            "line 2: a labelled row needs decision_id, question and label",
        ),
        ("no-question.csv", "decision_id,question,label\nabc,,negative\n", "line 2: a labelled row needs"),
        ("blank.csv", "decision_id,question,label\nabc,tone,\n", "no row has a label"),
        (
            "other.jsonl",
            '{"decision_id": "a", "gold": {"tone": "negative"}}\n\n{"foo": 1}\n',
            "line 3: a labelled",
        ),
    ],
)
def test_a_labelled_file_of_the_wrong_shape_is_named_by_line(tmp_path, capsys, name, text, said):
    from pipeline.cli.main import main

    (tmp_path / "inference").mkdir()
    (tmp_path / name).write_text(text)
    assert main(["feedback", "import", str(tmp_path / name), "--inference", str(tmp_path / "inference")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err
