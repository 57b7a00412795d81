"""What the inference log costs the Decision API: requests/s and p50 with logging on, as a ratio to logging
off, measured side by side in one run.

The same `decision serve` on the same model and requests (VADER held-out states, 5 questions each, as
bench_serve.py sends them), once with `--inference-log` on a fresh folder and once with `--no-inference-log`,
in turn for `--rounds` rounds (so a spell of load on the shared machine falls on both alike), at concurrency 1
and 8; per setting and concurrency its best round. Every logged request is then counted in the folder, so the
"on" figures are of a server that really wrote each decision. Goal: on/off >= 0.95 for requests/s, and for p50
(off/on, so that higher is better in both).

    python benchmarks/bench_inference_log.py [--model models/vader-minilm] [--requests 160] [--rounds 3]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_serve import SAMPLE, build_requests, default_model, measure_interleaved, start_ours  # noqa: E402  (a sibling script)

from pipeline.flywheel.table import open_store  # noqa: E402

GOAL = 0.95


def writer_cost(bodies: list[dict], answers: list[dict], n: int = 5000) -> dict:
    """The log's own cost per decision, in process and without HTTP: `record` on the request path, and the
    background flush (JSON, Arrow, Parquet) that follows; far below the noise of the servers' comparison."""
    import time

    from pipeline.flywheel.log import InferenceLog, LogConfig, Served

    with tempfile.TemporaryDirectory() as folder:
        log = InferenceLog(LogConfig(folder, max_queue=n))
        entries = [
            Served(
                decision_id=f"{i:032x}",
                model="decision-model/1",
                model_version="1",
                owner="alice",
                state=bodies[i % len(bodies)]["state"],
                questions=bodies[i % len(bodies)]["questions"],
                answers=answers[i % len(answers)],
                latency_ms=60.0,
            )
            for i in range(n)
        ]
        started = time.perf_counter()
        for entry in entries:
            log.record(entry)
        recorded = time.perf_counter() - started
        started = time.perf_counter()
        written = log.flush()
        flushed = time.perf_counter() - started
    assert written == n
    return {"record_us": recorded / n * 1e6, "flush_us": flushed / n * 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=default_model())
    parser.add_argument("--data", type=Path, default=ROOT / "data/processed/vader.jsonl")
    parser.add_argument("--requests", type=int, default=160, help="requests per concurrency level and round")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--backend", default="torch", help="the encoder runtime of both servers (default torch)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/bench_inference_log.json")
    args = parser.parse_args()

    bodies = build_requests(args.data, args.requests)
    with tempfile.TemporaryDirectory(prefix="bench-inference-log-") as folder:
        starts = {
            "log on": functools.partial(start_ours, backend=args.backend, inference_log=folder),
            "log off": functools.partial(start_ours, backend=args.backend),
        }
        print(
            f"model {args.model}, {len(bodies)} requests x {len(bodies[0]['questions'])} questions, "
            f"{args.rounds} rounds, logging into {folder}",
            flush=True,
        )
        best = measure_interleaved(starts, args.model, bodies, args.concurrency, "cpu", args.rounds)
        written = open_store(folder).decisions().num_rows
    n = len(bodies)  # per round: the ready probe, the warm-up, the measured levels, the sampled answers
    sent = args.rounds * (1 + min(16, n) + len(args.concurrency) * n + min(SAMPLE, n))
    rows = []
    for on, off in zip(best["log on"]["runs"], best["log off"]["runs"]):
        rows.append(
            {
                "concurrency": on["concurrency"],
                "rps_on": on["throughput_rps"],
                "rps_off": off["throughput_rps"],
                "rps_ratio": on["throughput_rps"] / off["throughput_rps"],
                "p50_on_ms": on["p50_ms"],
                "p50_off_ms": off["p50_ms"],
                "p50_ratio": off["p50_ms"] / on["p50_ms"],
            }
        )
    print(
        "\n| concurrency | req/s log on | req/s log off | on/off | p50 on (ms) | p50 off (ms) | off/on | "
        "goal |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        met = "met" if min(r["rps_ratio"], r["p50_ratio"]) >= GOAL else "MISSED"
        print(
            f"| {r['concurrency']} | {r['rps_on']:.1f} | {r['rps_off']:.1f} | {r['rps_ratio']:.3f} | "
            f"{r['p50_on_ms']:.1f} | {r['p50_off_ms']:.1f} | {r['p50_ratio']:.3f} | >= {GOAL}: {met} |"
        )
    print(f"\ndecisions written with logging on: {written} of {sent} answered")
    answers = best["log on"]["sample"]
    cost = writer_cost(bodies, answers)
    median_ms = min(r["p50_off_ms"] for r in rows)
    print(
        f"the log's own cost per decision (in process, 5,000 decisions): record {cost['record_us']:.1f} us "
        f"on the request path, flush {cost['flush_us']:.1f} us in the background thread: "
        f"{(cost['record_us'] + cost['flush_us']) / (median_ms * 1000):.2%} of the fastest p50 without the "
        "log"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"rows": rows, "written": written, "answered": sent, "rounds": args.rounds}, indent=2)
    )
    return 0 if written == sent else 1


if __name__ == "__main__":
    sys.exit(main())
