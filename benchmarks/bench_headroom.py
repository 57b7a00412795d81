"""Headroom: how far TF-IDF + logistic regression gets on a data set given more training rows, scored on the same
held-out rows as `bench_quality.py --rows R --heldout H`.

The quality goal for a data set (docs/results.md) is ours beating TF-IDF + LR by 0.05 at R training rows.
Where the bag of words trained on many times R rows still stays below that line, the goal asks more of R rows
than the whole data set gives a bag of words, and a miss says as much about the set (terse states, labels the
text hardly names) as about the model. The figures beside the baseline's at R are the rest of the learning
curve, not a contender: no other model sees the extra rows. On record sets (every state a JSON object) the
tabular baselines of `baseline_tabular.py` (one-hot + LR, gradient boosting) are run at each size too: where a
tabular model on every row stays below the goal line as well, the table holds no more than that for any model
to read.

For the sets drawn from one pool (`quality_sets.POOLED_SETS`: spam, records-hi, records-chile, strikes): the
first R training rows are bench_quality's own, the held-out rows are its own, and the further rows come from
beyond the held-out rows in the same seeded order. It prints a table (accuracy, ECE, Brier and each question's
accuracy at each size, with the goal line), writes `benchmarks/results/bench_headroom.json` and a plot
(`bench_headroom.png`: held-out accuracy against training rows, the goal line across).

    python benchmarks/bench_headroom.py --datasets strikes [--rows 1000] [--heldout 500] [--factors 1,2,4,8,all]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from baseline_tabular import TABULAR_MODELS  # noqa: E402
from bench_quality import run_tabular, run_tfidf  # noqa: E402
from quality_sets import POOLED_SETS, pooled_rows, sample_rows, write_rows  # noqa: E402

RESULTS = HERE / "results"
GOAL_GAIN = 0.05  # the goal: ours >= TF-IDF + LR + 0.05


def training_sizes(rows: int, available: int, factors: list[str]) -> list[int]:
    """Training-row counts for `factors` (multiples of `rows`, or `all`), each at most `available`, in order,
    without repeats."""
    sizes = [available if f == "all" else min(available, rows * int(f)) for f in factors]
    return sorted(set(sizes))


def learning_curve(name: str, rows: int, heldout_rows: int, factors: list[str], work: Path) -> dict:
    """TF-IDF + LR at each training size on bench_quality's held-out rows of `name`, its files under
    `work`."""
    every = sample_rows(pooled_rows(name), sys.maxsize, name)
    held = every[rows : rows + heldout_rows]
    training = every[:rows] + every[rows + heldout_rows :]  # bench_quality's own first
    if len(held) < heldout_rows:
        raise ValueError(f"{name}: {len(every):,} rows, fewer than {rows:,} + {heldout_rows:,}")
    heldout = write_rows(held, work / "heldout.jsonl")
    records = all(isinstance(row["state"], dict) for row in training)
    points = []
    for size in training_sizes(rows, len(training), factors):
        train = write_rows(training[:size], work / f"train-{size}.jsonl")
        result = run_tfidf(train, heldout)
        keys = ("accuracy", "record_accuracy", "ece", "brier", "by_question")
        point = {"train_rows": size, **{k: result[k] for k in keys}}
        if records:
            point["tabular"] = {
                model: run_tabular(model, train, heldout)["accuracy"] for model in TABULAR_MODELS
            }
        print(f"  {name}: {size:,} rows, accuracy {point['accuracy']:.4f}", file=sys.stderr, flush=True)
        points.append(point)
    goal = points[0]["accuracy"] + GOAL_GAIN
    return {
        "dataset": name,
        "rows": rows,
        "heldout_rows": len(held),
        "goal_accuracy": goal,
        "points": points,
        "tabular_models": list(TABULAR_MODELS) if records else [],
    }


def print_table(curves: list[dict]) -> None:
    for curve in curves:
        questions = list(curve["points"][0]["by_question"])
        print(
            f"{curve['dataset']}: {curve['heldout_rows']:,} held-out rows; goal (TF-IDF + LR at "
            f"{curve['rows']:,} rows + {GOAL_GAIN}) = {curve['goal_accuracy']:.4f}"
        )
        header = f"{'train rows':>10} {'x rows':>6} {'acc':>6} {'- goal':>7} {'rec.acc':>7} {'ECE':>6} {'Brier':>6}"
        tabular = curve["tabular_models"]
        print(header + "".join(f" {q[:12]:>12}" for q in questions) + "".join(f" {m:>10}" for m in tabular))
        for p in curve["points"]:
            print(
                f"{p['train_rows']:>10,} {p['train_rows'] / curve['rows']:>6.1f} {p['accuracy']:>6.4f} "
                f"{p['accuracy'] - curve['goal_accuracy']:>+7.4f} {p['record_accuracy']:>7.4f} {p['ece']:>6.4f} "
                f"{p['brier']:>6.4f}"
                + "".join(f" {p['by_question'][q]:>12.4f}" for q in questions)
                + "".join(f" {p['tabular'][m]:>10.4f}" for m in tabular)
            )


def plot(curves: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 4), squeeze=False)
    for ax, curve in zip(axes[0], curves):
        sizes = [p["train_rows"] for p in curve["points"]]
        ax.plot(sizes, [p["accuracy"] for p in curve["points"]], marker="o", label="TF-IDF + LR")
        for model in curve["tabular_models"]:
            ax.plot(sizes, [p["tabular"][model] for p in curve["points"]], marker="s", label=model)
        ax.axhline(
            curve["goal_accuracy"],
            color="tab:red",
            linestyle="--",
            label=f"goal at {curve['rows']:,} rows (+{GOAL_GAIN})",
        )
        ax.set_xscale("log")
        ax.set_title(f"{curve['dataset']} ({curve['heldout_rows']:,} held-out rows)")
        ax.set_xlabel("training rows")
        ax.set_ylabel("held-out accuracy")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--datasets", default="strikes", help=f"comma-separated, of: {', '.join(POOLED_SETS)}"
    )
    parser.add_argument(
        "--rows", type=int, default=1000, help="bench_quality's --rows: the goal's training rows"
    )
    parser.add_argument("--heldout", type=int, default=500, help="bench_quality's --heldout")
    parser.add_argument(
        "--factors",
        default="1,2,4,8,all",
        help="training sizes as multiples of --rows, or all (every row not held out)",
    )
    args = parser.parse_args()
    names = args.datasets.split(",")
    unknown = [n for n in names if n not in POOLED_SETS]
    if unknown:
        parser.error(
            f"--datasets: {', '.join(unknown)} not drawn from one pool; choose from {', '.join(POOLED_SETS)}"
        )
    factors = args.factors.split(",")
    if any(f != "all" and not (f.isdigit() and int(f) > 0) for f in factors):
        parser.error(f"--factors {args.factors}: expected positive whole numbers or all")
    if args.rows < 1 or args.heldout < 1:
        parser.error("--rows and --heldout must be at least 1")
    RESULTS.mkdir(parents=True, exist_ok=True)
    try:
        curves = [
            learning_curve(name, args.rows, args.heldout, factors, HERE / ".cache/headroom" / name)
            for name in names
        ]
    except ValueError as error:
        parser.error(str(error))
    (RESULTS / "bench_headroom.json").write_text(json.dumps(curves, indent=2))
    print_table(curves)
    plot(curves, RESULTS / "bench_headroom.png")
    print(f"wrote {RESULTS / 'bench_headroom.json'} and {RESULTS / 'bench_headroom.png'}")


if __name__ == "__main__":
    main()
