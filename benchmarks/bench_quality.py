"""Model quality: our default fine-tune against TF-IDF + logistic regression and laya's own trainer, on VADER
and more real data sets: text, terse reports, long text and records (`quality_sets.py` says what they are,
where they come from and their licences).

For each data set, one after the other in this process, on the same training rows and the same held-out rows:
- ours: `decision finetune` with params.yaml's defaults (`pipeline.stages.finetune.finetune`), the held-out rows
  given as `eval_data`, so no held-out row is trained on; params.yaml's validation split (10% of the training
  decisions) is carved from the training rows and fits the calibrator, the other training rows are trained on;
  accuracy, record accuracy, ECE and Brier are the calibrated figures, each held-out row scored once; wall
  seconds cover the whole chain (validation, features, training, scoring, calibration, export). The `uncal.`
  column is ours before calibration. `--train KEY=VALUE` and `--validate KEY=VALUE` set any param for one run
  (`--validate validation_fraction=0` is the protocol before: the calibrator cross-fitted on held-out rows).
- laya: `laya.train.finetune` (its defaults: full fine-tuning, 4 epochs) from the same MiniLM snapshot, stopped
  when it has used ours' wall seconds; it trains on the first rows a 15 decisions/s pace (laya.train's, measured
  on a 2-core CPU) gets through in that time, so its one epoch ends near the stop. Its model is scored by our code.
- TF-IDF + LR: word 1-2-grams of the state's text (a record's compact JSON), one logistic regression per question
  on the same training rows.
- on records (every state a JSON object), the tabular baselines of `baseline_tabular.py` too: one-hot + logistic
  regression (`onehot+lr`) and gradient boosting (`hist-gbm`), one model per question.

It prints a table with the ratios, writes `benchmarks/results/bench_quality.json` and a learning curve
(`bench_quality.png`: held-out accuracy against wall seconds for each contender).

    python benchmarks/bench_quality.py [--datasets vader,spam,sotu] [--rows 3000] [--heldout 500] [--no-laya]
                                       [--seed N]
    python benchmarks/bench_quality.py --datasets records-hi,long-sotu --rows 2000 --heldout 500 --no-laya
    python benchmarks/bench_quality.py --datasets long-sotu --rows 2000 --heldout 500 --no-laya --base DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import yaml  # noqa: E402
from baseline_tabular import TABULAR_MODELS, predict_tabular  # noqa: E402
from quality_sets import DATASETS, dataset_files  # noqa: E402

RESULTS = HERE / "results"
BASE = ROOT / "data/snapshots/minilm"
LAYA_DECISIONS_PER_S = 15.0


def heldout_decisions(path: Path):
    """Validated held-out records and their decisions as metrics see them."""
    from pipeline.data.validate import validate_file
    from pipeline.scoring.decisions import gold_decisions

    records = validate_file(path).records
    return records, gold_decisions(records)


def run_tfidf(train: Path, heldout: Path) -> dict:
    """TF-IDF + logistic regression per question: the bag of words every run shows (`scoring.bag_of_words`),
    on all the training rows."""
    from pipeline.data.validate import validate_file
    from pipeline.scoring.bag_of_words import bag_of_words

    started = time.perf_counter()
    train_records = validate_file(train).records
    held_records, decisions = heldout_decisions(heldout)
    words = bag_of_words(train_records, held_records, decisions, max_rows=len(train_records))
    return contender_figures("tfidf+lr", decisions, words.probabilities, time.perf_counter() - started)


def run_tabular(name: str, train: Path, heldout: Path) -> dict:
    """A tabular baseline (`baseline_tabular.py`) on record states."""

    def fit_predict(train_records, labels, held_records):
        return predict_tabular(
            name, [r.state for r in train_records], labels, [r.state for r in held_records]
        )

    return run_per_question(name, train, heldout, fit_predict)


def run_per_question(contender: str, train: Path, heldout: Path, fit_predict) -> dict:
    """One model per question, `fit_predict(training records, their labels, held-out records) -> (classes,
    probabilities)`, scored on the held-out decisions as ours is."""
    from pipeline.data.validate import validate_file

    started = time.perf_counter()
    train_records = validate_file(train).records
    held_records, decisions = heldout_decisions(heldout)
    probabilities = {}
    for qid in sorted({d.question.id for r in train_records for d in r.decisions}):
        pairs = [(r, d.gold.label) for r in train_records for d in r.decisions if d.question.id == qid]
        probabilities[qid] = fit_predict([r for r, _ in pairs], [y for _, y in pairs], held_records)
    scored = []
    for d in decisions:
        classes, proba = probabilities[d.question_id]
        full = np.full(d.n_options, 1e-9)
        full[classes] = proba[d.record]
        scored.append(full / full.sum())
    return contender_figures(contender, decisions, scored, time.perf_counter() - started)


def contender_figures(contender: str, decisions, scored: list[np.ndarray], seconds: float) -> dict:
    """A contender's held-out figures as ours are scored, with each question's accuracy."""
    from pipeline.scoring.metrics import detailed_metrics

    right = [int(np.argmax(p) == d.label) for d, p in zip(decisions, scored)]
    by_question = {
        q: float(np.mean([r for d, r in zip(decisions, right) if d.question_id == q]))
        for q in sorted({d.question_id for d in decisions})
    }
    return {
        "contender": contender,
        "wall_seconds": seconds,
        "curve": [[seconds, None]],
        "by_question": by_question,
        **detailed_metrics(decisions, scored),
    }


def run_ours(train: Path, heldout: Path, out: Path, overrides: dict[str, dict], base: Path) -> dict:
    """Our default chain from `base` with `overrides` ({"train": {...}, "validate": {...}}) over
    params.yaml's."""
    from dataclasses import replace

    from pipeline.config import load_params
    from pipeline.data.split import TrainSource
    from pipeline.stages.finetune import finetune
    from pipeline.training.controls import RunHooks

    params = load_params(ROOT / "params.yaml")
    started = time.perf_counter()
    curve = []

    def checkpoint(step: int, metrics: dict) -> None:
        curve.append([time.perf_counter() - started, metrics["accuracy"]])
        print(
            f"  ours: step {step}, held-out accuracy {metrics['accuracy']:.4f}", file=sys.stderr, flush=True
        )

    hooks = RunHooks(
        report=lambda line: print(f"  ours: {line}", file=sys.stderr, flush=True), on_eval=checkpoint
    )
    source = TrainSource(
        train, eval_data=heldout, split_config=replace(params.validate, **overrides["validate"])
    )
    config = replace(params.train, **overrides["train"])
    result = finetune(source, base, out, config, hooks=hooks)
    seconds = time.perf_counter() - started
    heldout, train = result.heldout, result.train
    calibrated = heldout["calibrated"]
    curve.append([seconds, calibrated["accuracy"]])
    return {
        "contender": "ours",
        "family": train.family,
        "method": train.method,
        "steps": train.steps,
        "budget": train.budget,
        "wall_seconds": seconds,
        "curve": curve,
        "base_accuracy": heldout["base"]["accuracy"],
        "uncalibrated_ece": heldout["tuned"]["ece"],
        "warnings": train.warnings,
        "uncalibrated_accuracy": heldout["tuned"]["accuracy"],
        "calibrator": result.calibration.calibrator["kind"],
        "calibrator_fitted_on": result.calibration.calibrator["fitted_on"],
        **{k: calibrated[k] for k in ("accuracy", "record_accuracy", "ece", "brier")},
    }


def run_laya(train: Path, heldout: Path, out: Path, seconds: float, base: Path) -> dict:
    """laya's trainer, stopped after `seconds` of wall time, on the rows its pace gets through in that
    time."""
    import laya.train as laya_train

    started = time.perf_counter()
    lines = train.read_text(encoding="utf-8").splitlines()
    per_row = max(1, len(json.loads(lines[0])["questions"]))
    take = max(16, int(seconds * LAYA_DECISIONS_PER_S / per_row))
    subset = out.with_suffix(".train.jsonl")
    subset.parent.mkdir(parents=True, exist_ok=True)
    subset.write_text("\n".join(lines[:take]) + "\n", encoding="utf-8")

    class Stop(Exception):
        pass

    original_encode, original_train = laya_train.encode_item, laya_train.train_model

    training = {"now": False}  # the deadline stops training only, not laya's calibration and saving after it

    def encode_until_deadline(*args, **kwargs):
        if training["now"] and time.perf_counter() - started > seconds:
            raise Stop
        return original_encode(*args, **kwargs)

    def train_until_deadline(*args, **kwargs):
        training["now"] = True
        try:
            return original_train(*args, **kwargs)
        except Stop:
            return [float("nan")]
        finally:
            training["now"] = False

    laya_train.encode_item, laya_train.train_model = encode_until_deadline, train_until_deadline
    try:
        config = laya_train.TrainConfig(epochs=1, log_every=0)
        laya_train.finetune(str(subset), str(base), str(out), config, device="cpu")
    finally:
        laya_train.encode_item, laya_train.train_model = original_encode, original_train
    wall = time.perf_counter() - started
    metrics = score_laya_export(out, heldout)
    return {
        "contender": "laya.train",
        "train_rows": take,
        "wall_seconds": wall,
        "curve": [[wall, metrics["accuracy"]]],
        **metrics,
    }


def score_laya_export(folder: Path, heldout: Path) -> dict:
    """A Laya-layout export scored by our code, with the temperatures it carries."""
    from pipeline.stages.evaluate import evaluate_model

    overall = evaluate_model(str(folder), str(heldout), None, progress=False).metrics["overall"]
    return {k: overall[k] for k in ("accuracy", "record_accuracy", "ece", "brier")}


def run_dataset(
    name: str, rows: int, heldout_rows: int, laya: bool, overrides: dict[str, dict], base: Path = BASE
) -> dict:
    from pipeline.data.validate import validate_file

    work = HERE / ".cache" / "quality" / name
    train, heldout = dataset_files(name, work, rows, heldout_rows)
    train_data, held_report = validate_file(train), validate_file(heldout).report
    train_report = train_data.report
    print(
        f"{name}: {train_report.rows:,} training rows ({train_report.decisions:,} decisions), "
        f"{held_report.rows:,} held-out rows ({held_report.decisions:,} decisions)",
        file=sys.stderr,
    )
    tfidf = run_tfidf(train, heldout)
    records = all(isinstance(r.state, dict) for r in train_data.records)
    tabular = [run_tabular(model, train, heldout) for model in TABULAR_MODELS] if records else []
    ours = run_ours(train, heldout, work / "-".join(["ours", *_labels(overrides, base)]), overrides, base)
    contenders = [ours, tfidf, *tabular]
    if laya:
        contenders.append(run_laya(train, heldout, work / "laya", ours["wall_seconds"], base))
    return {
        "dataset": name,
        "train_rows": train_report.rows,
        "train_decisions": train_report.decisions,
        "heldout_rows": held_report.rows,
        "heldout_decisions": held_report.decisions,
        "contenders": contenders,
        "ratios": {f"ours/{c['contender']}": c_ratio(ours, c) for c in contenders[1:]},
    }


def c_ratio(ours: dict, other: dict) -> dict:
    return {
        "accuracy": ours["accuracy"] / other["accuracy"],
        "accuracy_gain": ours["accuracy"] - other["accuracy"],
        "record_accuracy": ours["record_accuracy"] / max(other["record_accuracy"], 1e-9),
    }


def print_table(results: list[dict]) -> None:
    header = (
        f"{'data set':<13} {'rows':>6} {'dec.':>6}  {'contender':<11} {'steps':>5} {'wall s':>7} "
        f"{'acc':>6} {'uncal.':>6} {'rec.acc':>7} {'ECE':>6} {'Brier':>6}"
    )
    print(header)
    print("-" * len(header))
    for result in results:
        for c in result["contenders"]:
            print(
                f"{result['dataset']:<13} {result['train_rows']:>6} {result['heldout_decisions']:>6}  "
                f"{c['contender']:<11} {c.get('steps', '-')!s:>5} {c['wall_seconds']:>7.0f} "
                f"{c['accuracy']:>6.4f} {c.get('uncalibrated_accuracy', c['accuracy']):>6.4f} "
                f"{c['record_accuracy']:>7.4f} {c['ece']:>6.4f} {c['brier']:>6.4f}"
            )
        for name, ratio in result["ratios"].items():
            print(
                f"{'':<13} {name}: accuracy x{ratio['accuracy']:.3f} ({ratio['accuracy_gain']:+.4f}), "
                f"record accuracy x{ratio['record_accuracy']:.2f}"
            )


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, result in zip(axes[0], results):
        for c in result["contenders"]:
            points = [(s, a) for s, a in c["curve"] if a is not None] or [(c["wall_seconds"], c["accuracy"])]
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", label=c["contender"])
        ax.set_title(f"{result['dataset']} ({result['train_rows']:,} training rows)")
        ax.set_xlabel("wall seconds")
        ax.set_ylabel("held-out accuracy")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def param_overrides(pairs: list[str], section: type, flag: str) -> dict:
    """`KEY=VALUE` pairs as params of `section` (values read as YAML: 4, 0.5, null, [0, 1]); ValueError names
    a bad one."""
    known = set(section.__dataclass_fields__)
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in known:
            raise ValueError(f"{flag} {pair}: expected KEY=VALUE with KEY one of {', '.join(sorted(known))}")
        overrides[key] = yaml.safe_load(value)
    return overrides


def _labels(overrides: dict[str, dict], base: Path) -> list[str]:
    """The overrides and a base other than the stock one as short names for files and folders: state_windows4,
    validation_fraction0, base-minilm512."""
    named = [] if base.resolve() == BASE else [f"base-{base.name}"]
    return [f"{k}{v}" for section in overrides.values() for k, v in section.items()] + named


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--datasets", default="vader,spam,sotu", help=f"comma-separated, of: {', '.join(DATASETS)}"
    )
    parser.add_argument(
        "--rows", type=int, default=3000, help="training rows of each set but VADER (VADER: all)"
    )
    parser.add_argument(
        "--heldout",
        type=int,
        default=500,
        help="held-out rows of each set but VADER (the sotu sets: at most what their held-out addresses "
        "give)",
    )
    parser.add_argument(
        "--no-laya", action="store_true", help="leave laya's trainer out (it takes as long as ours)"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="train.seed for ours (default: params.yaml's), to measure the noise from seeds",
    )
    parser.add_argument(
        "--train",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a train param for ours over params.yaml's (repeatable), to measure a lever: "
        "--train state_windows=4",
    )
    parser.add_argument(
        "--base",
        type=Path,
        default=BASE,
        help="the base model folder ours (and laya's trainer) start from: another encoder, a "
        "snapshot with a longer window (default: the stock MiniLM snapshot)",
    )
    parser.add_argument(
        "--validate",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a validate param over params.yaml's (repeatable): --validate validation_fraction=0 "
        "is the protocol before the validation split",
    )
    args = parser.parse_args()
    from pipeline.config import TrainConfig, ValidateConfig

    try:
        seed = {} if args.seed is None else {"seed": args.seed}
        overrides = {
            "train": param_overrides(args.train, TrainConfig, "--train") | seed,
            "validate": param_overrides(args.validate, ValidateConfig, "--validate"),
        }
    except ValueError as error:
        parser.error(str(error))
    unknown = [name for name in args.datasets.split(",") if name not in DATASETS]
    if unknown:
        parser.error(f"--datasets: unknown {', '.join(unknown)}; choose from {', '.join(DATASETS)}")
    if args.rows < 1 or args.heldout < 1:
        parser.error("--rows and --heldout must be at least 1")
    if not args.base.is_dir():
        parser.error(
            f"--base {args.base}: no such folder (a base model folder: `decision snapshot --from ...`)"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "_".join(["bench_quality", *_labels(overrides, args.base)])
    results = []
    for dataset in args.datasets.split(","):
        results.append(run_dataset(dataset, args.rows, args.heldout, not args.no_laya, overrides, args.base))
        # Written after each data set, so a later failure keeps what was measured.
        (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=2, default=str))
    print_table(results)
    plot(results, RESULTS / f"{name}.png")
    print(f"wrote {RESULTS / name}.json and {RESULTS / name}.png")


if __name__ == "__main__":
    main()
