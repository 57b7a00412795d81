"""A state longer than the model's window is counted, never cut silently: each family says per row how many of
its state's tokens it keeps (`DecisionFamily.state_cuts`), and a fit sums that into `TrainRun.states`, says it
in a progress line, and the flow logs it to MLflow (`tracking.run_metrics`)."""

from dataclasses import replace

import pytest
import torch

from pipeline.config import TrainConfig
from pipeline.data import synthetic
from pipeline.data.contract import state_text
from pipeline.data.split import TrainSource
from pipeline.families import pick_family
from pipeline.stages.track import run_metrics, state_tags
from pipeline.training.controls import RunHooks
from pipeline.training.fit import TrainRun, fit
from tests.results import run_result
from tests.tiny import JOINT_HEAD, load_joint_on, synthetic_records, write_tiny_causal_lm

LONG = 500  # words: far beyond every tiny model's window
LAYA_RUN = TrainConfig(
    method="lora",
    max_steps=2,
    micro_batch=4,
    grad_accum=1,
    lora_r=4,
    lora_alpha=8,
    log_every=1,
    precision="fp32",
)


def _rows(long_rows: int, short_rows: int) -> list:
    """Synthetic records, the first `long_rows` with a state of LONG words (`great` repeated)."""
    records = synthetic_records(long_rows + short_rows, state_chars=40)
    return [
        replace(r, state=" ".join(["great"] * LONG)) if i < long_rows else r for i, r in enumerate(records)
    ]


def _tokens(tokenizer, state) -> int:
    return len(tokenizer(state_text(state), add_special_tokens=False)["input_ids"])


def test_laya_counts_a_long_state_and_not_a_short_one(tiny_base):
    from laya.common import state_room

    from pipeline.families.laya.sequences import internal_question

    family = pick_family(tiny_base)
    loaded = family.load(tiny_base)
    records = _rows(1, 1)
    examples, _ = family.build_examples(loaded, records)
    long_cut, short_cut = family.state_cuts(examples)
    # laya's own measure of each question's room; the row counts the question that left it the least
    room = min(
        state_room(loaded.tokenizer, internal_question(d.question), loaded.max_len, loaded.head_max_len)
        for d in records[0].decisions
    )
    assert long_cut.tokens == _tokens(loaded.tokenizer, records[0].state) == LONG
    assert (long_cut.kept, long_cut.room, long_cut.dropped) == (room, room, LONG - room)
    assert short_cut.tokens == _tokens(loaded.tokenizer, records[1].state) and short_cut.dropped == 0


def test_joint_on_an_encoder_keeps_max_len_less_cls_and_sep(tiny_base):
    family, loaded = load_joint_on(tiny_base)
    records = _rows(1, 2)
    examples, _ = family.build_examples(loaded, records)
    cuts = family.state_cuts(examples)
    window = loaded.layout.max_len - 2
    assert len(cuts) == 3 and cuts[0].tokens == LONG and cuts[0].room == window
    assert cuts[0].kept == window and cuts[0].dropped == LONG - window
    assert all(
        cut.dropped == 0 and cut.kept == _tokens(loaded.tokenizer, r.state)
        for cut, r in zip(cuts[1:], records[1:])
    )


def test_joint_on_a_causal_lm_counts_the_question_that_left_the_least(tmp_path):
    folder = write_tiny_causal_lm(tmp_path / "lm")
    family = pick_family(folder)
    loaded = family.load(folder, TrainConfig(family="joint", method="head"), torch.device("cpu"))
    records = _rows(1, 1)
    records[0] = replace(records[0], state=" ".join(["great"] * 3 * loaded.layout.max_len))
    examples, _ = family.build_examples(loaded, records)
    long_cut, short_cut = family.state_cuts(examples)
    own = [e.record for e in examples if e.row == 0]
    assert len(own) > 1 and all(len(r) == loaded.layout.max_len for r in own)  # every sequence full
    assert long_cut.tokens == _tokens(loaded.tokenizer, records[0].state)
    assert long_cut.kept == min(r.state_tokens for r in own) == long_cut.room
    assert long_cut.dropped == long_cut.tokens - long_cut.kept > 0 and short_cut.dropped == 0


def _write_rows(path, long_rows: int):
    """24 synthetic rows of short states (they fit every tiny window), the first `long_rows` made LONG
    words."""
    rows = synthetic.generate_rows(24, 0, 0, 40)
    for row in rows[:long_rows]:
        row["state"] = " ".join(["great"] * LONG)
    return synthetic.write_rows(rows, path)


@pytest.fixture(scope="module")
def long_rows_file(tmp_path_factory):
    return _write_rows(tmp_path_factory.mktemp("rows") / "rows.jsonl", 5)


@pytest.mark.parametrize("config", [LAYA_RUN, replace(JOINT_HEAD, max_steps=2)], ids=["laya", "joint"])
def test_a_fit_records_the_states_in_its_run_its_line_and_its_mlflow_metrics(
    tiny_base, long_rows_file, config
):
    lines = []
    trained = fit(
        TrainSource(long_rows_file).validated(), tiny_base, config, "cpu", RunHooks(report=lines.append)
    )
    states = trained.run.states
    assert states.rows == 24 and states.rows_truncated == 5 and states.longest_tokens == LONG
    assert states.tokens_dropped >= 5 * (LONG - states.widest_window) > 0 and states.truncation == "end"
    said = [line for line in lines if line.startswith("states: ")]
    assert said == [
        f"states: 5 of 24 rows longer than {_window(states)}; {states.tokens_dropped:,} tokens "
        "dropped from their ends"
    ]
    described = trained.run.to_dict()  # train.json and --json
    assert described["states"]["rows_truncated"] == 5 and TrainRun.from_dict(described).states == states
    metrics = run_metrics(run_result(train=TrainRun.from_dict(described)))
    assert metrics["state_rows_truncated"] == 5 and metrics["state_tokens_dropped"] == states.tokens_dropped
    assert metrics["state_window"] == states.window and state_tags(trained.run) == {"state_truncation": "end"}


def test_short_states_are_said_to_fit(tiny_base, tmp_path):
    lines = []
    trained = fit(
        TrainSource(_write_rows(tmp_path / "rows.jsonl", 0)).validated(),
        tiny_base,
        replace(LAYA_RUN, max_steps=1),
        "cpu",
        RunHooks(report=lines.append),
    )
    assert trained.run.states.rows_truncated == trained.run.states.tokens_dropped == 0
    longest = trained.run.states.longest_tokens
    assert (
        f"states: 0 of 24 rows longer than {_window(trained.run.states)} (the longest is {longest} tokens)"
        in lines
    )


def _window(states) -> str:
    if states.window == states.widest_window:
        return f"the {states.window}-token window"
    return f"their window ({states.window} to {states.widest_window} tokens)"


WINDOWED = replace(JOINT_HEAD, state_windows=3)


def test_joint_reads_a_long_state_in_windows_of_its_sequence_length(tiny_base):
    family, loaded = load_joint_on(tiny_base, WINDOWED)
    _, one_window = load_joint_on(tiny_base)
    records = _rows(1, 1)
    examples, _ = family.build_examples(loaded, records)
    long_cut, short_cut = family.state_cuts(examples)
    width, tokenizer = loaded.layout.max_len, loaded.tokenizer
    assert (long_cut.room, long_cut.kept) == (3 * (width - 2), 3 * (width - 2))
    assert long_cut.dropped == LONG - 3 * (width - 2) and short_cut.dropped == 0
    ids = examples[0].record.ids
    windows = [ids[start : start + width] for start in range(0, len(ids), width)]
    assert len(windows) == 3 and all(len(w) == width for w in windows)
    assert all(w[0] == tokenizer.cls_token_id and w[-1] == tokenizer.sep_token_id for w in windows)
    assert [t for w in windows for t in w[1:-1]] == tokenizer(
        state_text(records[0].state), add_special_tokens=False
    )["input_ids"][: 3 * (width - 2)]
    short, _ = family.build_examples(one_window, records[1:])
    assert examples[1].record == short[0].record  # a state that fits reads as it always did


def test_each_window_is_read_as_a_sequence_of_its_own(tiny_base):
    _, loaded = load_joint_on(tiny_base, WINDOWED)
    model, width = loaded.model, loaded.layout.max_len
    ids = torch.randint(5, 100, (2, 2 * width + 7))
    mask = torch.ones_like(ids)
    mask[1, width + 3 :] = 0  # the second row: one window and a bit; its third window is all padding
    with torch.inference_mode():
        windowed = model.state_hidden_states(ids, mask)
        for row, windows in ((0, 3), (1, 2)):
            for w in range(windows):
                part = slice(w * width, min((w + 1) * width, ids.shape[1]))
                alone = model.hidden_states(ids[row : row + 1, part], mask[row : row + 1, part])[0]
                real = mask[row, part].bool()
                torch.testing.assert_close(windowed[row, part][real], alone[real], atol=1e-5, rtol=1e-5)


def test_the_windows_are_saved_with_the_model_and_read_back(tiny_base, tmp_path):
    from pipeline.families.joint.layout import export_joint, load_joint

    family, loaded = load_joint_on(tiny_base, WINDOWED)
    export_joint(loaded, tmp_path / "export", (1.0, 1.0, 1.0), {})
    again = load_joint(tmp_path / "export")
    assert again.layout.state_windows == 3 and again.model.state_window == loaded.layout.max_len
    records = _rows(1, 0)
    before, _ = family.build_examples(loaded, records)
    after, _ = family.build_examples(again, records)
    assert before[0].record == after[0].record and after[0].record.state_tokens > loaded.layout.max_len


def test_a_causal_lm_reads_its_state_in_its_one_sequence_whatever_the_windows(tmp_path):
    folder = write_tiny_causal_lm(tmp_path / "lm")
    loaded = pick_family(folder).load(folder, replace(WINDOWED, method="head"), torch.device("cpu"))
    assert loaded.layout.state_windows == 1 and loaded.model.state_window is None


def test_a_long_state_is_cut_without_an_indexing_error_warning(tiny_base, caplog):
    family, loaded = load_joint_on(tiny_base, WINDOWED)
    loaded.tokenizer.deprecation_warnings.clear()  # transformers warns once per tokenizer
    loaded.tokenizer.model_max_length = 64  # as a real tokenizer states its model's positions (MiniLM: 512)
    family.build_examples(loaded, [replace(_rows(1, 0)[0], state=" ".join(["great"] * 5000))])
    assert "indexing errors" not in caplog.text
