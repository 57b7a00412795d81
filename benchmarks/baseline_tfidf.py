"""A simple baseline for context: TF-IDF features and one logistic regression per question, same split.

Trains on the training rows of the held-out split (params.yaml `validate:`) and reports held-out accuracy per
question and overall, the number a fine-tuned decision model should clearly beat.

    python benchmarks/baseline_tfidf.py [--data data/processed/vader.jsonl] [--train-rows N]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    from pipeline.config import load_params
    from pipeline.data.split import split_holdout
    from pipeline.data.validate import validate_file
    from pipeline.scoring.bag_of_words import bag_of_words
    from pipeline.scoring.decisions import gold_decisions
    from pipeline.scoring.metrics import detailed_metrics

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", default=str(ROOT / "data/processed/vader.jsonl"))
    parser.add_argument(
        "--train-rows", type=int, default=None, help="train on the first N training rows only"
    )
    args = parser.parse_args()
    split = split_holdout(validate_file(args.data).records, load_params(ROOT / "params.yaml").validate)
    train = split.train[: args.train_rows] if args.train_rows else split.train
    decisions = gold_decisions(split.heldout)
    # The bag of words every run shows beside its fine-tune, on the same training rows (the validation split
    # carved out), here without a cap on their number.
    words = bag_of_words(train, split.heldout, decisions, max_rows=len(train))
    results = {}
    for question_id in sorted({d.question_id for d in decisions}):
        chosen = [i for i, d in enumerate(decisions) if d.question_id == question_id]
        results[question_id] = float(
            np.mean([np.argmax(words.probabilities[i]) == decisions[i].label for i in chosen])
        )
    overall = detailed_metrics(decisions, words.probabilities)
    results["overall"] = overall["accuracy"]
    print(
        f"TF-IDF + logistic regression, {len(train):,} training rows, {len(decisions)} held-out decisions "
        f"({words.seconds:.0f} s); ECE {overall['ece']:.4f}"
    )
    for name, accuracy in results.items():
        print(f"  {name:<12} {accuracy:.4f}")
    out = ROOT / "benchmarks/results/baseline_tfidf.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "train_rows": len(train),
                "heldout_decisions": len(decisions),
                "accuracy": results,
                "ece": overall["ece"],
                "seconds": words.seconds,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
