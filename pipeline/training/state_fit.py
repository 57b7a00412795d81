"""How the states fit the model's window: rows whose state was cut, tokens dropped, the longest state in
tokens.

Every family says per row what it keeps of the state (`DecisionFamily.state_cuts`); `fit` sums that over the
training and held-out examples, says it in one progress line, and records it in the run (`TrainRun.states`:
train.json, `--json`, and the flow's MLflow metrics). A state longer than its window loses its end
(`contract.STATE_TRUNCATION`).

    states = fit_of_states(family.state_cuts(train_examples) + family.state_cuts(heldout_examples))
    states.describe()   # "states: 12 of 4,000 rows longer than the 254-token window; 1,234 tokens dropped ..."
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.data.contract import STATE_TRUNCATION

if TYPE_CHECKING:  # annotations only: MLflow logging reads a StateFit without importing the families (torch)
    from pipeline.families.base import StateCut


@dataclass(frozen=True)
class StateFit:
    """The states of the rows a run reads, against the room the model's sequences leave them."""

    rows: int
    """Rows the model reads (train and held out)."""
    rows_truncated: int
    """Rows whose state is longer than its window: the model reads it cut."""
    tokens_dropped: int
    """State tokens the model never reads, summed over the rows."""
    longest_tokens: int
    """The longest state, in the model's tokens."""
    window: int
    """The room a sequence leaves the state, in tokens (the least, where it depends on the question)..."""
    widest_window: int
    """... and the most (the same as `window` where every sequence leaves the state the same room)."""
    truncation: str = STATE_TRUNCATION
    """What is cut from a state longer than its window (`end`: its first tokens are kept)."""

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> StateFit | None:
        """Read back from train.json (None when the run recorded none)."""
        return None if values is None else cls(**values)

    def describe(self) -> str:
        """One progress line: how many rows are cut and how many tokens that drops."""
        window = (
            f"the {self.window:,}-token window"
            if self.window == self.widest_window
            else f"their window ({self.window:,} to {self.widest_window:,} tokens)"
        )
        line = f"states: {self.rows_truncated:,} of {self.rows:,} rows longer than {window}"
        if not self.rows_truncated:
            return f"{line} (the longest is {self.longest_tokens:,} tokens)"
        return f"{line}; {self.tokens_dropped:,} tokens dropped from their {self.truncation}s"

    def metrics(self) -> dict[str, float]:
        """The figures as MLflow metrics (`state_rows_truncated`, `state_tokens_dropped`, ...)."""
        names = ("rows", "rows_truncated", "tokens_dropped", "longest_tokens", "window", "widest_window")
        return {f"state_{name}": float(getattr(self, name)) for name in names}


def fit_of_states(cuts: list[StateCut]) -> StateFit:
    """The summary of per-row cuts (`DecisionFamily.state_cuts`)."""
    rooms = [cut.room for cut in cuts] or [0]
    return StateFit(
        rows=len(cuts),
        rows_truncated=sum(cut.dropped > 0 for cut in cuts),
        tokens_dropped=sum(cut.dropped for cut in cuts),
        longest_tokens=max((cut.tokens for cut in cuts), default=0),
        window=min(rooms),
        widest_window=max(rooms),
    )
