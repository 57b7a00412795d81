"""The novelty gate's cost and verdicts: one model answering the same requests with and without the gate, side
by side in one run, and the share of states it flags, in scope and planted out of scope.

The model (`--family`: joint, the default family, with a fresh head on the folder's encoder, which hands the
gate the state vectors its own pass computed; or laya, which reads each state again alone) answers as the
server's batcher calls it (`DecisionModel.answer`, requests in batches of `--concurrency`), with every question
certified (threshold 0), so every answered state goes through the gate: the most the gate can cost. Each
batch is answered by the two back to back (in turns first), so a drift of the machine falls on both; the ratio
is the median over batches and rounds of the plain time over the gated time of the same batch (goal: 0.9 or
more), beside each round's requests/s. The gate is
fitted as the calibrate stage fits it (`scoring.novelty.fit_novelty`): a bank of `--bank` training states, the
threshold at `--quantile` of `--validation` other states, the length limit from the longest of them; the
flagged shares are on in-scope held-out states (never in the bank or the threshold's fit) and on each planted
kind (`planted_states`).

    python benchmarks/bench_novelty.py [--model data/snapshots/minilm] [--data data/processed/vader.jsonl]
    python benchmarks/bench_novelty.py --family laya
    python benchmarks/bench_novelty.py --smoke      # a tiny random model on synthetic rows (seconds)

Writes benchmarks/results/bench_novelty.json (`--out`).
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.data.answers import parse_request  # noqa: E402
from pipeline.data.contract import state_text  # noqa: E402
from pipeline.families import load_decision_model  # noqa: E402
from pipeline.scoring.automation import Automation  # noqa: E402
from pipeline.scoring.certify import Certificate  # noqa: E402
from pipeline.scoring.novelty import fit_novelty  # noqa: E402

OTHER_DOMAINS = (
    "The mitochondria converts glucose into ATP through cellular respiration in three stages.",
    "Quarterly earnings beat analyst expectations as revenue rose twelve percent year over year.",
    "Section 4.2: the lessee shall indemnify the lessor against all claims arising from the premises.",
    "def merge(a, b):\n    return sorted(a + b, key=lambda x: x.priority)",
    "Der Vertrag wurde gestern von beiden Parteien in Berlin unterzeichnet.",
    "Preheat the oven to 180 C, whisk four eggs with sugar, fold in the flour and bake for 25 minutes.",
)


def planted_states(seed: int = 0) -> dict[str, list]:
    """States unlike any a review or tweet model trained on, by kind: other domains' text, JSON records sent to
    a text model, random characters, empty-ish strings (punctuation alone), and very long repeated text."""
    rng = random.Random(seed)
    records = [
        {"id": i, "sku": f"A-{i:04d}", "qty": rng.randint(1, 9), "price": round(rng.uniform(1, 99), 2)}
        for i in range(4)
    ] + [{"user": {"name": "x", "roles": ["admin", "ops"]}, "active": True}]
    noise = ["".join(rng.choice(string.printable[:94]) for _ in range(160)) for _ in range(5)]
    long = [" ".join(rng.choice(OTHER_DOMAINS) for _ in range(60)) for _ in range(3)]
    return {
        "other domains": list(OTHER_DOMAINS),
        "JSON records": records,
        "random characters": noise,
        "empty-ish": [".", "?!", "-", "...", "#"],
        "very long": long,
    }


def certified_everywhere(questions: dict[str, dict]) -> dict[str, Certificate]:
    """A certificate of threshold 0 for each question as asked: every answer certified, so every state meets
    the gate."""
    certificates = {}
    for qid, body in questions.items():
        [question] = parse_request("x", {qid: body}).questions.values()
        certificates[qid] = Certificate(
            question_id=qid,
            qtype=question.type,
            target_error=0.05,
            delta=0.05,
            threshold=0.0,
            fit_decisions=0,
            options=question.options,
        )
    return certificates


def read_rows(path: Path, n: int, seed: int) -> list[dict]:
    """`n` rows of distinct states from a decision file, in a seeded random order."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    distinct = list({state_text(r["state"]): r for r in rows}.values())
    random.Random(seed).shuffle(distinct)
    return distinct[:n]


def smoke_setup(folder: Path) -> tuple[Path, list[dict]]:
    """A tiny random base and synthetic rows (what `--smoke` runs on)."""
    from pipeline.data import synthetic
    from tests.tiny import write_tiny_base

    rows = synthetic.generate_rows(900, seed=3)
    return write_tiny_base(folder / "base"), [
        {"state": r["state"], "questions": r["questions"]} for r in rows
    ]


def load_model(folder: Path, family: str, smoke: bool):
    """The folder's model as `family` reads it: laya as it loads, joint with a fresh head on its encoder as
    params.yaml's `train` section (or the tiny tests' joint head with `--smoke`) configures it."""
    if family == "laya":
        return load_decision_model(folder)
    import torch

    from pipeline.config import load_params
    from pipeline.families import pick_family
    from pipeline.families.base import DecisionModel
    from tests.tiny import JOINT_HEAD

    config = JOINT_HEAD if smoke else load_params(ROOT / "params.yaml").train
    joint = pick_family(folder, "joint")
    return DecisionModel(joint, joint.load(folder, config, torch.device("cpu")))


def timed_rounds(
    plain, gated, batches: list[list], rounds: int
) -> tuple[dict[str, list[float]], list[float]]:
    """Per round, each model's requests/s over every batch; and per batch and round, the plain time over the
    gated time of the same batch, the two run back to back (in turns first), so a drift of a shared machine
    falls on both."""
    seconds = {"without gate": [0.0] * rounds, "with gate": [0.0] * rounds}
    paired = []
    for round_index in range(rounds):
        for index, batch in enumerate(batches):
            order = [("without gate", plain), ("with gate", gated)]
            took = {}
            for name, model in order if (index + round_index) % 2 == 0 else order[::-1]:
                started = time.perf_counter()
                model.answer(batch)
                took[name] = time.perf_counter() - started
                seconds[name][round_index] += took[name]
            paired.append(took["without gate"] / took["with gate"])
    total = sum(len(b) for b in batches)
    return {name: [total / s for s in values] for name, values in seconds.items()}, paired


def flagged(model, states: list) -> float:
    """The share of `states` the model's automation finds novel."""
    requests = [parse_request(state, QUESTION_PROBE) for state in states]
    automation = model.automation
    return float(np.mean(automation.novel_states(requests, model.state_vectors)))


QUESTION_PROBE = {"probe": {"type": "noul", "instructions": "probe"}}


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        if args.smoke:
            folder, rows = smoke_setup(Path(scratch))
        else:
            folder, rows = args.model, read_rows(args.data, args.bank + args.validation + args.requests, 0)
        model = load_model(folder, args.family, args.smoke)
        first_held = args.bank + args.validation
        bank, fit = rows[: args.bank], rows[args.bank : first_held]
        held = rows[first_held : first_held + args.requests]
        started = time.perf_counter()
        gate = fit_novelty(
            model.state_vectors([r["state"] for r in bank]),
            model.state_vectors([r["state"] for r in fit]),
            args.quantile,
            longest=max(len(state_text(r["state"])) for r in bank + fit),
        )
        fit_s = time.perf_counter() - started
        certificates = certified_everywhere({**held[0]["questions"], **QUESTION_PROBE})
        plain = replace(model, automation=Automation(certificates))
        gated = replace(model, automation=Automation(certificates, gate))
        requests = [parse_request(r["state"], r["questions"]) for r in held]
        batches = [requests[i : i + args.concurrency] for i in range(0, len(requests), args.concurrency)]
        timed_rounds(plain, gated, batches[:2], 1)  # warm-up
        rates, paired = timed_rounds(plain, gated, batches, args.rounds)
        shares = {"in scope (held out)": flagged(gated, [r["state"] for r in held])}
        shares |= {kind: flagged(gated, states) for kind, states in planted_states().items()}
    return {
        "model": "tiny (smoke)" if args.smoke else str(args.model),
        "family": args.family,
        "requests": len(requests),
        "questions_per_request": len(held[0]["questions"]),
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "bank": int(gate.bank.shape[0]),
        "quantile": args.quantile,
        "threshold": gate.threshold,
        "fit_seconds": round(fit_s, 2),
        "requests_per_s": {name: [round(v, 2) for v in values] for name, values in rates.items()},
        "batch_ratio_quartiles": [round(float(q), 3) for q in np.quantile(paired, [0.25, 0.75])],
        "ratio": float(np.median(paired)),
        "flagged": shares,
    }


def print_table(result: dict) -> None:
    print(
        f"model {result['model']} ({result['family']}): {result['requests']} requests of {result['questions_per_request']} "
        f"questions, batches of {result['concurrency']}, {result['rounds']} interleaved rounds; gate bank "
        f"{result['bank']}, threshold {result['threshold']:.4f} at quantile {result['quantile']} "
        f"(fitted in {result['fit_seconds']} s)"
    )
    for name, values in result["requests_per_s"].items():
        print(f"  {name:<14} best {max(values):8.2f} req/s   rounds {values}")
    print(
        f"  ratio (with / without, median over batches run back to back): {result['ratio']:.3f}  (goal >= 0.9); "
        f"quartiles {result['batch_ratio_quartiles']}"
    )
    print("flagged novel:")
    for kind, share in result["flagged"].items():
        print(f"  {kind:<22} {share:6.1%}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "data/snapshots/minilm")
    parser.add_argument("--data", type=Path, default=ROOT / "data/processed/vader.jsonl")
    parser.add_argument("--smoke", action="store_true", help="a tiny random model on synthetic rows")
    parser.add_argument(
        "--family", choices=("joint", "laya"), default="joint", help="joint (the default) or laya"
    )
    parser.add_argument("--bank", type=int, default=4096, help="training states in the gate's bank")
    parser.add_argument("--validation", type=int, default=1000, help="states the threshold is fitted on")
    parser.add_argument("--requests", type=int, default=160, help="in-scope held-out requests served")
    parser.add_argument("--concurrency", type=int, default=8, help="requests per batch, as the server's")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quantile", type=float, default=0.99)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/bench_novelty.json")
    args = parser.parse_args(argv)
    if args.smoke:
        args.bank, args.validation, args.requests, args.rounds = 300, 150, 24, 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.smoke and not (args.model.is_dir() and args.data.is_file()):
        print(f"--model {args.model} or --data {args.data}: not found (or run with --smoke)", file=sys.stderr)
        return 2
    result = run(args)
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
