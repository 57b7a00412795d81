"""The joint head's levers, one at a time, on a validation split made from training rows only.

The training rows `bench_quality.py` uses for a data set (`quality_sets.py`) are split in two by a hash of
their group (State of the Union: the address, so no validation passage comes from an address trained on; other
sets: the row); the frozen encoder's features are computed once; then the head is trained afresh for each
variant, with params.yaml's `train:` settings and the variant's changes, and scored on the validation rows
(uncalibrated). The held-out rows of `bench_quality.py` are never read, so choosing a default here does not
tune on them. TF-IDF + LR on the same two parts is the reference line.

    python benchmarks/bench_head_levers.py [--dataset sotu] [--validation 500] [--variants JSON]

A variant is a JSON object: `head` changes the fresh head (`lexicon`: false drops the lexical channel;
`dropout`; `seed`), every other key a `train:` setting. It prints a table and writes
`benchmarks/results/bench_head_levers.json`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from bench_quality import BASE, RESULTS, run_tfidf  # noqa: E402
from quality_sets import dataset_files, write_rows  # noqa: E402

DEFAULT_VARIANTS = [
    {},
    {"head": {"seed": 1}},
    {"head": {"lexicon": False}},
    {"head": {"lexicon": False, "seed": 1}},
    {"head": {"dropout": 0.1}},
    {"weight_decay": 0.1},
    {"head_lr": 3e-4},
    {"min_steps": 800},
]


def validation_split(
    dataset: str, rows: int, heldout: int, validation: int, folder: Path
) -> tuple[Path, Path]:
    """`bench_quality.py`'s training rows of the data set (same `rows` and `heldout`) split into (train,
    validation) files under `folder`: whole groups go to validation, in the order of their hash, until it has
    `validation` rows."""
    source, _ = dataset_files(dataset, folder / "source", rows, heldout)
    lines = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    groups: dict[str, list[dict]] = {}
    for row in lines:
        key = str(row.get("id", json.dumps(row["state"], sort_keys=True)))
        groups.setdefault(key.rsplit("/", 1)[0] if dataset == "sotu" else key, []).append(row)
    held: list[dict] = []
    for key in sorted(groups, key=lambda k: hashlib.md5(f"levers:{k}".encode()).hexdigest()):
        if len(held) >= validation:
            break
        held.extend(groups.pop(key))
    kept = [row for members in groups.values() for row in members]
    return write_rows(kept, folder / "train.jsonl"), write_rows(held, folder / "validation.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default="sotu", help="vader, spam or sotu")
    parser.add_argument("--rows", type=int, default=3000, help="bench_quality's training rows (VADER: all)")
    parser.add_argument("--heldout", type=int, default=500, help="bench_quality's held-out rows (never read)")
    parser.add_argument("--validation", type=int, default=500, help="validation rows, from the training rows")
    parser.add_argument(
        "--variants", type=json.loads, default=DEFAULT_VARIANTS, help="a JSON list of variants"
    )
    args = parser.parse_args()

    import torch

    from pipeline.config import load_params
    from pipeline.data.validate import validate_file
    from pipeline.families import pick_family
    from pipeline.families.joint.head import JointHead
    from pipeline.scoring.calibration import plain_probabilities
    from pipeline.scoring.metrics import heldout_metrics
    from pipeline.training.loop import train

    folder = HERE / ".cache" / f"levers-{args.dataset}"
    train_file, validation_file = validation_split(
        args.dataset, args.rows, args.heldout, args.validation, folder
    )
    config = load_params(ROOT / "params.yaml").train
    family = pick_family(BASE, config.family)
    cpu = torch.device("cpu")
    loaded = family.load(BASE, config, cpu)
    head_config = loaded.config["head"]
    hidden = loaded.model.lm.get_input_embeddings().embedding_dim
    examples, _ = family.build_examples(loaded, validate_file(train_file).records)
    held, _ = family.build_examples(loaded, validate_file(validation_file).records)
    family.prepare(loaded, config)
    say = lambda line: print(f"  {line}", file=sys.stderr, flush=True)  # noqa: E731
    ready = family.training_examples(loaded, examples, config, cpu, say)
    held_ready = family.training_examples(loaded, held, config, cpu, say)
    tfidf = run_tfidf(train_file, validation_file)
    print(
        f"{args.dataset}: {len(ready):,} training rows, {len(held_ready):,} validation rows "
        f"({sum(len(e.targets) for e in held_ready):,} decisions); TF-IDF + LR {tfidf['accuracy']:.4f}"
    )
    results = []
    for variant in args.variants:
        head_changes = dict(variant.get("head", {}))
        torch.manual_seed(head_changes.get("seed", 0))
        loaded.model.head = JointHead(
            hidden,
            head_config["width"],
            head_config["heads"],
            head_config["layers"],
            head_config["chunk"],
            dropout=head_changes.get("dropout", 0.0),
            read_layers=head_config["read_layers"],
            lexicon=head_config["lexicon"] if head_changes.get("lexicon", True) else 0,
            bigrams=head_config.get("bigrams", 0),
        )
        run_config = replace(config, **{k: v for k, v in variant.items() if k != "head"})
        family.prepare(loaded, run_config)
        family.learn_from_rows(loaded, examples)
        started = time.perf_counter()
        result = train(loaded.model, ready, run_config, cpu, family.batch_task(loaded, run_config))
        seconds = time.perf_counter() - started
        decisions, logits = family.score(loaded, held_ready, cpu, 64, False)
        metrics = heldout_metrics(decisions, plain_probabilities(logits))
        row = {
            "variant": variant,
            "steps": result.steps,
            "seconds": round(seconds, 1),
            **{k: metrics[k] for k in ("accuracy", "record_accuracy", "ece")},
        }
        results.append(row)
        print(
            f"{json.dumps(variant):<44} {row['steps']:>5} steps {seconds:>5.0f} s  accuracy "
            f"{row['accuracy']:.4f}  record {row['record_accuracy']:.4f}  ECE {row['ece']:.4f}",
            flush=True,
        )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "bench_head_levers.json"
    out.write_text(
        json.dumps({"dataset": args.dataset, "tfidf": tfidf["accuracy"], "variants": results}, indent=2)
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
