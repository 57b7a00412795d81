"""Promotion to serving: the gate, the `challenger`/`champion` aliases, their history, and rollback.

A new version always gets `challenger`. `champion` moves only through the gate (champion and challenger scored
now on the same held-out decisions, every check read by its interval: the challenger better beyond a paired
record bootstrap's noise, by a lower NLL or by more certified coverage on some question; worse on nothing beyond
it: accuracy not below the champion's by more than `max_accuracy_drop`, no question less accurate or automated
less, no realised error above ε; its calibrated ECE not above `max_ece` beyond noise; its smoke test passed) or
by hand (`decision promote VERSION`, which still refuses a version whose smoke test
failed unless forced). Every alias move is appended to the registered model's history (who, when, from, to,
why), so `decision rollback` moves `champion` back one step. A server following `@champion` picks each move
up.

A version trained with --allow-unpinned (tagged `allow_unpinned=true`) is held by the gate and refused by
`decision promote` unless forced.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import math
from dataclasses import dataclass, field
from typing import Any

from pipeline.config import PromoteConfig
from pipeline.mlops.registry import client
from pipeline.scoring.certified_coverage import CoverageDifference
from pipeline.scoring.paired import PairedComparison

CHAMPION, CHALLENGER = "champion", "challenger"
HISTORY_TAG = "alias_history"
HISTORY_KEPT = 30  # entries; a registered-model tag holds a few kB
SMOKE_TAG, GATE_TAG, GATE_REASONS_TAG = "smoke", "gate", "gate_reasons"
# Per question: the challenger's accuracy gain over the champion, and its verdict.
GATE_QUESTIONS_TAG = "gate_questions"
# Per question: each model's certified coverage on the same decisions, the difference, the challenger's error.
GATE_COVERAGE_TAG = "gate_coverage"
UNPINNED_TAG = "allow_unpinned"
"""Tagged `true` on the run and version of a retraining that ran with --allow-unpinned (not every input pinned
by DVC): the gate holds such a version and `promote_version` wants force."""
UNPINNED_REASON = "trained on unpinned inputs (--allow-unpinned); promote by hand with --force"


class PromotionRefused(RuntimeError):
    """A version that may not become champion (failed smoke test, unknown version, nothing to roll back
    to)."""


@dataclass(frozen=True)
class Verdict:
    promote: bool
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"promote": self.promote, "reasons": self.reasons}


def gate(
    candidate: dict[str, float],
    comparison: PairedComparison | None,
    smoke_passed: bool,
    config: PromoteConfig,
    learning_warnings: list[str] | None = None,
    unpinned: bool = False,
    worse_questions: list[str] | None = None,
    bag_of_words: float | None = None,
    coverage: list[CoverageDifference] | None = None,
) -> Verdict:
    """Whether the candidate may replace the champion; every reason is given, passing or not. Every check reads
    an interval, never a point alone: a figure holds the candidate only where its 95% interval lies wholly on
    the wrong side.

    `candidate` holds its calibrated held-out figures, with `ece_low`/`ece_high` and
    `accuracy_low`/`accuracy_high` (their 95% record-bootstrap intervals; without them the points are read);
    `comparison` champion and candidate scored now on the same decisions (None: no champion yet); `unpinned`:
    it was trained with --allow-unpinned, so it is held whatever its figures. `worse_questions`: the questions
    on which the champion is more accurate beyond the bootstrap noise (same decisions); any one holds the
    candidate, however it does overall. `bag_of_words`: the held-out accuracy of the run's bag of words (None:
    not scored), gated on with `promote.min_accuracy_over_bag_of_words`. `coverage`: per question, what each
    model's certificates automate of the same decisions (`scoring.certified_coverage`): a question automated
    less beyond noise, or whose realised error is above ε beyond noise, holds the candidate; one automated
    more makes it better than the champion even where its NLL and accuracy tie.
    """
    reasons, ok = [], True
    if unpinned:
        ok = False
        reasons.append(UNPINNED_REASON)
    if learning_warnings and config.refuse_unlearned:
        ok = False
        reasons.append(f"no better than its base or the class prior on {len(learning_warnings)} check(s)")
    if comparison is None:
        reasons.append("no champion yet")
    else:
        ok &= _versus_champion(comparison, coverage or [], config, reasons)
    if worse_questions:
        ok = False
        reasons.append(f"less accurate than the champion beyond noise on {', '.join(worse_questions)}")
    if config.min_accuracy_over_bag_of_words is not None:
        ok &= _versus_bag_of_words(candidate, bag_of_words, config.min_accuracy_over_bag_of_words, reasons)
    ok &= _calibrated(candidate, config.max_ece, reasons)
    ok &= smoke_passed
    reasons.append("smoke test passed" if smoke_passed else "smoke test failed")
    return Verdict(ok, reasons)


def _calibrated(candidate: dict[str, float], max_ece: float, reasons: list[str]) -> bool:
    """ECE above `max_ece` holds the candidate only beyond noise: its interval's lower end above it, and the ECE
    above what a calibrated model shows on as many decisions by chance (`ece_noise`). On a few hundred held-out
    decisions a calibrated model's ECE-15 is often 0.1: the line then says how many decisions would tell."""
    ece, low, noise = candidate["ece"], candidate.get("ece_low"), candidate.get("ece_noise")
    if low is None:
        calibrated = ece <= max_ece
        reasons.append(f"ECE {ece:.4f} {'<=' if calibrated else '>'} {max_ece}")
        return calibrated
    shown = f"ECE {ece:.4f}, 95% interval [{low:.4f}, {candidate['ece_high']:.4f}]"
    if noise is None or noise <= max_ece:
        calibrated = low <= max_ece
        reasons.append(f"{shown}: its lower end {'<=' if calibrated else '>'} {max_ece}")
        return calibrated
    calibrated = low <= max_ece or ece <= noise
    decisions = int(candidate.get("ece_decisions") or 0)
    on = f"on {decisions:,} decisions " if decisions else ""
    # The ECE's chance level falls as one over the square root of the decisions.
    needed = (
        f"; about {math.ceil(decisions * (noise / max_ece) ** 2):,} held-out decisions would tell an ECE "
        f"above {max_ece} from chance"
        if decisions
        else ""
    )
    reasons.append(
        f"{shown}: {'not ' if calibrated else ''}above {max_ece} beyond noise (a calibrated model's ECE {on}"
        f"reaches {noise:.4f} by chance{needed})"
    )
    return calibrated


def _versus_bag_of_words(
    candidate: dict[str, float], words: float | None, margin: float, reasons: list[str]
) -> bool:
    if words is None:
        reasons.append("no bag of words scored (train.bag_of_words_rows: 0) to gate on")
        return False
    high = candidate.get("accuracy_high")
    if high is None:
        ahead = candidate["accuracy"] >= words + margin
        shown = f"accuracy {candidate['accuracy']:.4f}"
    else:
        ahead = high >= words + margin
        shown = f"accuracy {candidate['accuracy']:.4f} (its 95% interval's upper end {high:.4f})"
    reasons.append(f"{shown} {'>=' if ahead else '<'} the bag of words' {words:.4f} + {margin}")
    return ahead


def _versus_champion(
    c: PairedComparison, coverage: list[CoverageDifference], config: PromoteConfig, reasons: list[str]
) -> bool:
    """Better than the champion beyond noise (a lower NLL, or more certified coverage on some question) and
    worse on nothing beyond noise (accuracy, coverage, realised error)."""
    lower_nll = c.nll_gain_low > 0
    reasons.append(
        f"NLL {c.challenger_nll:.4f} vs champion {c.champion_nll:.4f} on {c.decisions} decisions: gain "
        f"{c.nll_gain:+.4f}, its {c.confidence:.0%} lower bound {c.nll_gain_low:+.4f} "
        f"{'>' if lower_nll else '<='} 0"
    )
    not_worse = _accuracy_not_worse(c, config.max_accuracy_drop, reasons)
    less = [d for d in coverage if d.automates_less]
    above = [d for d in coverage if d.error_above_target]
    more = [d for d in coverage if d.automates_more]
    reasons += [f"automates less than the champion beyond noise on {d.line()}" for d in less]
    reasons += [f"realised error above ε beyond noise on {d.line()}" for d in above]
    reasons += [f"automates more than the champion beyond noise on {d.line()}" for d in more]
    if not (lower_nll or more):
        reasons.append("better than the champion on nothing beyond noise (NLL, certified coverage)")
    return (lower_nll or bool(more)) and not_worse and not less and not above


def _accuracy_not_worse(c: PairedComparison, max_drop: float, reasons: list[str]) -> bool:
    """The challenger's accuracy is worse only where the difference's interval lies wholly below -`max_drop`
    (the points, where the comparison has no interval)."""
    if c.accuracy_gain_high is None:
        floor = c.champion_accuracy - max_drop
        not_worse = c.challenger_accuracy >= floor
        reasons.append(
            f"accuracy {c.challenger_accuracy:.4f} {'>=' if not_worse else '<'} {floor:.4f} "
            f"(champion {c.champion_accuracy:.4f} - {max_drop})"
        )
        return not_worse
    not_worse = c.accuracy_gain_high >= -max_drop
    reasons.append(
        f"accuracy {c.challenger_accuracy:.4f} vs champion {c.champion_accuracy:.4f}: difference "
        f"{c.challenger_accuracy - c.champion_accuracy:+.4f}, 95% interval [{c.accuracy_gain_low:+.4f}, "
        f"{c.accuracy_gain_high:+.4f}], its upper end {'>=' if not_worse else '<'} -{max_drop}"
    )
    return not_worse


def current(name: str, alias: str = CHAMPION) -> str | None:
    """The version an alias points at, or None."""
    from mlflow.exceptions import MlflowException

    try:
        return str(client().get_model_version_by_alias(name, alias).version)
    except MlflowException:
        return None


def set_alias(name: str, alias: str, version: str, why: str, who: str | None = None) -> bool:
    """Point `alias` at `version` and append the move to the history; False, with nothing recorded, where it
    points there already (a repeated move would make the next rollback land on the same version)."""
    previous = current(name, alias)
    if previous == str(version):
        return False
    client().set_registered_model_alias(name, alias, version)
    entry = {
        "alias": alias,
        "from": previous,
        "to": str(version),
        "who": who or _who(),
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "why": why,
    }
    _write_history([*history(name), entry][-HISTORY_KEPT:], name)
    return True


def history(name: str) -> list[dict[str, Any]]:
    """Every recorded alias move of the registered model, oldest first."""
    tags = client().get_registered_model(name).tags
    return json.loads(tags.get(HISTORY_TAG, "[]"))


def promote_version(name: str, version: str, force: bool = False, why: str = "promoted by hand") -> bool:
    """Make `version` the champion; refuses one whose smoke test did not pass, or one trained on unpinned
    inputs, unless `force`. False where it is the champion already (nothing is recorded)."""
    tags = client().get_model_version(name, version).tags
    problems = [f"smoke test {tags.get(SMOKE_TAG, 'never ran')}"] if tags.get(SMOKE_TAG) != "passed" else []
    problems += ["trained on unpinned inputs (--allow-unpinned)"] if tags.get(UNPINNED_TAG) == "true" else []
    if problems and not force:
        raise PromotionRefused(
            f"{name} version {version}: {'; '.join(problems)}; use --force to promote anyway"
        )
    return set_alias(name, CHAMPION, version, why + (" (forced)" if problems else ""))


def rollback(name: str) -> str:
    """Move `champion` back to the version it held before the latest promotion; the version it now names."""
    stack = champion_stack(history(name))
    if len(stack) < 2:
        raise PromotionRefused(f"{name}: no earlier champion to roll back to")
    target = stack[-2]
    set_alias(name, CHAMPION, target, f"rollback from version {stack[-1]}")
    return target


def champion_stack(entries: list[dict[str, Any]]) -> list[str]:
    """The champions in order, promotions pushing and rollbacks popping, so rollback goes one step at a
    time."""
    stack: list[str] = []
    for entry in entries:
        if entry["alias"] != CHAMPION:
            continue
        if entry["why"].startswith("rollback") and stack:
            stack.pop()
        elif (
            not stack or stack[-1] != entry["to"]
        ):  # a repeated move (recorded before set_alias skipped them)
            stack.append(entry["to"])
    return stack


def _write_history(entries: list[dict[str, Any]], name: str) -> None:
    client().set_registered_model_tag(name, HISTORY_TAG, json.dumps(entries, separators=(",", ":")))


def _who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
