"""Certified automation against the threshold users set by hand, on VADER and public data sets of other kinds.

For each data set, one model: params.yaml's default fine-tune (`decision finetune`, the held-out rows given as
`eval_data`, so no held-out row is trained on), or a run folder given with `--run NAME=FOLDER` (`make run`'s
`runs/<key>` for VADER). From its run folder: the decisions the calibrate stage fits on (the validation split,
with the training rows answered out of fold where the validation split is small), their cross-fitted calibrated
answers, and the held-out decisions' calibrated answers. Then, at each ε (`--epsilons`, default 0.02, 0.05,
0.10; δ from params.yaml's `certify:`):

- certified: each question's threshold certified on the fitting decisions (`scoring.certify`: Clopper-Pearson
  bounds in fixed-sequence walks), applied to the held-out answers: coverage (the share automated) and the
  realised error among automated answers, with 95% intervals, per question and overall;
- windows: over `--windows` random windows of `--window` held-out decisions (drawn with a fixed seed), the
  share whose realised error among automated answers is within ε (goal: at least 1 - δ);
- in-sample: the largest coverage any threshold reaches on the held-out rows themselves at an error within ε
  (chosen on the rows it is measured on, so optimistic: the yardstick the certified coverage is held to);
- naive 0.9: the rule users apply by hand, a fixed 0.9 threshold on the calibrated confidence, on the same
  rows: its coverage, realised error and windows within ε.

Beside it, the export as the server answers (its own certificates at params.yaml's ε, and its novelty gate,
`scoring.novelty`): the share of in-scope held-out states the gate flags and of decisions automated, and, on
planted out-of-scope states of several kinds (`bench_novelty.planted_states`: other domains' text, JSON records,
random characters, empty-ish strings, very long text) asked the data set's questions, the share flagged and the
share with no answer automated (goal: at least 95%); and the gate's serving cost: the export answering batches
of held-out requests with its gate and with the gate taken off, side by side (goal: 0.9 of the throughput or
more; `benchmarks/bench_novelty.py` measures it for either family on an untrained head).

It prints a table per data set and writes `benchmarks/results/bench_certify.json`.

    python benchmarks/bench_certify.py [--datasets vader,spam,strikes] [--rows 3000] [--heldout 1000]
                                       [--run vader=runs/<key>] [--epsilons 0.02,0.05,0.1]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from bench_novelty import planted_states, timed_rounds  # noqa: E402
from quality_sets import DATASETS, dataset_files  # noqa: E402

from pipeline.config import CertifyConfig, load_params  # noqa: E402
from pipeline.data.answers import parse_request  # noqa: E402
from pipeline.data.split import SplitData  # noqa: E402
from pipeline.families import load_decision_model  # noqa: E402
from pipeline.rundir import RunFolder  # noqa: E402
from pipeline.scoring.calibrators import choose_calibrator  # noqa: E402
from pipeline.scoring.certify import (  # noqa: E402
    automation_figures,
    automation_report,
    best_in_sample,
    certify,
    error_lower_bound,
    fitted_answers,
)
from pipeline.scoring.heldout import load_heldout, pooled  # noqa: E402

RESULTS = HERE / "results"
BASE = ROOT / "data/snapshots/minilm"
NAIVE_THRESHOLD = 0.9
SEED = 20261206


def fitting_pool(run: RunFolder):
    """The decisions the calibrate stage fits on: the validation split, and the out-of-fold answers where the
    run has them."""
    parts = [load_heldout(path) for path in (run.validation_logits, run.out_of_fold) if path.exists()]
    if not parts:
        raise SystemExit(f"{run.root}: no validation.npz nor out_of_fold.npz to certify on")
    return pooled(parts)


def window_share(chosen: np.ndarray, errors: np.ndarray, epsilon: float, delta: float, args) -> dict:
    """Over random windows of held-out decisions: the share whose realised error among automated answers is
    within ε (a window automating nothing is), the share the monitor would not call broken (the one-sided
    Clopper-Pearson lower bound at δ within ε: `flywheel.recertify`), and the worst window's error."""
    rng = np.random.default_rng(SEED)
    within = unbroken = 0
    worst = 0.0
    for _ in range(args.windows):
        picked = rng.choice(len(chosen), size=min(args.window, len(chosen)), replace=False)
        automated = chosen[picked]
        wrong, n = int(errors[picked][automated].sum()), int(automated.sum())
        error = wrong / n if n else 0.0
        within += error <= epsilon
        unbroken += error_lower_bound(wrong, n, delta) <= epsilon if n else 1
        worst = max(worst, error)
    return {
        "windows": args.windows,
        "size": args.window,
        "within": within / args.windows,
        "not_broken": unbroken / args.windows,
        "worst": worst,
    }


def figures_at(held, served, pool, fitted, epsilon: float, base: CertifyConfig, args) -> dict:
    """Certified, in-sample and naive figures at one ε."""
    config = replace(base, target_error=epsilon)
    certificates = certify(pool.items, fitted, config)
    report = automation_report(held.items, served, certificates, config.score_error)
    answers = fitted_answers(held.items, served, config.score_error)
    order = sorted(answers)
    chosen = np.concatenate([[certificates[q].automates(c) for c in answers[q][1]] for q in order]).astype(
        bool
    )
    naive = np.concatenate([answers[q][1] >= NAIVE_THRESHOLD for q in order])
    errors = np.concatenate([answers[q][2] for q in order])
    by_question = {}
    for q in order:
        _, confidences, wrong = answers[q]
        by_question[q] = {
            "threshold": certificates[q].threshold,
            "reason": certificates[q].reason,
            "certified": asdict(report.by_question[q]),
            "in_sample_coverage": best_in_sample(confidences, wrong, epsilon),
            "naive": asdict(automation_figures(confidences >= NAIVE_THRESHOLD, wrong, epsilon)),
        }
    return {
        "epsilon": epsilon,
        "delta": config.delta,
        "by_question": by_question,
        "overall": asdict(report.overall),
        "windows": window_share(chosen, errors, epsilon, config.delta, args),
        "naive_overall": asdict(automation_figures(naive, errors, epsilon)),
        "naive_windows": window_share(naive, errors, epsilon, config.delta, args),
    }


def train_run(name: str, args) -> Path:
    """params.yaml's default fine-tune on the data set's training rows, its held-out rows as eval_data; the run
    folder."""
    from pipeline.data.split import TrainSource
    from pipeline.stages.finetune import finetune
    from pipeline.training.controls import RunHooks

    folder = HERE / ".cache" / "certify" / name
    folder.mkdir(parents=True, exist_ok=True)
    train, heldout = dataset_files(name, folder, args.rows, args.heldout)
    params = load_params(ROOT / "params.yaml")
    source = TrainSource(train, eval_data=heldout, split_config=params.validate)
    started = time.perf_counter()
    hooks = RunHooks(report=lambda line: print(f"  {name}: {line}", file=sys.stderr, flush=True))
    result = finetune(source, BASE, folder / "export", params.train, "cpu", hooks, certify=params.certify)
    print(f"{name}: trained in {time.perf_counter() - started:.0f} s")
    return Path(result.run_dir)


def export_of(run: RunFolder) -> Path | None:
    """The run's export: where its result says it went (`decision finetune --out`), else the flow's place in
    the run folder."""
    written = json.loads(run.result.read_text()).get("export_dir") if run.result.exists() else None
    places = [Path(written)] if written else []  # relative to where the run ran: the flow's is run.export
    return next((folder for folder in [*places, run.export] if folder.exists()), None)


def served(run: RunFolder, export: Path, args) -> dict:
    """The export as the server answers (`DecisionModel.answer`, its own certificates and novelty gate at
    params' ε): on up to `limit` held-out rows, the share of states the gate flags and of decisions automated;
    on each planted out-of-scope kind, asked the data set's questions, the share of states flagged and of states
    with no answer automated."""
    model = load_decision_model(export)
    if not model.automation.certificates:
        return {"skipped": f"{export} carries no certificates (an export made before them)"}
    records = SplitData.load(run.split).split.heldout[: args.served_rows]
    in_scope = [parse_request(r.state, r.request_questions()) for r in records]
    questions = records[0].request_questions()
    shares = {"in scope (held out)": _served_shares(model, in_scope)}
    for kind, states in planted_states().items():
        shares[kind] = _served_shares(model, [parse_request(state, questions) for state in states])
    gate = model.automation.gate
    return {
        "gate": gate.summary() if gate else None,
        "shares": shares,
        "throughput": gate_cost(model, in_scope, args) if gate else None,
    }


def gate_cost(model, requests: list, args) -> dict:
    """Requests/s of the export answering batches of held-out requests with its novelty gate and without it
    (the same model, the gate taken off), each batch by the two back to back (`bench_novelty.timed_rounds`);
    the ratio is the median over batches of the plain time over the gated time (goal: 0.9 or more)."""
    plain = replace(model, automation=replace(model.automation, gate=None))
    batches = [requests[i : i + 8] for i in range(0, min(len(requests), args.throughput_requests), 8)]
    timed_rounds(plain, model, batches[:2], 1)  # warm-up
    rates, paired = timed_rounds(plain, model, batches, args.rounds)
    return {
        "requests": sum(len(b) for b in batches),
        "rounds": args.rounds,
        "requests_per_s": {name: [round(v, 2) for v in values] for name, values in rates.items()},
        "ratio": float(np.median(paired)),
        "ratio_quartiles": [float(q) for q in np.quantile(paired, [0.25, 0.75])],
    }


def _served_shares(model, requests: list) -> dict:
    answered = [a for a in model.answer(requests) if hasattr(a, "answers")]
    verdicts = [[answer["x_automate"] for answer in a.answers.values()] for a in answered]
    novel = model.automation.novel_states(requests, model.state_vectors)
    return {
        "states": len(requests),
        "novel": float(np.mean(novel)),
        "none_automated": float(np.mean([not any(v) for v in verdicts])),
        "decisions_automated": float(np.mean([v for vs in verdicts for v in vs])),
    }


def run_dataset(name: str, run_dir: Path, epsilons: list[float], config: CertifyConfig, args) -> dict:
    run = RunFolder(run_dir)
    held, pool = load_heldout(run.heldout), fitting_pool(run)
    choice = choose_calibrator(pool.items, pool.tuned_logits)
    served_answers = choice.calibrator.apply(held.items, held.tuned_logits)
    export = export_of(run)
    return {
        "served": served(run, export, args) if export else {"skipped": "no export"},
        "dataset": name,
        "run": str(run_dir),
        "fitted_on": len(pool.items),
        "out_of_fold": run.out_of_fold.exists(),
        "heldout": len(held.items),
        "at": [
            figures_at(held, served_answers, pool, choice.cross_fitted, e, config, args) for e in epsilons
        ],
    }


def _interval(figures: dict, key: str) -> str:
    value = figures[key]
    if value is None:
        return "-"
    return f"{value:.3f} [{figures[f'{key}_low']:.3f}, {figures[f'{key}_high']:.3f}]"


def print_table(result: dict) -> None:
    print(
        f"\n{result['dataset']}: fitted on {result['fitted_on']:,} decisions"
        f"{' (with out-of-fold answers)' if result['out_of_fold'] else ''}, measured on {result['heldout']:,} "
        "held-out decisions"
    )
    print(
        f"{'ε':>5} {'question':<16} {'threshold':>9} {'coverage [95%]':>22} {'error [95%]':>22} "
        f"{'in-sample':>9} {'0.9 cov.':>8} {'0.9 err.':>8}"
    )
    for at in result["at"]:
        for q, f in at["by_question"].items():
            threshold = "-" if f["threshold"] is None else f"{f['threshold']:.4f}"
            naive = f["naive"]
            naive_error = "-" if naive["error"] is None else f"{naive['error']:.3f}"
            print(
                f"{at['epsilon']:>5g} {q:<16} {threshold:>9} {_interval(f['certified'], 'coverage'):>22} "
                f"{_interval(f['certified'], 'error'):>22} {f['in_sample_coverage']:>9.3f} "
                f"{naive['coverage']:>8.3f} {naive_error:>8}"
            )
        naive = at["naive_overall"]
        naive_error = "-" if naive["error"] is None else f"{naive['error']:.3f}"
        print(
            f"{at['epsilon']:>5g} {'overall':<16} {'':>9} {_interval(at['overall'], 'coverage'):>22} "
            f"{_interval(at['overall'], 'error'):>22} {'':>9} {naive['coverage']:>8.3f} {naive_error:>8}"
        )
        ours, naive = at["windows"], at["naive_windows"]
        print(
            f"      {ours['windows']} windows of {ours['size']}, error within ε: certified {ours['within']:.2f}, "
            f"naive 0.9 {naive['within']:.2f} (goal ≥ {1 - at['delta']:.2f}); not broken (lower bound at δ "
            f"within ε): {ours['not_broken']:.2f} and {naive['not_broken']:.2f}; worst window "
            f"{ours['worst']:.3f} and {naive['worst']:.3f}"
        )


def print_served(result: dict) -> None:
    served = result["served"]
    if "skipped" in served:
        print(f"  served: {served['skipped']}")
        return
    print(f"  served, the export's own certificates and novelty gate ({served['gate']}):")
    print(
        f"  {'states':<22} {'n':>5} {'flagged novel':>13} {'none automated':>14} {'decisions automated':>19}"
    )
    for kind, f in served["shares"].items():
        print(
            f"  {kind:<22} {f['states']:>5} {f['novel']:>13.3f} {f['none_automated']:>14.3f} "
            f"{f['decisions_automated']:>19.3f}"
        )
    if cost := served["throughput"]:
        rates = ", ".join(f"{name} {max(values):.1f}" for name, values in cost["requests_per_s"].items())
        low, high = cost["ratio_quartiles"]
        print(
            f"  throughput with the gate / without: {cost['ratio']:.3f} (quartiles {low:.3f}-{high:.3f}; goal "
            f">= 0.9), best requests/s {rates}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="vader,spam,strikes", help=f"comma-separated, of {DATASETS}")
    parser.add_argument("--run", action="append", default=[], help="NAME=FOLDER: a trained run folder to use")
    parser.add_argument("--rows", type=int, default=3000, help="training rows of a set trained here")
    parser.add_argument("--heldout", type=int, default=1000, help="held-out rows of a set trained here")
    parser.add_argument("--epsilons", default="0.02,0.05,0.1")
    parser.add_argument("--windows", type=int, default=50)
    parser.add_argument("--window", type=int, default=200)
    parser.add_argument("--served-rows", type=int, default=1000, help="held-out rows the export answers")
    parser.add_argument("--throughput-requests", type=int, default=256, help="of them, timed with the gate")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds with and without the gate")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_certify.json")
    args = parser.parse_args(argv)
    given = dict(pair.split("=", 1) for pair in args.run)
    epsilons = [float(e) for e in args.epsilons.split(",")]
    config = load_params(ROOT / "params.yaml").certify
    results = []
    for name in args.datasets.split(","):
        run_dir = Path(given[name]) if name in given else train_run(name, args)
        results.append(run_dataset(name, run_dir, epsilons, config, args))
        print_table(results[-1])
        print_served(results[-1])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
