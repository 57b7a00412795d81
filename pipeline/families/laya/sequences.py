"""How the laya family lays a question into Laya-layout sequences: one when its options fit, else several.

laya.Agent reads a question in one sequence (`laya.common.build_sequence`) whenever every option marker lands
inside `max_len`, cutting the options to share `head_max_len` when it must (docs/training.md, "Model
families"). We read such a question in that very sequence, token for token, so our answers are laya.Agent's. A
question whose options do not fit one sequence (a choice among a hundred options) is read in parts: each part
is an ordinary Laya-layout sequence with the same question and state and a consecutive run of the options, as
many whole options as fit `head_max_len` beside the instructions. The parts' option logits are joined in
option order and take one softmax (see `items.join_logits`), so the answer is one distribution over every
option.

    parts = question_parts(loaded, question, state_token_ids(loaded, state))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.data.contract import NOUL_OPTIONS, QUESTION_TYPE_IDS, Question, state_text
from pipeline.families.base import BadQuestion, StateCut
from pipeline.families.laya_layout import LoadedModel

LAYA_CUT_BELOW = 16
"""laya's `build_head` cuts every option short when fewer head tokens than this are left beside them: a part
keeps at least this many for the instructions, so its options stay whole."""
UNLIMITED = 1 << 30  # a head budget nothing reaches: `build_head` then cuts neither options nor instructions


@dataclass(frozen=True, slots=True)
class Part:
    """One Laya-layout sequence: its token ids, the [MASK] position of each option it holds, the question
    type, and what it keeps of the state (not compared: two parts of the same ids are the same sequence)."""

    ids: tuple[int, ...]
    markers: tuple[int, ...]
    qtype: int
    state: StateCut | None = field(default=None, compare=False)

    def __len__(self) -> int:
        return len(self.ids)


def question_parts(loaded: LoadedModel, question: Question, state_ids: list[int]) -> tuple[Part, ...]:
    """The sequences the model reads `question` in about one state (its `state_token_ids`), options in order.

    One sequence, exactly laya's, when every option marker fits `max_len`; else one per run of `option_runs`.
    BadQuestion when a run does not fit either: the state never takes room from the options (it is cut to what
    the question leaves), so that happens only to a model whose `max_len` barely exceeds its `head_max_len`.
    """
    internal, qtype = internal_question(question), QUESTION_TYPE_IDS[question.type]
    whole = _sequence(loaded, internal, qtype, state_ids)
    if len(whole.markers) == len(question.options):
        return (whole,)
    runs = option_runs(loaded, internal)
    parts = tuple(_sequence(loaded, internal, qtype, state_ids, run) for run in runs)
    for part, run in zip(parts, runs):
        if len(part.markers) < len(run):
            raise BadQuestion(
                f"questions.{question.id}: option {run[len(part.markers)]} does not fit a sequence of "
                f"max_len={loaded.max_len} tokens beside the question (head_max_len={loaded.head_max_len})",
                question.id,
            )
    return parts


def option_runs(loaded: LoadedModel, question: dict[str, Any]) -> list[range]:
    """Consecutive runs of a question's options (laya's internal form), each as many whole options as fit
    `head_max_len` beside the instructions, which keep all their tokens or, when longer, half the head."""
    from laya.common import build_head

    # Every option whole (at most 48 tokens, as in any sequence) and the instructions uncut.
    ids, markers, _stats = build_head(loaded.tokenizer, question, UNLIMITED)
    lengths = [end - start for start, end in zip(markers, [*markers[1:], len(ids) - 1])]
    instructions = markers[0] - 2  # the tokens between [CLS] and the first [SEP]
    head = loaded.head_max_len
    budget = head - max(LAYA_CUT_BELOW, min(instructions, head // 2))
    runs, start, used = [], 0, 0
    for index, length in enumerate(lengths):
        if index > start and used + length > budget:
            runs.append(range(start, index))
            start, used = index, 0
        used += length
    return [*runs, range(start, len(lengths))]


def _sequence(
    loaded: LoadedModel, question: dict[str, Any], qtype: int, state_ids: list[int], run: range | None = None
) -> Part:
    from laya.common import build_sequence

    order = None if run is None else list(run)  # None: every option, as laya.Agent asks for them
    # truncate_left=False: the state keeps its first tokens and loses its end (contract.STATE_TRUNCATION)
    ids, markers, cut = build_sequence(
        loaded.tokenizer,
        None,
        question,
        loaded.max_len,
        loaded.head_max_len,
        option_order=order,
        truncate_left=False,
        state_ids=state_ids,
        return_truncation_stats=True,
    )
    kept = cut["state_tokens_used"]
    # The head, the kept state and the closing [SEP] fill `ids`: the room is what the head left.
    state = StateCut(len(state_ids), kept, loaded.max_len - len(ids) + kept)
    return Part(tuple(ids), tuple(markers), qtype, state)


def option_problem(loaded: LoadedModel, question: Question) -> str | None:
    """Why the model cannot learn from `question` (a reason of `items.ITEM_REASONS`), or None; the same for
    every state, since the options sit before the state in every sequence."""
    try:
        parts = question_parts(loaded, question, [])
    except BadQuestion:
        return "options_beyond_max_len"
    internal = internal_question(question)
    split = len(parts[0].markers) < len(question.options)
    orders = [list(run) for run in option_runs(loaded, internal)] if split else [None]
    spans = [span for order in orders for span in _option_spans(loaded, internal, order)]
    return "options_collapsed" if len(set(spans)) < len(spans) else None


def _option_spans(
    loaded: LoadedModel, question: dict[str, Any], order: list[int] | None
) -> list[tuple[int, ...]]:
    """Each option's tokens ([MASK] first) in the head laya builds for the options of `order` (None: all): two
    options cut to the same tokens cannot be told apart."""
    from laya.common import build_head

    ids, markers, _stats = build_head(loaded.tokenizer, question, loaded.head_max_len, option_order=order)
    return [tuple(ids[start:end]) for start, end in zip(markers, [*markers[1:], len(ids) - 1])]


def state_token_ids(loaded: LoadedModel, state: Any) -> list[int]:
    """The state's token ids as every sequence of it carries them (mask tokens blanked), all of them: each
    sequence keeps what its room allows (`Part.state` says how many)."""
    from laya.common import encode_text

    text = state_text(state).replace(loaded.tokenizer.mask_token, " ")
    return encode_text(loaded.tokenizer, text, add_special_tokens=False)["input_ids"]


def internal_question(question: Question) -> dict[str, Any]:
    """A validated question in laya's internal form (`t`, `ins`, `crit`)."""
    if question.type == "choice":
        criteria: Any = dict(zip(question.options, question.descriptions))
    elif question.type == "score":
        criteria = [d if d is not None else f"level {i}" for i, d in enumerate(question.descriptions)]
    else:
        criteria = {o: d for o, d in zip(NOUL_OPTIONS, question.descriptions) if d is not None} or None
    return {"t": question.type, "ins": question.instructions, "crit": criteria}
