"""The retrain flow's closing lines: what a user reads after `make run`, held version or promoted."""

import pytest

from flows.retrain import print_summary

SCORES = {"accuracy": 0.77, "record_accuracy": 0.47, "ece": 0.02, "brier": 0.32}


def summary(champion: str | None) -> dict:
    return {
        "data": {"line": "data: data/own/tickets.jsonl at revision 1a2b (the model's first version)"},
        "model": "tickets", "version": "1", "champion": champion,
        "heldout": {"decisions": 40, "base": SCORES, "tuned": SCORES, "calibrated": SCORES},
        "calibrator": {"kind": "type_temperature", "fitted_on": "validation split"},
        "calibration_report": {"overall": {"ece": 0.02, "ece_low": 0.01, "ece_high": 0.04, "nll": 0.6}},
        "smoke": {"passed": True, "agreement": 1.0, "latency_ms": {"p50": 20.0}},
        "gate": ["no better than its base on 1 check(s)"] if champion is None else ["no champion yet"],
        "steps": 12, "train_seconds": 9.0, "mlflow_run_id": "abc", "warnings": [], "notices": [],
    }  # fmt: skip


@pytest.mark.parametrize("champion", [None, "1"])
def test_the_champion_line_and_the_next_steps_follow_the_gate(champion, capsys):
    print_summary(summary(champion), "tickets")
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
