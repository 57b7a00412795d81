"""Plots people would rather look at than read: reliability diagrams and confusion matrices, as PNG files."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.data.contract import QUESTION_TYPES
from pipeline.scoring.decisions import ScoredDecision
from pipeline.scoring.metrics import ECE_BINS, ece_bin_index, expected_calibration_error


def pyplot():
    """matplotlib's pyplot on the file-only backend."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def reliability_diagram(
    items: list[ScoredDecision], probabilities: list[np.ndarray], out: Path, title: str
) -> Path:
    """Accuracy against confidence in 15 equal-width (lo, hi] bins, with the ECE in the title."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(4.5, 4.5))
    _reliability_axis(axis, items, probabilities, title)
    return save_figure(plt, figure, out)


def reliability_by_type(
    items: list[ScoredDecision], probabilities: list[np.ndarray], out: Path, title: str
) -> Path:
    """One reliability diagram per question type present, side by side."""
    plt = pyplot()
    present = [(q, name) for q, name in enumerate(QUESTION_TYPES) if any(it.qtype == q for it in items)]
    figure, axes = plt.subplots(
        1, max(1, len(present)), figsize=(4.5 * max(1, len(present)), 4.5), squeeze=False
    )
    for axis, (qtype, name) in zip(axes[0], present):
        chosen = [i for i, it in enumerate(items) if it.qtype == qtype]
        _reliability_axis(
            axis, [items[i] for i in chosen], [probabilities[i] for i in chosen], f"{title}: {name}"
        )
    return save_figure(plt, figure, out)


def coverage_risk(
    curves: dict[str, list[tuple[float, float, float]]],
    certified: dict[str, tuple[float, float] | None],
    target_error: float,
    out: Path,
) -> Path:
    """Per question, the error among automated held-out answers against the share automated (the
    coverage-risk curve), the target error as a line, and each certificate's point on it (coverage, error)."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6.5, 4.5))
    for question, curve in sorted(curves.items()):
        if not curve:
            continue
        coverage, risk = [c for _, c, _ in curve], [r for _, _, r in curve]
        (line,) = axis.plot(coverage, risk, label=question)
        if (point := certified.get(question)) is not None:
            axis.scatter([point[0]], [point[1]], color=line.get_color(), marker="o", zorder=3)
    axis.axhline(target_error, color="black", linestyle="--", linewidth=1, label=f"ε = {target_error:g}")
    axis.set_xlabel("share of answers automated (coverage)")
    axis.set_ylabel("error among automated answers")
    axis.set_title("coverage and risk on the held-out rows (dots: the certified thresholds)")
    axis.set_xlim(0, 1)
    axis.set_ylim(0, None)
    axis.legend(fontsize=8)
    return save_figure(plt, figure, out)


def _reliability_axis(axis, items: list[ScoredDecision], probabilities: list[np.ndarray], title: str) -> None:
    confidence = np.array([p.max() for p in probabilities])
    correct = np.array([int(p.argmax()) == it.label for it, p in zip(items, probabilities)], dtype=float)
    edges = np.linspace(0, 1, ECE_BINS + 1)
    which = ece_bin_index(confidence)
    centers, accuracy = [], []
    for b in range(ECE_BINS):
        chosen = which == b
        if chosen.any():
            centers.append((edges[b] + edges[b + 1]) / 2)
            accuracy.append(correct[chosen].mean())
    axis.plot([0, 1], [0, 1], linestyle="--", color="grey", label="perfect calibration")
    axis.bar(centers, accuracy, width=1 / ECE_BINS, edgecolor="black", alpha=0.7, label="accuracy")
    axis.set(
        xlabel="confidence (top probability)",
        ylabel="accuracy",
        xlim=(0, 1),
        ylim=(0, 1),
        title=f"{title}\nECE {expected_calibration_error(confidence, correct):.4f}, n={len(items)}",
    )
    axis.legend(loc="upper left")


def save_figure(plt, figure, out: Path) -> Path:
    """Lay out, write `out` (its folder made) and close the figure."""
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out


def confusion_matrix(
    items: list[ScoredDecision],
    probabilities: list[np.ndarray],
    options: tuple[str, ...],
    out: Path,
    title: str,
) -> Path:
    """Gold option (rows) against predicted option (columns), counts in the cells."""
    plt = pyplot()
    k = len(options)
    matrix = np.zeros((k, k), dtype=int)
    for item, p in zip(items, probabilities):
        matrix[item.label, int(p.argmax())] += 1
    figure, axis = plt.subplots(figsize=(1.2 + 0.6 * k, 1.0 + 0.6 * k))
    axis.imshow(matrix, cmap="Blues")
    axis.set_xticks(range(k), [o[:12] for o in options], rotation=45, ha="right")
    axis.set_yticks(range(k), [o[:12] for o in options])
    for (row, column), value in np.ndenumerate(matrix):
        axis.text(column, row, str(value), ha="center", va="center", fontsize=8)
    axis.set(xlabel="predicted", ylabel="gold", title=title)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out


def loss_curve(steps: list[dict[str, float]], out: Path, title: str = "training loss") -> Path:
    """Mean training loss per logging step, with the learning rate on a second axis."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6, 3.5))
    x = [s["step"] for s in steps]
    axis.plot(x, [s["loss"] for s in steps], marker="o", markersize=3, label="loss")
    axis.set(xlabel="optimizer step", ylabel="mean soft cross-entropy", title=title)
    rate = axis.twinx()
    rate.plot(x, [s["lr"] for s in steps], color="grey", linestyle=":", label="learning rate")
    rate.set_ylabel("learning rate")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out


def write_plots(
    items: list[ScoredDecision],
    probabilities: list[np.ndarray],
    options: dict[str, tuple[str, ...]],
    folder: Path,
    reliability: str = "reliability.png",
    title: str = "all decisions",
) -> list[Path]:
    """A reliability diagram of every decision and one confusion matrix per question id (`options` names the
    axes), as PNG files in `folder`."""
    written = [reliability_diagram(items, probabilities, folder / reliability, title)]
    for question_id in sorted({it.question_id for it in items}):
        chosen = [i for i, it in enumerate(items) if it.question_id == question_id]
        written.append(
            confusion_matrix(
                [items[i] for i in chosen],
                [probabilities[i] for i in chosen],
                options[question_id],
                folder / f"confusion_{_safe(question_id)}.png",
                f"question {question_id}",
            )
        )
    return written


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:64]
