"""The retrain flow's closing lines: what a user reads after `make run`, held version or promoted."""

import pytest

from pipeline.cli.retrain import print_summary
from pipeline.stages.result import RunResult
from tests.results import release, run_result


def summary(champion: str | None) -> RunResult:
    reasons = ("no better than its base on 1 check(s)",) if champion is None else ("no champion yet",)
    return run_result(release=release(model="tickets", version="1", champion=champion, reasons=reasons))


@pytest.mark.parametrize("champion", [None, "1"])
def test_the_champion_line_and_the_next_steps_follow_the_gate(champion, capsys):
    print_summary(
        RunResult.from_dict(summary(champion).to_dict()), "tickets"
    )  # as the flow's process hands it
    printed = " ".join(capsys.readouterr().out.split())  # rich wraps at the terminal's width
    if champion is None:
        assert "champion: none yet;" in printed and "version None" not in printed
        assert (
            "version 1 is held as challenger" in printed
            and "decision promote 1 --name tickets --force" in printed
        )
        # make serve would find no champion to serve: it is not offered as a next step.
        assert "(Decision API on @champion)" not in printed
    else:
        assert "champion: version 1;" in printed and "is held as challenger" not in printed
        assert "make serve NAME=tickets (Decision API on @champion)" in printed
