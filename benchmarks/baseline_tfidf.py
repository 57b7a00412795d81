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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    from pipeline.config import load_params
    from pipeline.data.contract import state_text
    from pipeline.data.split import split_holdout
    from pipeline.data.validate import validate_file

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
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True)
    x_train = vectorizer.fit_transform([state_text(r.state) for r in train])
    x_test = vectorizer.transform([state_text(r.state) for r in split.heldout])
    results, right, total = {}, 0, 0
    for question_id in sorted({d.question.id for r in train for d in r.decisions}):

        def labels(records, qid=question_id):
            return [next(d.gold.label for d in r.decisions if d.question.id == qid) for r in records]

        model = LogisticRegression(max_iter=2000).fit(x_train, labels(train))
        predicted = model.predict(x_test)
        gold = labels(split.heldout)
        correct = sum(int(p == g) for p, g in zip(predicted, gold))
        results[question_id] = correct / len(gold)
        right, total = right + correct, total + len(gold)
    results["overall"] = right / total
    print(f"TF-IDF + logistic regression, {len(train):,} training rows, {total} held-out decisions")
    for name, accuracy in results.items():
        print(f"  {name:<12} {accuracy:.4f}")
    out = ROOT / "benchmarks/results/baseline_tfidf.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"train_rows": len(train), "heldout_decisions": total, "accuracy": results}, indent=2)
    )


if __name__ == "__main__":
    main()
