"""The calibration report: accuracy and ECE-15 with bootstrap 95% intervals, the ECE a calibrated model would
show on as many decisions by chance (`ece_noise`), NLL, Brier, classwise ECE and KL from the soft gold, overall,
per question type and per question.

The interval resamples whole records (a row's decisions share a state, so they are not independent; where rows
have a `group`, whole groups, whose rows share a speaker or a source): each
resample draws records with replacement and recomputes the ECE with each decision weighted by its record's
draw count, all resamples at once as one matrix product. On 4,000 decisions the 95% interval of an ECE near
0.02 is about +-0.01 wide, so two versions whose ECEs differ by less are not told apart by it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pipeline.data.contract import QUESTION_TYPES
from pipeline.scoring.decisions import ScoredDecision
from pipeline.scoring.metrics import ECE_BINS, ece_bin_index, expected_calibration_error

RESAMPLES = 1000
NOISE_CHUNK = 100
"""Resamples `calibrated_ece_noise` draws at once: 100 x 100,000 decisions is 80 MB."""
METRICS = (
    "decisions",
    "accuracy",
    "accuracy_low",
    "accuracy_high",
    "nll",
    "brier",
    "ece",
    "ece_low",
    "ece_high",
    "ece_noise",
    "classwise_ece",
    "kl_soft",
)


def calibration_report(
    decisions: list[ScoredDecision],
    probabilities: list[np.ndarray],
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> dict[str, Any]:
    """{"overall": figures, "by_type": {type: figures}, "by_question": {id: figures}}."""
    groups = {"overall": list(range(len(decisions)))}
    by_type = _groups(decisions, lambda d: QUESTION_TYPES[d.qtype])
    by_question = _groups(decisions, lambda d: d.question_id)
    rng = np.random.default_rng(seed)

    def figures(rows: list[int]) -> dict[str, float]:
        return group_figures([decisions[i] for i in rows], [probabilities[i] for i in rows], resamples, rng)

    return {
        "overall": figures(groups["overall"]),
        "by_type": {name: figures(rows) for name, rows in by_type.items()},
        "by_question": {qid: figures(rows) for qid, rows in by_question.items()},
        "bootstrap": {"resamples": resamples, "unit": "record", "interval": 0.95},
    }


def _groups(decisions: list[ScoredDecision], key) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for i, d in enumerate(decisions):
        groups.setdefault(key(d), []).append(i)
    return dict(sorted(groups.items()))


def group_figures(
    decisions: list[ScoredDecision], probabilities: list[np.ndarray], resamples: int, rng: np.random.Generator
) -> dict[str, float]:
    """One slice's figures (overall, a type, a question); the ECE and accuracy intervals from `resamples`
    bootstrap draws of whole records, or of whole groups where the rows have a `group`
    (`ScoredDecision.cluster`)."""
    if not decisions:
        return {name: float("nan") for name in METRICS} | {"decisions": 0}
    confidence = np.array([float(p.max()) for p in probabilities])
    correct = np.array([int(p.argmax()) == d.label for d, p in zip(decisions, probabilities)], dtype=float)
    clusters = [d.cluster for d in decisions]  # rows, or the groups they belong to
    low, high = ece_interval(confidence, correct, clusters, resamples, rng)
    accuracy_low, accuracy_high = accuracy_interval(correct, clusters, resamples, rng)
    gold = [float(p[d.label]) for d, p in zip(decisions, probabilities)]
    brier = [float(((p - np.eye(len(p))[d.label]) ** 2).sum()) for d, p in zip(decisions, probabilities)]
    kl = [_kl(np.asarray(d.target), p) for d, p in zip(decisions, probabilities) if d.soft]
    return {
        "decisions": len(decisions),
        "accuracy": float(correct.mean()),
        "accuracy_low": accuracy_low,
        "accuracy_high": accuracy_high,
        "nll": float(np.mean([-math.log(max(g, 1e-12)) for g in gold])),
        "brier": float(np.mean(brier)),
        "ece": expected_calibration_error(confidence, correct),
        "ece_low": low,
        "ece_high": high,
        "ece_noise": calibrated_ece_noise(confidence, resamples),
        "classwise_ece": classwise_ece(decisions, probabilities),
        "kl_soft": float(np.mean(kl)) if kl else float("nan"),
    }


def _kl(target: np.ndarray, p: np.ndarray) -> float:
    return float((target * (np.log(np.clip(target, 1e-12, 1)) - np.log(np.clip(p, 1e-12, 1)))).sum())


def ece_interval(
    confidence: np.ndarray,
    correct: np.ndarray,
    records: list[int],
    resamples: int,
    rng: np.random.Generator,
    level: float = 0.95,
) -> tuple[float, float]:
    """The percentile bootstrap interval of the ECE, resampling records with replacement, less the bootstrap's
    bias. A resample's ECE is larger than the sample's on average (its bins' gaps are absolute values, so
    resampling noise only adds to them): on a well-calibrated model the plain percentile interval can lie
    wholly above the ECE it is about. Both ends move down by that bias (the resamples' mean over the ECE), at
    least 0."""
    record_of = record_index(records)
    draws = record_draws(record_of, resamples, rng)
    weights = draws[:, record_of].astype(
        np.float64
    )  # [R, decisions]: each decision weighted by its record's draws
    bins = np.eye(ECE_BINS)[ece_bin_index(confidence)]  # [decisions, bins]
    gap = weights @ (bins * (correct - confidence)[:, None])  # [R, bins]: summed (accuracy - confidence)
    resampled = np.abs(gap).sum(axis=1) / weights.sum(axis=1)
    bias = float(resampled.mean()) - expected_calibration_error(confidence, correct)
    low, high = two_sided(resampled, level)
    return max(low - bias, 0.0), max(high - bias, 0.0)


def calibrated_ece_noise(confidence: np.ndarray, resamples: int, level: float = 0.95, seed: int = 0) -> float:
    """The ECE a perfectly calibrated model shows on these confidences by chance, at `level`: each answer drawn
    right with its own confidence (consistency resampling, Broecker and Smith 2007), `resamples` times, and the
    `level` quantile of their ECEs. ECE-15 counts every bin's noise as a gap, so on few decisions it is large
    for any model (about 0.12 on 53 decisions of confidences between 0.5 and 1, 0.04 on 500): an ECE below this
    says nothing against calibration. Its own seed, so the report's other intervals draw as they did."""
    rng = np.random.default_rng(seed)
    bins = np.eye(ECE_BINS)[ece_bin_index(confidence)]  # [decisions, bins]
    eces = []
    for start in range(0, resamples, NOISE_CHUNK):  # [chunk, decisions] at a time: bounded memory
        drawn = rng.uniform(size=(min(NOISE_CHUNK, resamples - start), len(confidence))) < confidence
        gap = (drawn - confidence) @ bins  # [chunk, bins]: summed (right - confidence)
        eces.append(np.abs(gap).sum(axis=1) / len(confidence))
    return float(np.quantile(np.concatenate(eces), level))


def accuracy_interval(
    correct: np.ndarray, records: list[int], resamples: int, rng: np.random.Generator, level: float = 0.95
) -> tuple[float, float]:
    """The percentile bootstrap interval of the accuracy, resampling records with replacement."""
    record_of = record_index(records)
    return two_sided(bootstrap_means(correct, record_of, record_draws(record_of, resamples, rng)), level)


def record_index(records: list[int]) -> np.ndarray:
    """Each decision's record as an index 0..records-1."""
    return np.unique(np.asarray(records), return_inverse=True)[1]


def record_draws(record_of: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """[resamples, records]: how often each record is drawn in each bootstrap resample (with replacement)."""
    n_records = int(record_of.max()) + 1
    return rng.multinomial(n_records, np.full(n_records, 1.0 / n_records), size=resamples)


def bootstrap_means(values: np.ndarray, record_of: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """The mean of `values` (one per decision) in each resample of `draws`, a decision counted as often as its
    record is drawn; resamples that draw none of these decisions' records are left out."""
    n_records = draws.shape[1]
    summed = draws @ np.bincount(record_of, weights=values, minlength=n_records)
    counted = draws @ np.bincount(record_of, minlength=n_records).astype(np.float64)
    return summed[counted > 0] / counted[counted > 0]


def two_sided(samples: np.ndarray, level: float) -> tuple[float, float]:
    """The central `level` percentile interval of bootstrap samples."""
    tail = (1 - level) / 2
    return float(np.quantile(samples, tail)), float(np.quantile(samples, 1 - tail))


def classwise_ece(decisions: list[ScoredDecision], probabilities: list[np.ndarray]) -> float:
    """The mean over option positions j of the ECE of P(option j) against "gold is j" (Kull et al. 2019)."""
    widest = max(len(p) for p in probabilities)
    per_class = []
    for j in range(widest):
        rows = [i for i, p in enumerate(probabilities) if len(p) > j]
        p_j = np.array([probabilities[i][j] for i in rows])
        is_j = np.array([decisions[i].label == j for i in rows], dtype=float)
        per_class.append(expected_calibration_error(p_j, is_j))
    return float(np.mean(per_class))


def report_metrics(report: dict[str, Any], prefix: str = "report") -> dict[str, float]:
    """The report's overall and per-type figures as flat MLflow metric names (`report_choice_ece_high`)."""
    blocks = {"overall": report["overall"], **report["by_type"]}
    return {
        f"{prefix}_{group}_{name}": float(value)
        for group, figures in blocks.items()
        for name, value in figures.items()
        if name != "decisions" and not math.isnan(value)
    }


def report_tags(calibration: dict[str, Any]) -> dict[str, str]:
    """A version's calibration at a glance (the calibrate stage's result): calibrator, ECE with its interval,
    NLL."""
    overall = calibration["report"]["overall"]
    tags = {
        "calibrator": calibration["calibrator"]["kind"],
        "calibration_ece": f"{overall['ece']:.4f} [{overall['ece_low']:.4f}, {overall['ece_high']:.4f}]",
        "calibration_nll": f"{overall['nll']:.4f}",
        "calibration_accuracy": f"{overall['accuracy']:.4f}",
    }
    for name, figures in calibration["report"]["by_type"].items():
        tags[f"calibration_ece_{name}"] = (
            f"{figures['ece']:.4f} [{figures['ece_low']:.4f}, {figures['ece_high']:.4f}]"
        )
    return tags


def report_table(report: dict[str, Any], with_questions: bool = True) -> str:
    """The report as a markdown table: one row overall, one per type and (optionally) one per question."""
    rows = [("overall", report["overall"])] + [(f"type {t}", f) for t, f in report["by_type"].items()]
    if with_questions:
        rows += [(f"question {q}", f) for q, f in report["by_question"].items()]
    lines = [
        "| group | decisions | accuracy | NLL | Brier | ECE-15 [95% CI] | classwise ECE | KL soft |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, f in rows:
        lines.append(
            f"| {name} | {f['decisions']} | {f['accuracy']:.4f} | {f['nll']:.4f} | {f['brier']:.4f} | "
            f"{f['ece']:.4f} [{f['ece_low']:.4f}, {f['ece_high']:.4f}] | {f['classwise_ece']:.4f} | "
            f"{_or_dash(f['kl_soft'])} |"
        )
    return "\n".join(lines)


def _or_dash(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.4f}"
