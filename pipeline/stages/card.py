"""The model card of a registered version: what it was trained on and how, what it answers, how well on the
held-out rows (with intervals), how its calibration was fitted, and what it cannot do. Markdown, built from
what the run logged (`stages.result.RunResult`) and its run folder; the version's description and the run's
`model_card.md`.

    card = model_card(result, "decision-model", "7")
    attach_model_card("decision-model", "7", run_id, card)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.data.contract import QUESTION_TYPES
from pipeline.mlops.registry import client
from pipeline.mlops.tracking import MODELS
from pipeline.rundir import RunFolder
from pipeline.scoring.heldout import load_heldout
from pipeline.stages.result import RunResult

CARD_FILE = "model_card.md"


def model_card(result: RunResult, name: str, version: str) -> str:
    """The card of a tracked, calibrated run as Markdown (sections: data, training, questions, held-out
    figures, calibration, automation, warnings and limits, provenance)."""
    run = RunFolder(result.run_dir)
    report = json.loads(run.calibration_report.read_text()) if run.calibration_report.exists() else {}
    sections = [
        f"# {name} version {version}",
        _data(result),
        _training(result),
        _questions(run, report),
        _figures(result, report),
        _calibration(result),
        _automation(result),
        _limits(result),
        _provenance(result),
    ]
    return "\n\n".join(sections) + "\n"


def attach_model_card(name: str, version: str, run_id: str, card: str) -> None:
    """The card as the version's description and as the run's `model_card.md` artifact."""
    client().update_model_version(name, version, description=card)
    client().log_text(run_id, card, CARD_FILE)


def _data(result: RunResult) -> str:
    split, report = result.validation.split, result.validation.report
    skipped = ", ".join(f"{reason} {n:,}" for reason, n in report.skipped.items()) or "none"
    return "\n".join(
        [
            "## Data",
            f"- source: `{result.tracked.data}`, revision (md5) `{result.tracked.data_md5}`",
            f"- {report.rows:,} rows, {report.decisions:,} decisions; skipped: {skipped}",
            f"- trained on {split.get('train_rows', 0):,} rows ({split.get('train_decisions', 0):,} "
            f"decisions); validation split {split.get('validation_rows', 0):,} rows "
            f"({split.get('validation_decisions', 0):,}); held out {split.get('heldout_rows', 0):,} rows "
            f"({split.get('heldout_decisions', 0):,})",
        ]
    )


def _training(result: RunResult) -> str:
    train, tags = result.train, result.tracked.tags
    base = tags.get("base", result.tracked.params.get("retrain", {}).get("base", "?"))
    lines = [
        "## Training",
        f"- base: `{base}` (md5 `{tags.get('base_md5', '?')}`)",
        f"- family `{train.family}`, method `{train.method}`; {train.steps:,} steps ({train.budget}), "
        f"precision {train.precision}",
    ]
    stopping = train.early_stopping or {}
    if stopping.get("checks") and stopping.get("patience") is not None:
        lines.append(
            f"- early stopping: ended at step {stopping['ended_at']:,}, kept the best check's weights "
            f"(step {stopping['best_step']:,}, validation loss {stopping['best_loss']:.4f})"
        )
    return "\n".join(lines)


def _questions(run: RunFolder, report: dict[str, Any]) -> str:
    """Intended use: the questions it was trained and measured on, with their options."""
    lines = [
        "## Intended use",
        "Answers these questions, one forward pass per state, with calibrated probabilities per option, for "
        "states like its training data's. Other questions are answered by the same head but were never "
        "measured: check them on your own labelled rows (`decision evaluate`) first.",
        "",
        "| question | type | options | held-out decisions |",
        "|---|---|---|---:|",
    ]
    if not run.heldout.exists():
        return "\n".join(lines)
    held = load_heldout(run.heldout)
    types = {d.question_id: QUESTION_TYPES[d.qtype] for d in held.items}
    counts = report.get("by_question", {})
    for question, options in sorted(held.options.items()):
        shown = ", ".join(options[:8]) + (f", ... ({len(options)})" if len(options) > 8 else "")
        decisions = counts.get(question, {}).get("decisions", 0)
        lines.append(f"| {question} | {types.get(question, '?')} | {shown} | {decisions:,} |")
    return "\n".join(lines)


def _figures(result: RunResult, report: dict[str, Any]) -> str:
    heldout = result.heldout
    lines = [
        "## Held-out figures",
        f"{heldout.get('decisions', 0):,} held-out decisions; intervals are 95% record bootstraps; the "
        "calibrator's fit is under Calibration.",
        "",
        "| model | accuracy | record accuracy | ECE | Brier |",
        "|---|---:|---:|---:|---:|",
    ]
    for model in MODELS:  # a bag of words where the run fitted one
        m = heldout.get(model, {})
        if m:
            lines.append(
                f"| {model.replace('_', ' ')} | {m['accuracy']:.4f} | "
                f"{m.get('record_accuracy', float('nan')):.4f} | {m['ece']:.4f} | "
                f"{m.get('brier', float('nan')):.4f} |"
            )
    if report:
        lines += [
            "",
            "| group | decisions | accuracy [95% CI] | ECE-15 [95% CI] | NLL |",
            "|---|---:|---:|---:|---:|",
        ]
        groups = [("overall", report["overall"])] + [
            (f"question {q}", f) for q, f in report["by_question"].items()
        ]
        for group, f in groups:
            lines.append(
                f"| {group} | {f['decisions']:,} | {_interval(f, 'accuracy')} | {_interval(f, 'ece')} | "
                f"{f['nll']:.4f} |"
            )
    return "\n".join(lines)


def _interval(figures: dict[str, float], name: str) -> str:
    if f"{name}_low" not in figures:
        return f"{figures[name]:.4f}"
    return f"{figures[name]:.4f} [{figures[f'{name}_low']:.4f}, {figures[f'{name}_high']:.4f}]"


def _calibration(result: RunResult) -> str:
    calibrator = result.calibration.calibrator
    temperatures = ", ".join(f"{t} {v:.3f}" for t, v in result.calibration.temperatures.items())
    intervals = ", ".join(
        f"{t} {s['temperature']:.2f} [{s['low']:.2f}, {s['high']:.2f}] ({s['decisions']:,} decisions)"
        for t, s in calibrator.get("temperature_intervals", {}).items()
    )
    return "\n".join(
        [
            "## Calibration",
            f"- calibrator `{calibrator.get('kind', '?')}`, chosen by cross-fitted NLL; fitted on the "
            f"{calibrator.get('fitted_on', 'held-out rows')}",
            f"- type temperatures: {temperatures}",
            *(
                [f"- each type's temperature as fitted, with its 95% bootstrap interval: {intervals}"]
                if intervals
                else []
            ),
        ]
    )


def _automation(result: RunResult) -> str:
    """Per question, the certified rule (ε, δ, threshold) and what it automated of the held-out decisions
    (coverage and realised error with 95% intervals), or why it automates nothing."""
    certificates = result.calibration.certificates if result.calibration else {}
    lines = [
        "## Automation",
        "An answer is automated where its calibrated confidence reaches its question's certified threshold: "
        "the error among automated answers is at most ε with probability at least 1 - δ (Learn-then-Test on "
        "rows never trained on: the validation split, with the training rows answered out of fold where it is "
        "small; `scoring.certify`); the held-out figures check it on rows it was not fitted on (95% "
        "Clopper-Pearson intervals). Each question's coverage-risk curve, with the certified point on it: "
        "the run's `plots/coverage_risk.png` (MLflow artifacts).",
    ]
    if not certificates:
        return "\n".join([*lines, "", "- no certificates: this version automates nothing"])
    lines += [
        "",
        "| question | ε | δ | threshold | held-out coverage [95% CI] | realised error [95% CI] |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    why = []
    for question, c in sorted(certificates.items()):
        held = c.get("heldout") or {}
        threshold = "-" if c.get("threshold") is None else f"{c['threshold']:.4f}"
        coverage = _interval(held, "coverage") if held else "-"
        error = _interval(held, "error") if held.get("error") is not None else "-"
        lines.append(
            f"| {question} | {c['target_error']:g} | {c['delta']:g} | {threshold} | {coverage} | {error} |"
        )
        if c.get("threshold") is None:
            why.append(f"- {question} automates nothing: {c.get('reason') or 'not certified'}")
    return "\n".join([*lines, *(["", *why] if why else [])])


def _limits(result: RunResult) -> str:
    train = result.train
    lines = ["## Warnings and known limits"]
    lines += [f"- {warning}" for warning in train.warnings] or [
        "- no question failed the learning check (better than the base and the class prior)"
    ]
    states = train.states
    if states:
        lines.append(
            f"- states: {states.rows_truncated:,} of {states.rows:,} rows longer than the model reads "
            f"({states.tokens_dropped:,} tokens dropped); the longest is {states.longest_tokens:,} tokens"
        )
    lines.append(
        "- figures hold for rows drawn like the held-out split; other data, other questions and other "
        "option sets need their own measurement"
    )
    return "\n".join(lines)


def _provenance(result: RunResult) -> str:
    tracked = result.tracked
    return "\n".join(
        [
            "## Provenance",
            f"- MLflow run `{tracked.run_name or tracked.key[:16]}` (idempotency key `{tracked.key[:16]}`), "
            f"git commit `{tracked.tags.get('git_commit', '?')}`, run folder `{Path(result.run_dir)}`",
            _origin(tracked.tags),
        ]
    )


def _origin(tags: dict[str, str]) -> str:
    """Which flow trained it: `retrain` on params.yaml's settings, or a sweep's best trial (`flows.sweep`)."""
    if "sweep" not in tags:
        return "- trained by the `retrain` flow with params.yaml's settings (not from a sweep)"
    line = (
        f"- the best trial (number {tags.get('sweep_trial', '?')}) of sweep `{tags['sweep']}`, ranked by "
        f"{tags.get('sweep_objective', '?')} on the validation split (never the held-out rows); its "
        f"settings: {tags.get('sweep_settings', '?')}; parent MLflow run "
        f"`{tags.get('sweep_parent_run', '?')}`"
    )
    if "sweep_repeat" in tags:
        line += f"\n- noise floor, the same settings over other seeds: {tags['sweep_repeat']}"
    return line
