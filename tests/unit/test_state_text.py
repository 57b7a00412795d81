"""The state's serialisation as docs/data-format.md shows it, and the state sizes validation reports."""

import re

import orjson
import pytest

from pipeline.data.contract import LONG_STATE_CHARS, parse_state, state_text
from pipeline.data.validate import validate_rows

QUESTION = {"tone": {"type": "choice", "instructions": "Tone?", "criteria": ["bad", "good"]}}


def _states_examples(project_root) -> list[tuple[str, str]]:
    """The (json cell, model text) pairs of the doc's States section, in order."""
    doc = (project_root / "docs/data-format.md").read_text()
    section = doc.split("\n## States\n", 1)[1].split("\n### ", 1)[0]
    blocks = re.findall(r"```(json|text)\n(.*?)\n```", section, flags=re.DOTALL)
    assert [kind for kind, _ in blocks] == ["json", "text"] * (len(blocks) // 2)
    return [(blocks[i][1], blocks[i + 1][1]) for i in range(0, len(blocks), 2)]


def test_the_docs_show_what_the_model_reads(project_root):
    examples = _states_examples(project_root)
    assert len(examples) == 5  # text, a nested record, JSON written as text, a list of turns, bracketed text
    for cell, text in examples:
        assert state_text(parse_state(orjson.loads(cell)["state"])) == text


def test_a_record_keeps_its_key_order_and_its_numbers_and_nulls():
    record = {"z": 1, "a": {"n": None, "x": 2.5}, "m": [True, None, 3]}
    assert state_text(record) == '{"z":1,"a":{"n":null,"x":2.5},"m":[true,null,3]}'
    assert state_text(float("nan")) == "null" and state_text({"x": float("inf")}) == '{"x":null}'


def test_validation_reports_the_longest_state_and_how_many_are_long():
    states = ["short", "x" * (LONG_STATE_CHARS + 1), {"text": "y" * LONG_STATE_CHARS}, None]
    rows = [{"state": s, "questions": QUESTION, "gold": {"tone": "bad"}} for s in states]
    report = validate_rows(rows).report
    # the record's JSON text is longer than its field; the row with no state is not a state
    assert report.states.rows == 3 and report.states.rows_over == 2
    assert report.states.longest_chars == LONG_STATE_CHARS + len('{"text":""}')
    assert report.to_dict()["states"]["rows_over"] == 2


@pytest.mark.parametrize("n", [0, 1])
def test_no_readable_state_reports_zero(n):
    rows = [{"state": None, "questions": QUESTION, "gold": {"tone": "bad"}}] * n
    sizes = validate_rows(rows).report.states
    assert (sizes.rows, sizes.longest_chars, sizes.rows_over) == (0, 0, 0)
