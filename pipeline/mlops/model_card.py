"""The model card of a registered version: what it was trained on and how, what it answers, how well on the held-out
rows (with intervals), how its calibration was fitted, and what it cannot do. Markdown, built from what the run
logged (`tracking.TrainingRecord`) and its run folder; the version's description and the run's `model_card.md`.

    card = model_card(record, "decision-model", "7")
    attach_model_card("decision-model", "7", run_id, card)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.data.contract import QUESTION_TYPES
from pipeline.mlops.registry import client
from pipeline.mlops.tracking import MODELS, TrainingRecord
from pipeline.rundir import RunFolder
from pipeline.scoring.heldout import load_heldout

CARD_FILE = "model_card.md"


def model_card(record: TrainingRecord, name: str, version: str) -> str:
    """The card as Markdown (sections: data, training, questions, held-out figures, calibration, warnings and
    limits, provenance)."""
    run = RunFolder(record.run_dir)
    report = json.loads(run.calibration_report.read_text()) if run.calibration_report.exists() else {}
    sections = [f"# {name} version {version}", _data(record), _training(record), _questions(run, report),
                _figures(record, report), _calibration(record), _limits(record), _provenance(record)]  # fmt: skip
    return "\n\n".join(sections) + "\n"


def attach_model_card(name: str, version: str, run_id: str, card: str) -> None:
    """The card as the version's description and as the run's `model_card.md` artifact."""
    client().update_model_version(name, version, description=card)
    client().log_text(run_id, card, CARD_FILE)


def _data(record: TrainingRecord) -> str:
    split, validation = record.validation.get("split", {}), record.validation
    skipped = ", ".join(f"{reason} {n:,}" for reason, n in validation.get("skipped", {}).items()) or "none"
    return "\n".join([
        "## Data",
        f"- source: `{record.data}`, revision (md5) `{record.data_md5}`",
        f"- {validation.get('rows', 0):,} rows, {validation.get('decisions', 0):,} decisions; skipped: {skipped}",
        f"- trained on {split.get('train_rows', 0):,} rows ({split.get('train_decisions', 0):,} decisions); "
        f"validation split {split.get('validation_rows', 0):,} rows ({split.get('validation_decisions', 0):,}); "
        f"held out {split.get('heldout_rows', 0):,} rows ({split.get('heldout_decisions', 0):,})",
    ])  # fmt: skip


def _training(record: TrainingRecord) -> str:
    train, base = record.train, record.tags.get("base", record.params.get("retrain", {}).get("base", "?"))
    lines = ["## Training",
             f"- base: `{base}` (md5 `{record.tags.get('base_md5', '?')}`)",
             f"- family `{train.get('family')}`, method `{train.get('method')}`; {train.get('steps', 0):,} steps "
             f"({train.get('budget', '')}), precision {train.get('precision', '?')}"]  # fmt: skip
    stopping = train.get("early_stopping") or {}
    if stopping.get("checks") and stopping.get("patience") is not None:
        lines.append(f"- early stopping: ended at step {stopping['ended_at']:,}, kept the best check's weights "
                     f"(step {stopping['best_step']:,}, validation loss {stopping['best_loss']:.4f})")  # fmt: skip
    return "\n".join(lines)


def _questions(run: RunFolder, report: dict[str, Any]) -> str:
    """Intended use: the questions it was trained and measured on, with their options."""
    lines = ["## Intended use",
             "Answers these questions, one forward pass per state, with calibrated probabilities per option, for "
             "states like its training data's. Other questions are answered by the same head but were never "
             "measured: check them on your own labelled rows (`decision evaluate`) first.", "",
             "| question | type | options | held-out decisions |", "|---|---|---|---:|"]  # fmt: skip
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


def _figures(record: TrainingRecord, report: dict[str, Any]) -> str:
    heldout = record.calibration.get("heldout", {})
    lines = ["## Held-out figures",
             f"{heldout.get('decisions', 0):,} held-out decisions; intervals are 95% record bootstraps; the calibrator's "
             "fit is under Calibration.",
             "", "| model | accuracy | record accuracy | ECE | Brier |", "|---|---:|---:|---:|---:|"]  # fmt: skip
    for model in MODELS:  # a bag of words where the run fitted one
        m = heldout.get(model, {})
        if m:
            lines.append(f"| {model.replace('_', ' ')} | {m['accuracy']:.4f} | {m.get('record_accuracy', float('nan')):.4f} | "
                         f"{m['ece']:.4f} | {m.get('brier', float('nan')):.4f} |")  # fmt: skip
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
            lines.append(f"| {group} | {f['decisions']:,} | {_interval(f, 'accuracy')} | {_interval(f, 'ece')} | "
                         f"{f['nll']:.4f} |")  # fmt: skip
    return "\n".join(lines)


def _interval(figures: dict[str, float], name: str) -> str:
    if f"{name}_low" not in figures:
        return f"{figures[name]:.4f}"
    return f"{figures[name]:.4f} [{figures[f'{name}_low']:.4f}, {figures[f'{name}_high']:.4f}]"


def _calibration(record: TrainingRecord) -> str:
    calibrator = record.calibration.get("calibrator", {})
    temperatures = ", ".join(f"{t} {v:.3f}" for t, v in record.calibration.get("temperatures", {}).items())
    intervals = ", ".join(f"{t} {s['temperature']:.2f} [{s['low']:.2f}, {s['high']:.2f}] ({s['decisions']:,} decisions)"
                          for t, s in calibrator.get("temperature_intervals", {}).items())  # fmt: skip
    return "\n".join([
        "## Calibration",
        f"- calibrator `{calibrator.get('kind', '?')}`, chosen by cross-fitted NLL; fitted on the "
        f"{calibrator.get('fitted_on', 'held-out rows')}",
        f"- type temperatures: {temperatures}",
        *([f"- each type's temperature as fitted, with its 95% bootstrap interval: {intervals}"] if intervals else []),
    ])  # fmt: skip


def _limits(record: TrainingRecord) -> str:
    train = record.train
    lines = ["## Warnings and known limits"]
    lines += [f"- {warning}" for warning in train.get("warnings", [])] or [
        "- no question failed the learning check (better than the base and the class prior)"
    ]
    states = train.get("states") or {}
    if states:
        lines.append(f"- states: {states.get('rows_truncated', 0):,} of {states.get('rows', 0):,} rows longer than "
                     f"the model reads ({states.get('tokens_dropped', 0):,} tokens dropped); the longest is "
                     f"{states.get('longest_tokens', 0):,} tokens")  # fmt: skip
    lines.append(
        "- figures hold for rows drawn like the held-out split; other data, other questions and other "
        "option sets need their own measurement"
    )
    return "\n".join(lines)


def _provenance(record: TrainingRecord) -> str:
    return "\n".join([
        "## Provenance",
        f"- MLflow run `{record.run_name or record.key[:16]}` (idempotency key `{record.key[:16]}`), git commit "
        f"`{record.tags.get('git_commit', '?')}`, run folder `{Path(record.run_dir)}`",
        _origin(record.tags),
    ])  # fmt: skip


def _origin(tags: dict[str, str]) -> str:
    """Which flow trained it: `retrain` on params.yaml's settings, or a sweep's best trial (`flows.sweep`)."""
    if "sweep" not in tags:
        return "- trained by the `retrain` flow with params.yaml's settings (not from a sweep)"
    line = (f"- the best trial (number {tags.get('sweep_trial', '?')}) of sweep `{tags['sweep']}`, ranked by "
            f"{tags.get('sweep_objective', '?')} on the validation split (never the held-out rows); its settings: "
            f"{tags.get('sweep_settings', '?')}; parent MLflow run `{tags.get('sweep_parent_run', '?')}`")  # fmt: skip
    if "sweep_repeat" in tags:
        line += f"\n- noise floor, the same settings over other seeds: {tags['sweep_repeat']}"
    return line
