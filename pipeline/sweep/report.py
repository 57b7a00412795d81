"""What a sweep's parent run carries: the trials as a table (Markdown and JSON), the trade-off plot (held-out
accuracy against ECE, coloured by scoring latency), per-question accuracy across trials, and the noise floor
of the best settings over several seeds.

Trials are ranked by their validation figure only; the held-out columns are reported beside it, never used to
choose.

    rows = [trial_row(number, state, settings, metrics, questions) ...]
    summary_markdown(rows, best=3, objective="validation_nll")
    tradeoff_plot(rows, best, out); question_plot(rows, best, out)
    noise_floor([metrics of each seed]) -> {"accuracy_mean": ..., "accuracy_std": ..., ...}
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.scoring.bag_of_words import BAG_OF_WORDS
from pipeline.scoring.plots import pyplot, save_figure
from pipeline.stages.result import Release

WORDS = f"{BAG_OF_WORDS}_accuracy"  # the metric `stages.track.run_metrics` logs for it
COLUMNS = (
    "validation_nll",
    "validation_accuracy",
    "calibrated_accuracy",
    "calibrated_record_accuracy",
    "calibrated_ece",
    "score_ms_per_decision",
    "steps",
    "train_seconds",
)
"""The trial table's figures, by the metric names every run logs (`stages.track.run_metrics`)."""
NOISE_FIGURES = {
    "accuracy": "calibrated_accuracy",
    "record_accuracy": "calibrated_record_accuracy",
    "ece": "calibrated_ece",
}


@dataclass(frozen=True)
class TrialRow:
    """One trial as the summary shows it."""

    number: int
    state: str
    """finished | pruned | failed."""
    settings: dict[str, Any]
    metrics: dict[str, float] = field(default_factory=dict)
    questions: dict[str, float] = field(default_factory=dict)
    """Held-out calibrated accuracy by question id."""
    run_id: str | None = None
    error: str | None = None
    run_dir: str | None = None
    key: str | None = None
    """The trial's idempotency key (its run folder and MLflow run)."""
    baseline: bool = False
    """params.yaml's own settings (the sweep's first trial, where the space holds them)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SweepSummary:
    """What a sweep did: every trial's row, the best trial and its version's way through the gate, the noise
    floor of its settings over other seeds, and the plots."""

    sweep: str
    """The sweep's key (its first 16 characters name its folder)."""
    folder: str
    parent_run_id: str
    storage: str
    objective: str
    trials: list[TrialRow]
    best: TrialRow | None = None
    release: Release | None = None
    """The best trial's version, registered, smoke-tested and gated (None without a best trial)."""
    noise_floor: dict[str, float] | None = None
    plots: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"release": self.release and self.release.to_dict()}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SweepSummary:
        best, release = values.get("best"), values.get("release")
        parts = {
            "trials": [TrialRow(**row) for row in values["trials"]],
            "best": TrialRow(**best) if best else None,
            "release": Release.from_dict(release) if release else None,
        }
        return cls(**values | parts)

    def text(self) -> str:
        """The summary as a user reads it after `decision sweep`."""
        lines = [summary_markdown(self.trials, self.best and self.best.number, self.objective)]
        if self.noise_floor:
            lines.append(f"noise floor of the best settings: {describe_noise(self.noise_floor)}")
        if self.best and self.release:
            verdict = "promoted to champion" if self.release.promoted else "held as challenger"
            lines.append(
                f"best trial {self.best.number}: {self.release.model} version {self.release.version}, "
                f"{verdict} ({'; '.join(self.release.gate.reasons)})"
            )
        lines.append(f"parent MLflow run {self.parent_run_id}; plots: {', '.join(self.plots)}")
        lines.append(
            "next: make ui (the parent run's description holds this table; select its children and Compare)"
        )
        return "\n".join(lines)


def question_accuracy(report: dict[str, Any]) -> dict[str, float]:
    """Accuracy by question id from a calibration report (`scoring.report.calibration_report`)."""
    return {qid: float(figures["accuracy"]) for qid, figures in report.get("by_question", {}).items()}


def summary_markdown(rows: list[TrialRow], best: int | None, objective: str) -> str:
    """The trials as a Markdown table, best first, then the rest in order; the best trial's row is bold."""
    ordered = sorted(rows, key=lambda row: (row.number != best, row.number))
    names = sorted({name for row in rows for name in row.settings})
    header = ["trial", "state", *names, *COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in ordered:
        cells = [
            f"{row.number} (params.yaml)" if row.baseline else str(row.number),
            row.state,
            *(_cell(row.settings.get(name)) for name in names),
            *(_cell(row.metrics.get(name)) for name in COLUMNS),
        ]
        if row.number == best:
            cells = [f"**{cell}**" for cell in cells]
        lines.append("| " + " | ".join(cells) + " |")
    chosen = (
        f"trial {best} is best by {objective} (validation split)" if best is not None else "no trial finished"
    )
    words = bag_of_words_accuracy(rows)
    beside = "" if words is None else f" A bag of words on the same split: held-out accuracy {words:.4f}."
    closing = f"{len(rows)} trials; {chosen}. Held-out columns are reported, never used to choose.{beside}"
    return "\n".join([*lines, "", closing])


def bag_of_words_accuracy(rows: list[TrialRow]) -> float | None:
    """The held-out accuracy of the bag of words every trial scored on the sweep's one split (the same in
    each; `scoring.bag_of_words`), or None where no trial did (`train.bag_of_words_rows: 0`)."""
    return next((row.metrics[WORDS] for row in rows if WORDS in row.metrics), None)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if value.is_integer():  # steps, counts: MLflow keeps every metric as a float
            return f"{value:.0f}"
        return f"{value:.4f}" if abs(value) < 100 else f"{value:.1f}"
    return json.dumps(value) if isinstance(value, list | dict) else str(value)


def tradeoff_plot(rows: list[TrialRow], best: int | None, out: Path) -> Path | None:
    """Held-out accuracy against calibrated ECE, each finished trial coloured by its scoring latency (ms per
    decision), the best by validation circled; and accuracy against latency beside it. None with no finished
    trial."""
    done = [row for row in rows if row.state == "finished" and "calibrated_accuracy" in row.metrics]
    if not done:
        return None
    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4.5))
    accuracy = [row.metrics["calibrated_accuracy"] for row in done]
    ece = [row.metrics["calibrated_ece"] for row in done]
    latency = [row.metrics.get("score_ms_per_decision", 0.0) for row in done]
    dots = left.scatter(ece, accuracy, c=latency, cmap="viridis", s=60)
    figure.colorbar(dots, ax=left, label="scoring ms per decision")
    right.scatter(latency, accuracy, color="tab:blue", s=60)
    for row, x, y, ms in zip(done, ece, accuracy, latency, strict=True):
        left.annotate(str(row.number), (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
        right.annotate(str(row.number), (ms, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
        if row.number == best:
            left.scatter(
                [x], [y], s=220, facecolors="none", edgecolors="red", linewidths=2, label="best (validation)"
            )
            right.scatter([ms], [y], s=220, facecolors="none", edgecolors="red", linewidths=2)
    left.set(
        xlabel="held-out ECE (calibrated)", ylabel="held-out accuracy (calibrated)", title="accuracy vs ECE"
    )
    right.set(
        xlabel="scoring ms per decision", ylabel="held-out accuracy (calibrated)", title="accuracy vs latency"
    )
    words = bag_of_words_accuracy(rows)
    if words is not None:  # what every trial should beat, as a line across both panels
        for panel in (left, right):
            panel.axhline(words, color="grey", linestyle="--", linewidth=1, label="bag of words")
    if words is not None or (best is not None and any(row.number == best for row in done)):
        left.legend(loc="lower right", fontsize=8)
    return save_figure(plt, figure, out)


def question_plot(rows: list[TrialRow], best: int | None, out: Path) -> Path | None:
    """Held-out accuracy per question (columns) for each finished trial (rows), as a heat map with the values
    written in; None with no finished trial."""
    done = [row for row in rows if row.state == "finished" and row.questions]
    if not done:
        return None
    questions = sorted({qid for row in done for qid in row.questions})
    grid = np.array([[row.questions.get(qid, np.nan) for qid in questions] for row in done])
    plt = pyplot()
    figure, axis = plt.subplots(
        figsize=(max(5.0, 0.9 * len(questions) + 2.5), max(2.5, 0.45 * len(done) + 1.5))
    )
    image = axis.imshow(grid, cmap="RdYlGn", vmin=np.nanmin(grid), vmax=np.nanmax(grid), aspect="auto")
    figure.colorbar(image, ax=axis, label="held-out accuracy")
    axis.set_xticks(range(len(questions)), questions, rotation=45, ha="right")
    axis.set_yticks(
        range(len(done)), [f"trial {row.number}{' (best)' if row.number == best else ''}" for row in done]
    )
    for (i, j), value in np.ndenumerate(grid):
        if np.isfinite(value):
            axis.text(j, i, f"{value:.3f}", ha="center", va="center", fontsize=7)
    axis.set_title("per-question accuracy across trials")
    return save_figure(plt, figure, out)


def noise_floor(runs: list[dict[str, float]]) -> dict[str, float]:
    """Mean and standard deviation (n - 1) over seeds of held-out accuracy, record accuracy and ECE, with the
    seed count: a difference between two fine-tunes smaller than the std is within noise."""
    floor: dict[str, float] = {"seeds": float(len(runs))}
    for name, metric in NOISE_FIGURES.items():
        values = np.array(
            [float(run.get(metric, np.nan)) for run in runs]
        )  # a diverged run's NaN shows as NaN
        floor[f"{name}_mean"] = float(values.mean())
        # One seed has no spread to measure: NaN (null in JSON), never a 0 that would say there is no noise.
        floor[f"{name}_std"] = float(values.std(ddof=1)) if len(values) > 1 else float("nan")
    return floor


def describe_noise(floor: dict[str, float]) -> str:
    """The noise floor in a line."""
    seeds = int(floor["seeds"])
    if seeds == 1:
        return (
            f"1 seed: accuracy {floor['accuracy_mean']:.4f}, record accuracy "
            f"{floor['record_accuracy_mean']:.4f}, ECE {floor['ece_mean']:.4f} (one seed has no spread; "
            "--repeat-best 2 or more measures it)"
        )
    return (
        f"{seeds} seed{'' if seeds == 1 else 's'}: accuracy {floor['accuracy_mean']:.4f} ± "
        f"{floor['accuracy_std']:.4f}, record accuracy {floor['record_accuracy_mean']:.4f} ± "
        f"{floor['record_accuracy_std']:.4f}, ECE {floor['ece_mean']:.4f} ± {floor['ece_std']:.4f} (mean ± "
        "std)"
    )
