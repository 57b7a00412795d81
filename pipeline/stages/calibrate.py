"""The calibrate stage: the calibrator chosen by cross-fitted NLL on the run's validation logits (a split of
the training rows), the held-out figures before and after (and a bag of words' on the same decisions,
`scoring.bag_of_words`), the calibration report, the trained model's calibrated answers for the smoke test to
compare serving with, the plots, and the novelty gate (`scoring.novelty`) of the fine-tune's own state
vectors. Family-free: it reads logits, the split's states for the bag of words, and state vectors through the
family interface (`DecisionModel.state_vectors`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.config import CertifyConfig
from pipeline.data.contract import state_text
from pipeline.data.split import SplitData
from pipeline.families import load_decision_model
from pipeline.rundir import RunFolder
from pipeline.scoring.bag_of_words import BAG_OF_WORDS, bag_of_words, behind_bag_of_words
from pipeline.scoring.calibration import loose_temperatures, plain_probabilities, temperature_spreads
from pipeline.scoring.calibrators import choose_calibrator
from pipeline.scoring.certify import (
    AutomationReport,
    Certificate,
    automation_report,
    certificates_json,
    certify,
    uncertified,
)
from pipeline.scoring.heldout import HeldOut, load_heldout, pooled, save_expected
from pipeline.scoring.metrics import detailed_metrics
from pipeline.scoring.novelty import MAX_BANK, fit_novelty, novelty_bytes
from pipeline.scoring.plots import coverage_risk, reliability_by_type, reliability_diagram, write_plots
from pipeline.scoring.report import calibration_report, report_table

NO_VALIDATION = (
    "no validation split (the training rows gave fewer than validate.validation_min_decisions, or "
    "validate.validation_fraction is 0), so held-out labels fitted the calibrator"
)


@dataclass(frozen=True)
class CalibrationResult:
    """What the calibrate stage chose and measured (`calibration.json`)."""

    temperatures: dict[str, float]
    """Each question type's temperature, by type name."""
    notes: dict[str, str]
    """Why a type kept T = 1 (too few decisions, no gain), by type."""
    calibrator: dict[str, Any]
    """The chosen calibrator's kind, each kind's cross-fitted NLL, what it was fitted on (`fitted_on`), and
    each type's temperature with its bootstrap interval (`temperature_intervals`, `scoring.calibration`)."""
    heldout: dict[str, Any]
    """The held-out figures of the base and the fine-tune at T = 1, of the calibrated fine-tune and, with
    `bag_of_words_rows`, of a bag of words (`scoring.bag_of_words`; its `rows` and `seconds` too)."""
    report: dict[str, Any]
    """The calibration report's overall and per-type figures."""
    plots: list[str]
    validation: dict[str, Any] = field(default_factory=dict)
    """The validation split's figures, calibrated by cross-fitting over it (what a sweep ranks its trials by:
    no held-out label involved); empty without a validation split."""
    certificates: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each question's automation rule (`scoring.certify.Certificate.to_dict`), certified on the validation split."""
    automation: dict[str, Any] = field(default_factory=dict)
    """What the certificates automate on the held-out rows, per question and overall, with 95% intervals
    (`scoring.certify.AutomationReport.to_dict`)."""
    novelty: dict[str, Any] | None = None
    """The novelty gate fitted on the fine-tune's state vectors (`scoring.novelty.NoveltyGate.summary`); None
    without a split or a fine-tune folder."""
    notices: list[str] = field(default_factory=list)
    """What a user should look at that is no failure: the fine-tune answering fewer held-out decisions right
    than its bag of words (`scoring.bag_of_words.behind_bag_of_words`); temperatures the validation split pins
    only loosely (`scoring.calibration.loose_temperatures`)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def calibrate_stage(
    run_dir: str | Path,
    soft: bool = False,
    bag_of_words_rows: int = 0,
    say: Callable[[str], None] | None = None,
    bag_of_words_cache: Path | None = None,
    certify_config: CertifyConfig = CertifyConfig(),
) -> CalibrationResult:
    """Calibrator, figures and report from `validation.npz` and `heldout.npz` into the run folder; plots under
    `plots/`.

    The calibrator is chosen and fitted on the validation split (carved from the training rows), with the
    training rows answered out of fold where the train stage answered them (`out_of_fold.npz`: a small
    validation split), and the held-out decisions are scored once with it: no held-out label reaches anything
    fitted. A run with neither (too few training rows; `validate.validation_fraction` 0, and no out-of-fold
    answers) falls back to cross-fitting on the held-out rows, and `calibrator.fitted_on` says so. With `bag_of_words_rows`
    (`train.bag_of_words_rows`), a bag of words fitted on up to that many of the split's training rows is
    scored on the same held-out decisions (`say` gets a line before it starts: on tens of thousands of long
    states it takes a minute or more). With `bag_of_words_cache` (a folder runs on one split share: a
    sweep's), its figures are kept there by the split's and the held-out decisions' digest and read back by
    every later run on them, not fitted again.

    Each question's automation rule is certified (`certify_config`, `scoring.certify`) on the same decisions'
    cross-fitted calibrated answers, never on the held-out rows (without them, nothing is certified), and what
    it automates on the held-out rows is measured with intervals.
    """
    run = RunFolder(run_dir)
    held = load_heldout(run.heldout)  # with their rows' groups, as the train stage saved them
    pool, described = _fitting_pool(run)
    validated = pool is not None
    fit_on = pool or held
    choice = choose_calibrator(fit_on.items, fit_on.tuned_logits, soft)
    calibrator = choice.calibrator
    spreads = temperature_spreads(fit_on.items, fit_on.tuned_logits, soft)
    run.calibrator.write_text(json.dumps(calibrator.to_json(), indent=2))
    served = calibrator.apply(held.items, held.tuned_logits)  # what the export will answer
    save_expected(run.expected_answers, held.items, served)
    validation: dict[str, Any] = {}
    if validated:  # no held-out label reached the calibrator: what it serves is the held-out figure
        calibrated = served
        fitted_on = described
        validation = {"decisions": len(fit_on.items), **detailed_metrics(fit_on.items, choice.cross_fitted)}
    else:
        calibrated = choice.cross_fitted
        fitted_on = f"held-out rows, cross-fitted: {NO_VALIDATION}"
    report = calibration_report(held.items, calibrated)
    run.calibration_report.write_text(json.dumps(report, indent=2))
    run.calibration_report.with_suffix(".md").write_text(report_table(report) + "\n")
    heldout = {
        "decisions": len(held.items),
        "base": detailed_metrics(held.items, plain_probabilities(held.base_logits)),
        "tuned": detailed_metrics(held.items, plain_probabilities(held.tuned_logits)),
        "calibrated": detailed_metrics(held.items, calibrated),
        **_bag_of_words(run, held, bag_of_words_rows, say or (lambda line: None), bag_of_words_cache),
    }
    fitted = choice.cross_fitted if validated else None  # never the held-out rows
    certificates, automation = _certified(run, fit_on, fitted, held, served, certify_config)
    result = CalibrationResult(
        temperatures=calibrator.by_name(),
        notes=dict(calibrator.notes),
        calibrator={
            "kind": calibrator.kind,
            "cross_fitted_nll": choice.nll,
            "fitted_on": fitted_on,
            "temperature_intervals": spreads,
        },
        heldout=heldout,
        report={"overall": report["overall"], "by_type": report["by_type"]},
        plots=_write_plots(held, calibrator.kind, served, calibrated, run.plots)
        + _automation_plot(automation, certificates, certify_config, run.plots),
        validation=validation,
        certificates={q: c.to_dict() for q, c in certificates.items()},
        automation=automation.to_dict(),
        novelty=_novelty(run, certify_config),
        notices=[line for line in [behind_bag_of_words(heldout), loose_temperatures(spreads)] if line],
    )
    run.calibration.write_text(json.dumps(result.to_dict(), indent=2))
    return result


def _fitting_pool(run: RunFolder) -> tuple[HeldOut | None, str]:
    """What the calibrator and the certificates are fitted on, and its description: the validation split,
    with the training rows answered out of fold where the train stage answered them (a small validation
    split); None where the run has neither (the held-out rows' fallback)."""
    parts = [
        (load_heldout(path), name)
        for path, name in (
            (run.validation_logits, "validation split: {:,} decisions carved from the training rows"),
            (run.out_of_fold, "training rows answered out of fold: {:,} decisions"),
        )
        if path.exists()
    ]
    if not parts:
        return None, ""
    described = "; ".join(name.format(len(part.items)) for part, name in parts)
    return pooled([part for part, _ in parts]), described


NOVELTY_FIT_STATES = 200
"""Fewer validation states than this pin the gate's 0.99 quantile poorly: a fifth of the training states joins
them."""


def _novelty(run: RunFolder, config: CertifyConfig) -> dict[str, Any] | None:
    """The novelty gate of the fine-tune's state vectors, written to the run folder (`novelty.npz`): the bank
    from the training states, the threshold at `certify.novelty_quantile` of the validation states' distances
    (with fewer than `NOVELTY_FIT_STATES` of them, also of a fifth of the training states kept out of the
    bank). None, and no file, without a saved split or a fine-tune folder."""
    run.novelty.unlink(missing_ok=True)
    if not run.split.is_file() or not run.finetune.is_dir():
        return None
    split = SplitData.load(run.split).split
    training = _distinct_states(split.train)
    checked = _distinct_states(split.validation)
    if len(checked) < NOVELTY_FIT_STATES:  # few validation states: more the bank never holds, from training
        cut = max(1, len(training) // 5)
        training, checked = training[cut:], checked + training[:cut]
    if not training or not checked:
        return None
    model = load_decision_model(run.finetune)
    longest = max(len(state_text(state)) for state in training + checked)
    gate = fit_novelty(
        model.state_vectors(training),
        model.state_vectors(checked[:MAX_BANK]),
        config.novelty_quantile,
        longest=longest,
    )
    run.novelty.write_bytes(novelty_bytes(gate))
    return gate.summary()


def _distinct_states(records: list) -> list[Any]:
    """The records' states, each distinct text once, in a fixed random order (at most `MAX_BANK` x 2)."""
    unique = list({state_text(r.state): r.state for r in records}.values())
    order = np.random.default_rng(0).permutation(len(unique))[: 2 * MAX_BANK]
    return [unique[i] for i in order]


NOT_CERTIFIED_WITHOUT_VALIDATION = (
    "no validation split to certify on (the held-out rows measure the rule, and are never used to fit it)"
)


def _certified(
    run: RunFolder,
    fit_on: HeldOut,
    fitted: list[np.ndarray] | None,
    held: HeldOut,
    served: list[np.ndarray],
    config: CertifyConfig,
) -> tuple[dict[str, Certificate], AutomationReport]:
    """The certificates, fitted on `fitted` (the validation split's cross-fitted calibrated answers; None:
    nothing certified), written to the run folder, and what they automate of the held-out answers `served`."""
    if fitted is None:
        certificates = uncertified(held.items, config, NOT_CERTIFIED_WITHOUT_VALIDATION)
    else:
        certificates = certify(fit_on.items, fitted, config)
    report = automation_report(held.items, served, certificates, config.score_error)
    options = held.options | fit_on.options
    held_figures = {q: asdict(figures) for q, figures in report.by_question.items()}
    certificates = {
        q: replace(c, options=tuple(options.get(q, ())), heldout=held_figures.get(q))
        for q, c in certificates.items()
    }
    run.certificates.write_text(certificates_json(certificates))
    return certificates, report


def _automation_plot(
    report: AutomationReport, certificates: dict[str, Certificate], config: CertifyConfig, folder: Path
) -> list[str]:
    """The coverage-risk curves of the held-out rows with each certificate's point on them."""
    points = {
        q: (f.coverage, f.error) if f.error is not None else None for q, f in report.by_question.items()
    }
    return [str(coverage_risk(report.curves, points, config.target_error, folder / "coverage_risk.png"))]


def _bag_of_words(
    run: RunFolder, held: HeldOut, max_rows: int, say: Callable[[str], None], cache: Path | None = None
) -> dict[str, Any]:
    """{BAG_OF_WORDS: its figures on the held-out decisions}, or {} when off or the run folder has no split;
    read from `cache` where a run on the same split and decisions left them there."""
    if max_rows < 1 or not run.split.exists():
        return {}
    kept = cache / f"bag_of_words-{_split_digest(run, held, max_rows)}.json" if cache is not None else None
    if kept is not None and kept.is_file():
        figures = json.loads(kept.read_text())
        say(f"bag of words: {figures['accuracy']:.4f} held out, as fitted once for this split ({kept})")
        return {BAG_OF_WORDS: figures}
    split = SplitData.load(run.split).split
    say(
        f"fitting a bag of words (TF-IDF + logistic regression) on up to {min(max_rows, len(split.train)):,} "
        f"training rows, to score on the same {len(held.items):,} held-out decisions"
    )
    words = bag_of_words(split.train, split.heldout, held.items, max_rows)
    figures = detailed_metrics(held.items, words.probabilities) | {
        "rows": words.rows,
        "seconds": round(words.seconds, 2),
    }
    if kept is not None:
        _write_atomically(kept, json.dumps(figures))
    return {BAG_OF_WORDS: figures}


def _split_digest(run: RunFolder, held: HeldOut, max_rows: int) -> str:
    """What a bag of words' figures depend on: the split's bytes, the row cap and the held-out decisions."""
    digest = hashlib.sha256(run.split.read_bytes())
    digest.update(
        repr((max_rows, [(d.record, d.question_id, d.label, d.target) for d in held.items])).encode()
    )
    return digest.hexdigest()[:16]


def _write_atomically(path: Path, text: str) -> None:
    """`text` at `path` whole or not at all: two runs finishing together each swap in a complete file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{os.getpid()}.partial")
    staged.write_text(text)
    os.replace(staged, path)


def _write_plots(held: HeldOut, kind: str, served, calibrated, folder: Path) -> list[str]:
    tuned = plain_probabilities(held.tuned_logits)
    before = reliability_diagram(held.items, tuned, folder / "reliability_before.png", "fine-tune, T = 1")
    by_type = reliability_by_type(held.items, calibrated, folder / "reliability_by_type.png", "calibrated")
    after = write_plots(
        held.items, served, held.options, folder, "reliability_after.png", f"calibrated ({kind})"
    )
    return [str(p) for p in [before, by_type, *after]]
