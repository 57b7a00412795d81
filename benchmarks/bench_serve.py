"""Serving benchmark: our Decision API against laya's own server, the same checkpoint, the same requests.

Both servers load the same exported folder on the CPU and answer the same 5-question requests (VADER held-out
states: tone, is_negative, is_positive, intensity and a topic choice) over loopback, at concurrency 1 and 8.
Each server runs alone (started, warmed up, measured, stopped), so they never share the cores. Prints p50/p95
latency and throughput per server and concurrency, the ratios ours/peer, the largest probability difference
between the two servers' answers, ours against the trained model's own forward pass (largest difference and argmax
agreement: the parity goal), and writes JSON to benchmarks/results/bench_serve.json.

Goals: at concurrency 8 at least 2x the peer's throughput; at concurrency 1 a p50 no worse than the peer's.

    python benchmarks/bench_serve.py [--model models/vader-minilm] [--requests 80] [--concurrency 1 8]
    python benchmarks/bench_serve.py --workers 1 2     # also ours with 2 server processes, ratio to 1
    python benchmarks/bench_serve.py --shadow-share 0.1   # also ours with a shadow challenger, latency ratio
    python benchmarks/bench_serve.py --joint runs/<key>/export   # also ours on a `joint` export (goal: >= 3x laya)
    python benchmarks/bench_serve.py --bf16   # also ours (and the joint export) with --precision bf16, and its parity
    python benchmarks/bench_serve.py --backends torch onnxruntime openvino   # ours on each encoder runtime
    python benchmarks/bench_serve.py --fairness --requests 20 --rounds 2   # another caller's latency behind a flood
    python benchmarks/bench_serve.py --int8 --joint runs/<key>/export --backends torch onnxruntime openvino

With `--backends`, ours runs once per `decision serve --backend` (the first fills the main table), and a
backend table gives each one's requests/s against laya-serve, p50, GFLOP/s against the matmul peak, parity
with the trained model (goal: |Δp| <= 1e-4, every argmax) and the backend each server reported on /healthz;
`--joint` and `--bf16` then run per backend too (bf16: the backends that serve it). With torch among the
backends and `--joint`, it also prints each runtime's requests/s over torch's at c=8 for both families (goal:
the joint export's factor at least the laya family's).

With `--int8`, only the precisions are measured, side by side with laya-serve in one interleaved run per family
(`--model`, and the `--joint` export): ours at fp32 on each of `--backends`, at bf16 where the CPU runs it
natively (torch and OpenVINO), and at int8 (the export's `encoder.int8.onnx` on ONNX Runtime); requests/s at
each concurrency and p50, each against laya-serve's, and each column's argmax agreement with fp32 and accuracy
and ECE change on the held-out rows (each precision calibrated as it serves: int8 by its own calibrator). Each
model is exported and quantized into benchmarks/.cache/int8/ first, with bounds wide enough that `--precision
int8` serves it to be timed; the verdict under params.yaml's `quantize:` bounds is printed beside it. Goals: the
laya family at int8 at least 3x laya-serve at c=8, the joint export's int8 at least 1.5x its own fp32, each at
agreement >= 99% and accuracy and ECE within 0.005. JSON to benchmarks/results/bench_serve_precision.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.families import load_decision_model  # noqa: E402
from pipeline.rundir import RunFolder  # noqa: E402  (after the path set-up, as a script run from anywhere)

SAMPLE = 40  # requests whose answers are compared (with laya's, with the trained model's)
TOPIC = {
    "type": "choice",
    "instructions": "Where does this text come from?",
    "criteria": {
        "product": "a product review",
        "movie": "a movie review",
        "news": "a news editorial",
        "social": "a social media post",
    },
}


def default_model() -> Path:
    """The model the serving benchmarks serve: `make run`'s export where one was made, else the stock
    snapshot."""
    exported = ROOT / "models/vader-minilm"
    return exported if exported.exists() else ROOT / "data/snapshots/minilm"


def build_requests(data: Path, n: int) -> list[dict]:
    from pipeline.config import load_params
    from pipeline.data.split import TrainSource
    from pipeline.stages.smoke import heldout_requests

    validated = TrainSource(data, split_config=load_params(ROOT / "params.yaml").validate).validated()
    bodies = heldout_requests(validated.split.heldout, 4 * n)
    return [{"state": b["state"], "questions": {**b["questions"], "topic": TOPIC}} for b in bodies[:n]]


def start_ours(
    model: Path,
    port: int,
    device: str,
    workers: int = 1,
    shadow_share: float | None = None,
    precision: str = "fp32",
    threads: int | None = None,
    confine: Callable[[], None] | None = None,
    backend: str = "auto",
    inference_log: str | None = None,
    keys: str | None = None,
) -> subprocess.Popen:
    """`decision serve` on `model`; `confine` runs in the child before it starts (an affinity mask, a cgroup),
    so the server sees its CPU from the start. The inference log is off unless `inference_log` names a folder:
    a benchmark's requests are not traffic (bench_inference_log.py measures what logging costs)."""
    command = [
        sys.executable,
        "-m",
        "pipeline.cli.main",
        "serve",
        "--model",
        str(model),
        "--port",
        str(port),
        "--device",
        device,
        "--workers",
        str(workers),
        "--precision",
        precision,
        "--backend",
        backend,
    ]
    command += ["--inference-log", inference_log] if inference_log else ["--no-inference-log"]
    if shadow_share is not None:  # the same folder as its own challenger: the cost of shadowing alone
        command += ["--shadow", str(model), "--shadow-share", str(shadow_share)]
    if threads is not None:
        command += ["--threads", str(threads)]
    command += ["--keys", keys] if keys else []
    return subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=confine
    )


def start_laya(
    model: Path, port: int, device: str, confine: Callable[[], None] | None = None
) -> subprocess.Popen:
    """laya-serve maps every built-in model name to the folder, or its router reaches for a hub."""
    folder = str(model.resolve())
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "LAYA_HOST": "127.0.0.1",
        "LAYA_PORT": str(port),
        "LAYA_DEVICE": device,
        "LAYA_MODELS": "english",
        "LAYA_EXTRA_MODELS": json.dumps(
            {"english": folder, "multilingual": folder, "typed-decisions": folder}
        ),
    }
    laya_serve = Path(sys.executable).with_name("laya-serve")
    return subprocess.Popen(
        [str(laya_serve)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=confine
    )


def wait_ready(url: str, body: dict, process: subprocess.Popen, timeout_s: float = 180) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server for {url} exited with {process.returncode}")
        try:
            if httpx.post(f"{url}/v1/systemone", json=body, timeout=30).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout_s} s")


def load(url: str, bodies: list[dict], concurrency: int, deadline_s: float | None = None) -> dict:
    """Send every body once from `concurrency` client threads (none started after `deadline_s` seconds);
    latency per request and overall throughput."""
    import httpx

    latencies: list[float] = []
    errors: list[int] = []
    next_index = iter(range(len(bodies)))
    lock = threading.Lock()
    stop_at = time.perf_counter() + (deadline_s or float("inf"))

    def worker() -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            while True:
                with lock:
                    index = next(next_index, None)
                if index is None or time.perf_counter() > stop_at:
                    return
                started = time.perf_counter()
                response = http.post("/v1/systemone", json=bodies[index])
                elapsed = time.perf_counter() - started
                with lock:
                    (
                        latencies.append(elapsed)
                        if response.status_code == 200
                        else errors.append(response.status_code)
                    )

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    ms = np.asarray(latencies) * 1000
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "errors": len(errors),
        "p50_ms": float(np.percentile(ms, 50)),
        "p95_ms": float(np.percentile(ms, 95)),
        "throughput_rps": len(latencies) / wall,
    }


def fairness(model: Path, bodies: list[dict], args) -> dict:
    """Another caller's latency behind a flood: one key floods the server (`--flood` client threads sending
    without pause) while a second sends `--requests` requests one at a time, with its own key (its own line,
    taken in turn with the flood's) and, alternating, with the flood's key (one line with the flood: what a
    plain first-come queue gives it). p50 and p95 of the second caller's requests and the flood's throughput,
    each."""
    import tempfile

    from pipeline.serving.keys import add_key
    from pipeline.stages.smoke import free_port

    with tempfile.TemporaryDirectory() as folder:
        keys = str(Path(folder) / "keys.json")
        flood_key, own_key = add_key(keys, "flood"), add_key(keys, "light")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        process = start_ours(model, port, args.device, keys=keys)
        try:
            wait_ready(url, bodies[0], process)
            load(url, bodies[:16], 8)  # warm-up
            rounds = {"own key": [], "the flood's key": []}
            for _ in range(args.rounds):
                for name, key in (("own key", own_key), ("the flood's key", flood_key)):
                    rounds[name].append(_behind_a_flood(url, bodies, flood_key, key, args.flood))
        finally:
            process.terminate()
            process.wait(timeout=30)
    print(
        f"\na second caller's {len(bodies)} requests, one at a time, behind {args.flood} flood threads "
        f"(best of {args.rounds} rounds, alternating)"
    )
    print(f"{'second caller sends with':<26}{'p50 ms':>9}{'p95 ms':>9}{'flood req/s':>13}")
    best = {name: min(runs, key=lambda run: run["p50_ms"]) for name, runs in rounds.items()}
    for name, run in best.items():
        print(f"{name:<26}{run['p50_ms']:>9.0f}{run['p95_ms']:>9.0f}{run['flood_rps']:>13.1f}")
    shared, own = best["the flood's key"], best["own key"]
    print(
        f"p50 in a line of its own / in the flood's line: {own['p50_ms'] / shared['p50_ms']:.2f}; "
        f"p95 {own['p95_ms'] / shared['p95_ms']:.2f}"
    )
    return {"flood_threads": args.flood, "rounds": rounds, "best": best}


def _behind_a_flood(url: str, bodies: list[dict], flood_key: str, key: str, threads: int) -> dict:
    import httpx

    stop, sent = threading.Event(), []

    def flood() -> None:
        with httpx.Client(
            base_url=url, timeout=120, headers={"Authorization": f"Bearer {flood_key}"}
        ) as http:
            index = 0
            while not stop.is_set():
                http.post("/v1/systemone", json=bodies[index % len(bodies)])
                sent.append(time.perf_counter())
                index += 1

    flooding = [threading.Thread(target=flood) for _ in range(threads)]
    for thread in flooding:
        thread.start()
    time.sleep(2.0)  # the flood's line fills
    latencies = []
    with httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {key}"}) as http:
        for body in bodies:
            started = time.perf_counter()
            assert http.post("/v1/systemone", json=body).status_code == 200
            latencies.append(time.perf_counter() - started)
    window = (time.perf_counter() - sum(latencies), time.perf_counter())
    stop.set()
    for thread in flooding:
        thread.join()
    answered = sum(window[0] <= moment <= window[1] for moment in sent)
    ms = np.asarray(latencies) * 1000
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p95_ms": float(np.percentile(ms, 95)),
        "flood_rps": answered / (window[1] - window[0]),
    }


def answers(url: str, bodies: list[dict]) -> list[dict]:
    import httpx

    with httpx.Client(base_url=url, timeout=60) as http:
        return [http.post("/v1/systemone", json=b).json()["answers"] for b in bodies]


def measure(
    name: str,
    start,
    model: Path,
    bodies: list[dict],
    levels: list[int],
    warmup: int,
    device: str,
    processes: int = 1,
) -> dict:
    from pipeline.stages.smoke import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start(model, port, device)
    try:
        wait_ready(url, bodies[0], process)
        wait_processes(url, processes)
        health = served_backend(url)
        load(url, bodies[:warmup], max(levels))
        runs = [load(url, bodies, c) for c in levels]
        sample = answers(url, bodies[:SAMPLE])
    finally:
        process.terminate()
        process.wait(timeout=30)
    if health["backend"]:
        print(f"  {name}: backend {health['backend']} ({health['backend_reason']})", flush=True)
    for run in runs:
        print(
            f"  {name:<5} c={run['concurrency']}: {run['throughput_rps']:.1f} req/s, p50 {run['p50_ms']:.0f} "
            f"ms, p95 {run['p95_ms']:.0f} ms, errors {run['errors']}",
            flush=True,
        )
    return {"runs": runs, "sample": sample, **health}


def measure_interleaved(
    starts: dict[str, Callable], model: Path, bodies: list[dict], levels: list[int], device: str, rounds: int
) -> dict[str, dict]:
    """Each server measured `rounds` times, the servers in turn each round, so that a spell of load on the
    shared machine falls on all of them alike; per server and concurrency, its best round (the same rule for
    every server, laya-serve included)."""
    measured: dict[str, list[dict]] = {name: [] for name in starts}
    for round_ in range(rounds):
        for name, start in starts.items():
            label = name if rounds == 1 else f"{name} (round {round_ + 1} of {rounds})"
            measured[name].append(measure(label, start, model, bodies, levels, 16, device))
    return {name: best_rounds(results) for name, results in measured.items()}


def best_rounds(results: list[dict]) -> dict:
    """One server's rounds as one result: per concurrency, the run with the most requests/s."""
    runs = [max(level, key=lambda run: run["throughput_rps"]) for level in zip(*(r["runs"] for r in results))]
    return {**results[0], "runs": runs, "rounds": len(results)}


def served_backend(url: str) -> dict:
    """The encoder runtime a server reports on /healthz, and why (None for a server that reports none:
    laya's)."""
    import httpx

    response = httpx.get(f"{url}/healthz", timeout=10)
    health = response.json() if response.status_code == 200 else {}
    return {"backend": health.get("backend"), "backend_reason": health.get("backend_reason")}


def wait_processes(url: str, n: int, timeout_s: float = 180) -> None:
    """Until `n` server processes have each answered /healthz with a loaded model (new connections reach
    any)."""
    import httpx

    seen: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while n > 1 and len(seen) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(seen)} of {n} server processes answered")
        response = httpx.get(f"{url}/healthz", timeout=10)
        if response.status_code == 200:
            seen.add(response.json()["pid"])
        time.sleep(0.05)


def flops_per_request(loaded, bodies: list[dict]) -> float:
    """Mean floating-point operations of one request's forward pass, counted by torch on the model itself."""
    from torch.utils.flop_counter import FlopCounterMode

    from pipeline.data.answers import parse_request

    # The counter's module tracker hooks every tensor that requires grad, which fails inside the families'
    # no-grad forward passes: served weights never need grad anyway.
    loaded.loaded.model.requires_grad_(False)
    with FlopCounterMode(display=False) as counter:
        for body in bodies:
            loaded.answer([parse_request(body["state"], body["questions"])])
    return counter.get_total_flops() / len(bodies)


def matmul_peak_gflops(m: int = 2048, k: int = 2048, n: int = 2048, repeats: int = 5) -> float:
    """The best fp32 GFLOP/s of an m x k by k x n matmul here, with torch's default threads: the distance to
    the limit (square: the machine's; the model's own feed-forward shape: what its layers could reach at
    best)."""
    import torch

    a, b = torch.randn(m, k), torch.randn(k, n)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - started)
    return 2 * m * k * n / best / 1e9


def feed_forward_shape(loaded, bodies: list[dict], concurrency: int = 8) -> tuple[int, int, int]:
    """(tokens in one serving pass at `concurrency`: its requests' sequences packed into one pass, hidden
    width, feed-forward width) of the model's encoder on these requests."""
    from pipeline.data.answers import parse_request

    tokens = [loaded.answer([parse_request(b["state"], b["questions"])])[0].input_tokens for b in bodies]
    encoder = next(
        m.config
        for m in loaded.loaded.model.modules()
        if hasattr(getattr(m, "config", None), "intermediate_size")
    )
    rows = int(sum(tokens) / len(tokens) * concurrency)
    return rows, int(encoder.hidden_size), int(encoder.intermediate_size)


def peer_rps(table: list[dict], concurrency: int) -> float | None:
    return next((row["laya"]["throughput_rps"] for row in table if row["concurrency"] == concurrency), None)


def max_difference(ours: list[dict], peer: list[dict]) -> float:
    from pipeline.data.answers import answer_probabilities

    diffs = [
        np.abs(np.subtract(answer_probabilities(a[q]), answer_probabilities(b[q]))).max()
        for a, b in zip(ours, peer)
        for q in a
    ]
    return float(max(diffs))


def trained_answers(served, bodies: list[dict]) -> list[dict] | None:
    """A laya-family model's answers from the forward pass training uses (`decision_logits`, padded, one
    sequence at a time, calibrated as served): what the server's packed pass must equal. None for other
    families."""
    from pipeline.data.answers import parse_request, shape_answers
    from pipeline.families.laya.predict import calibrated_probabilities, padded_item_logits, request_items

    if served.family.name != "laya":
        return None
    out = []
    for body in bodies:
        request = parse_request(body["state"], body["questions"])
        items = request_items(served.loaded, request.state, list(request.questions.values()))
        probabilities = calibrated_probabilities(
            served.loaded, items, padded_item_logits(served.loaded, items, 1)
        )
        by_id = {item.question_id: p for item, p in zip(items, probabilities)}
        out.append(shape_answers(request.questions, by_id, request.legends))
    return out


def parity_with(sample: list[dict], reference: list[dict] | None, name: str) -> dict | None:
    """How far served answers are from the trained model's fp32 forward pass (printed); None without a
    reference."""
    if reference is None:
        return None
    parity = {
        "max_probability_difference": max_difference(sample, reference),
        "argmax_agreement": argmax_agreement(sample, reference),
    }
    print(
        f"{name} vs the trained model's fp32 forward pass ({len(sample)} requests): largest probability "
        f"difference {parity['max_probability_difference']:.2e} (goal <= 1e-3), argmax agreement "
        f"{parity['argmax_agreement']:.1%} (goal 100%)"
    )
    return parity


def in_process_answers(model: Path, bodies: list[dict]) -> list[dict]:
    from pipeline.data.answers import parse_request

    served = load_decision_model(model)
    return [r.answers for r in served.answer([parse_request(b["state"], b["questions"]) for b in bodies])]


def argmax_agreement(ours: list[dict], reference: list[dict]) -> float:
    from pipeline.data.answers import answer_probabilities

    same = [
        np.argmax(answer_probabilities(a[q])) == np.argmax(answer_probabilities(b[q]))
        for a, b in zip(ours, reference)
        for q in a
    ]
    return float(np.mean(same))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=default_model())
    parser.add_argument("--data", type=Path, default=ROOT / "data/processed/vader.jsonl")
    parser.add_argument("--requests", type=int, default=80, help="requests per concurrency level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--device", default="cpu", help="where both servers run the model (cpu or cuda)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/bench_serve.json")
    parser.add_argument(
        "--shadow-share",
        type=float,
        help="also measure ours with a shadow challenger scoring this share of requests",
    )
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1],
        help="measure ours with each number of server processes (the first is compared with laya)",
    )
    parser.add_argument(
        "--bf16",
        action="store_true",
        help="also measure ours with --precision bf16 (where the CPU runs bf16 natively) and its parity",
    )
    parser.add_argument(
        "--joint",
        type=Path,
        help="a `joint`-family export: also measure ours on it against laya-serve on --model",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure ours (each backend) and laya-serve this many times in turn, keeping each one's "
        "best round (default 1)",
    )
    parser.add_argument(
        "--backends",
        nargs="+",
        default=["auto"],
        choices=["auto", "torch", "onnxruntime", "openvino"],
        help="ours with each `decision serve --backend` (default: auto); the first fills the main table",
    )
    parser.add_argument(
        "--fairness",
        action="store_true",
        help="only measure a second caller's latency behind a flood from another key (--flood "
        "threads), in its own line and in the flood's; --requests is the second caller's",
    )
    parser.add_argument("--flood", type=int, default=32, help="the flood's client threads with --fairness")
    parser.add_argument(
        "--int8",
        action="store_true",
        help="only measure fp32, bf16 and int8 side by side with laya-serve, with each one's agreement and "
        "accuracy change on the held-out rows (--model, and --joint)",
    )
    args = parser.parse_args()

    bodies = build_requests(args.data, args.requests)
    if args.int8:
        result = precision_bench(args, bodies)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_name("bench_serve_precision.json").write_text(json.dumps(result, indent=2))
        return 0
    if args.fairness:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        result = fairness(args.model, bodies, args)
        args.out.with_name("bench_serve_fairness.json").write_text(json.dumps(result, indent=2))
        return 0
    print(
        f"model {args.model} on {args.device}, {len(bodies)} requests x {len(bodies[0]['questions'])} "
        "questions",
        flush=True,
    )
    first = args.backends[0]
    starts = {
        f"ours {b}": functools.partial(start_ours, workers=args.workers[0], backend=b) for b in args.backends
    }
    interleaved = measure_interleaved(
        {**starts, "laya": start_laya}, args.model, bodies, args.concurrency, args.device, args.rounds
    )
    by_workers = {args.workers[0]: interleaved[f"ours {first}"]}
    by_workers.update(
        {
            w: measure(
                f"ours x{w}",
                functools.partial(start_ours, workers=w, backend=first),
                args.model,
                bodies,
                args.concurrency,
                16,
                args.device,
                w,
            )
            for w in args.workers[1:]
        }
    )
    ours = by_workers[args.workers[0]]
    peer = interleaved["laya"]
    table = []
    print(f"\n{'c':>3} {'server':<6}{'req/s':>8}{'p50 ms':>9}{'p95 ms':>9}")
    for mine, theirs in zip(ours["runs"], peer["runs"]):
        for name, run in (("ours", mine), ("laya", theirs)):
            print(
                f"{run['concurrency']:>3} "
                f"{name:<6}{run['throughput_rps']:>8.1f}{run['p50_ms']:>9.0f}{run['p95_ms']:>9.0f}"
            )
        table.append(
            {
                "concurrency": mine["concurrency"],
                "ours": mine,
                "laya": theirs,
                "throughput_ratio": mine["throughput_rps"] / theirs["throughput_rps"],
                "p50_ratio": mine["p50_ms"] / theirs["p50_ms"],
            }
        )
    print()
    for row in table:
        print(
            f"c={row['concurrency']}: throughput ours/laya {row['throughput_ratio']:.2f}x, "
            f"p50 ours/laya {row['p50_ratio']:.2f}"
        )
    difference = max_difference(ours["sample"], peer["sample"])
    print(
        f"largest probability difference between the servers' answers ({SAMPLE} requests; laya applies only "
        f"temperatures, so a vector-scaling calibrator differs): {difference:.2e}"
    )
    by_c = {row["concurrency"]: row for row in table}
    goals = {}
    if 8 in by_c:
        goals["c8_throughput_at_least_2x"] = by_c[8]["throughput_ratio"] >= 2.0
    if 1 in by_c:
        goals["c1_p50_no_worse"] = by_c[1]["p50_ratio"] <= 1.0
    print("goals:", ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in goals.items()))
    workers = workers_table(by_workers, args.workers[0])
    # One load for the parity, the FLOP count and the feed-forward shape.
    served = load_decision_model(args.model)
    reference = trained_answers(served, bodies[:SAMPLE])
    parity = parity_with(ours["sample"], reference, "ours served")
    flops = flops_per_request(served, bodies[:20])
    peak = matmul_peak_gflops()
    shape = feed_forward_shape(served, bodies[:20])
    shaped_peak = matmul_peak_gflops(*shape)
    print(
        f"\n{flops / 1e9:.2f} GFLOP per request (counted by torch.utils.flop_counter); fp32 matmul peak here "
        f"{peak:.1f} GFLOP/s (2048^3), {shaped_peak:.1f} GFLOP/s at the model's feed-forward shape "
        f"{shape[0]}x{shape[1]}x{shape[2]} (one packed pass at c=8)"
    )
    needed = 2 * peer_rps(table, 8) * flops / 1e9 if peer_rps(table, 8) else None
    if needed:
        print(
            f"2x laya at c=8 needs {needed:.1f} GFLOP/s = {needed / shaped_peak:.0%} of the "
            "feed-forward-shape peak"
        )
    for row in table:
        achieved = row["ours"]["throughput_rps"] * flops / 1e9
        print(
            f"c={row['concurrency']}: ours {achieved:.1f} GFLOP/s = {achieved / peak:.0%} of the matmul "
            f"peak; laya {row['laya']['throughput_rps'] * flops / 1e9:.1f} GFLOP/s"
        )
    shadowed = None
    if args.shadow_share is not None:
        shadowed = measure(
            f"ours+shadow {args.shadow_share}",
            functools.partial(start_ours, shadow_share=args.shadow_share),
            args.model,
            bodies,
            args.concurrency,
            16,
            args.device,
        )
        for run, plain in zip(shadowed["runs"], ours["runs"]):
            print(
                f"c={run['concurrency']}: with the shadow, p50 {run['p50_ms']:.0f} ms vs "
                f"{plain['p50_ms']:.0f} ms ({run['p50_ms'] / plain['p50_ms']:.2f}x), req/s "
                f"{run['throughput_rps'] / plain['throughput_rps']:.2f}x"
            )
    bf16 = bf16_table(args.model, bodies, args, peer, reference) if args.bf16 else None
    # With several backends, the backend table measures the joint export on each, in turn.
    joint = (
        joint_table(args.joint, bodies, args, peer, goals, first)
        if args.joint and len(args.backends) == 1
        else None
    )
    backends = None
    if len(args.backends) > 1:
        compared = {"flops": flops, "peak": peak, "reference": reference}
        measured = {b: interleaved[f"ours {b}"] for b in args.backends}
        backends = backends_table(measured, bodies, args, peer, goals, compared)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "model": str(args.model),
                "device": args.device,
                "table": table,
                "goals": goals,
                "joint": joint,
                "bf16": bf16,
                "backends": backends,
                "max_probability_difference": difference,
                "parity": parity,
                "workers": workers,
                "gflop_per_request": flops / 1e9,
                "matmul_peak_gflops": peak,
                "feed_forward_shape": shape,
                "feed_forward_peak_gflops": shaped_peak,
                "shadow": shadowed and shadowed["runs"],
            },
            indent=2,
        )
    )
    return 0


def bf16_table(model: Path, bodies: list[dict], args, peer: dict, reference: list[dict] | None) -> dict:
    """Ours with --precision bf16 on the same model against laya-serve's runs, and how far its answers move;
    per backend that serves bf16 (torch, openvino) when `--backends` lists several."""
    others = [b for b in args.backends[1:] if b in BF16_BACKENDS]
    by_backend = {b: bf16_table_on(model, bodies, args, peer, reference, b) for b in others}
    return {**bf16_table_on(model, bodies, args, peer, reference, args.backends[0]), "by_backend": by_backend}


BF16_BACKENDS = ("auto", "torch", "openvino")  # ONNX Runtime serves fp32 only


def bf16_table_on(
    model: Path, bodies: list[dict], args, peer: dict, reference: list[dict] | None, backend: str
) -> dict:
    measured = measure(
        f"ours bf16 {backend}",
        functools.partial(start_ours, precision="bf16", backend=backend),
        model,
        bodies,
        args.concurrency,
        16,
        args.device,
    )
    rows = []
    for run, theirs in zip(measured["runs"], peer["runs"]):
        ratio = run["throughput_rps"] / theirs["throughput_rps"]
        rows.append({"concurrency": run["concurrency"], "bf16": run, "throughput_ratio": ratio})
        print(
            f"c={run['concurrency']}: ours bf16 {run['throughput_rps']:.1f} req/s vs laya "
            f"{theirs['throughput_rps']:.1f}: {ratio:.2f}x; p50 {run['p50_ms']:.0f} vs "
            f"{theirs['p50_ms']:.0f} ms"
        )
    parity = parity_with(measured["sample"], reference, f"ours bf16 {backend}")
    joint = None
    if args.joint:
        joint = measure(
            f"joint bf16 {backend}",
            functools.partial(start_ours, precision="bf16", backend=backend),
            args.joint,
            bodies,
            args.concurrency,
            16,
            args.device,
        )
        for run, theirs in zip(joint["runs"], peer["runs"]):
            print(
                f"c={run['concurrency']}: joint bf16 {run['throughput_rps']:.1f} req/s vs laya "
                f"{theirs['throughput_rps']:.1f}: {run['throughput_rps'] / theirs['throughput_rps']:.2f}x"
            )
        fp32 = in_process_answers(args.joint, bodies[:SAMPLE])
        moved = max_difference(joint["sample"], fp32)
        print(
            f"joint bf16 vs the joint export's fp32 answers in process ({SAMPLE} requests): largest "
            f"probability difference {moved:.2e}, argmax agreement "
            f"{argmax_agreement(joint['sample'], fp32):.1%}"
        )
        joint = {"runs": joint["runs"], "max_probability_difference_to_fp32": moved}
    return {"backend": measured["backend"], "runs": rows, "parity": parity, "joint": joint}


def joint_table(
    model: Path, bodies: list[dict], args, peer: dict, goals: dict, backend: str, measured: dict | None = None
) -> dict:
    """Ours on a `joint` export (one pass per request answers every question) against laya-serve's runs
    (measured here unless given)."""
    if measured is None:
        measured = measure(
            f"joint {backend}",
            functools.partial(start_ours, backend=backend),
            model,
            bodies,
            args.concurrency,
            16,
            args.device,
        )
    flops = flops_per_request(load_decision_model(model), bodies[:20])
    accuracy = heldout_accuracy(model)
    print(f"\njoint export {model}: {flops / 1e9:.2f} GFLOP per request, held-out accuracy {accuracy}")
    rows = []
    for run, theirs in zip(measured["runs"], peer["runs"]):
        ratio = run["throughput_rps"] / theirs["throughput_rps"]
        rows.append(
            {
                "concurrency": run["concurrency"],
                "joint": run,
                "throughput_ratio": ratio,
                "p50_ratio": run["p50_ms"] / theirs["p50_ms"],
            }
        )
        print(
            f"c={run['concurrency']}: joint {run['throughput_rps']:.1f} req/s vs laya "
            f"{theirs['throughput_rps']:.1f}: {ratio:.2f}x; p50 {run['p50_ms']:.0f} vs "
            f"{theirs['p50_ms']:.0f} ms"
        )
    by_c = {row["concurrency"]: row for row in rows}
    if 8 in by_c:
        goals["joint_c8_throughput_at_least_3x"] = by_c[8]["throughput_ratio"] >= 3.0
        print(
            "goal joint >= 3x laya at c=8: "
            f"{'met' if goals['joint_c8_throughput_at_least_3x'] else 'NOT met'}"
        )
    return {
        "model": str(model),
        "backend": measured["backend"],
        "runs": rows,
        "gflop_per_request": flops / 1e9,
        "heldout_accuracy": accuracy,
    }


def backends_table(
    measured: dict[str, dict], bodies: list[dict], args, peer: dict, goals: dict, compared: dict
) -> dict:
    """Ours on each `--backends` entry (measured in turn with laya-serve) against laya-serve: req/s and its
    ratio, p50, GFLOP/s against the matmul peak, parity with the trained model; goals per backend; the joint
    export on each backend, in turn, with `--joint`."""
    print(
        f"\n{'backend':<12}{'served':<13}{'c':>3}{'req/s':>8}{'x laya':>8}{'p50 ms':>8}{'x laya':>8}"
        f"{'GFLOP/s':>9}{'x peak':>8}"
    )
    rows = []
    for backend, result in measured.items():
        for run, theirs in zip(result["runs"], peer["runs"]):
            gflops = run["throughput_rps"] * compared["flops"] / 1e9
            row = {
                "backend": backend,
                "served": result["backend"],
                "concurrency": run["concurrency"],
                "throughput_rps": run["throughput_rps"],
                "p50_ms": run["p50_ms"],
                "throughput_ratio": run["throughput_rps"] / theirs["throughput_rps"],
                "p50_ratio": run["p50_ms"] / theirs["p50_ms"],
                "gflops": gflops,
                "share_of_peak": gflops / compared["peak"],
            }
            rows.append(row)
            print(
                f"{backend:<12}{row['served']!s:<13}{row['concurrency']:>3}{row['throughput_rps']:>8.1f}"
                f"{row['throughput_ratio']:>7.2f}x{row['p50_ms']:>8.0f}{row['p50_ratio']:>7.2f}x{gflops:>9.1f}"
                f"{row['share_of_peak']:>7.0%}"
            )
    parity = {b: parity_with(r["sample"], compared["reference"], f"ours {b}") for b, r in measured.items()}
    for row in rows:
        if row["concurrency"] == 8:
            goals[f"{row['backend']}_c8_throughput_at_least_2x"] = row["throughput_ratio"] >= 2.0
        if row["concurrency"] == 1:
            goals[f"{row['backend']}_c1_p50_no_worse"] = row["p50_ratio"] <= 1.0
    for backend, figures in parity.items():
        if figures is not None:
            goals[f"{backend}_parity_1e-4"] = (
                figures["max_probability_difference"] <= 1e-4 and figures["argmax_agreement"] == 1.0
            )
    print("goals:", ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in goals.items()))
    joint = None
    if args.joint:
        starts = {f"joint {b}": functools.partial(start_ours, backend=b) for b in args.backends}
        joints = measure_interleaved(starts, args.joint, bodies, args.concurrency, args.device, args.rounds)
        joint = {
            b: joint_table(
                args.joint,
                bodies,
                args,
                peer,
                goals if b == args.backends[0] else {},
                b,
                joints[f"joint {b}"],
            )
            for b in args.backends
        }
    growth = lead_growth(rows, joint, goals) if joint and "torch" in args.backends else None
    return {"rows": rows, "parity": parity, "joint": joint, "lead_growth": growth}


def lead_growth(rows: list[dict], joint: dict[str, dict], goals: dict) -> dict[str, dict]:
    """Each runtime's requests/s over torch's at c=8, for the laya family (`--model`) and the joint export,
    from the same run: a runtime grows each family's lead over laya-serve by this factor (goal: the joint
    family's by at least the laya family's)."""
    laya = {row["backend"]: row["throughput_rps"] for row in rows if row["concurrency"] == 8}
    joints = {
        b: run["joint"]["throughput_rps"]
        for b, t in joint.items()
        for run in t["runs"]
        if run["concurrency"] == 8
    }
    growth = {}
    for backend in sorted(laya.keys() - {"torch"}):
        if "torch" in laya and "torch" in joints and backend in joints:
            growth[backend] = {
                "laya": laya[backend] / laya["torch"],
                "joint": joints[backend] / joints["torch"],
            }
            met = growth[backend]["joint"] >= growth[backend]["laya"]
            goals[f"{backend}_joint_lead_grows_as_laya"] = met
            print(
                f"{backend} over torch at c=8: laya family {growth[backend]['laya']:.2f}x, joint export "
                f"{growth[backend]['joint']:.2f}x (goal: joint >= laya): {'met' if met else 'NOT met'}"
            )
    return growth


def heldout_accuracy(model: Path) -> float | None:
    """The held-out accuracy the calibration report of the export's run measured (runs/<key>/export's report
    is runs/<key>/calibration_report.json; None for a folder outside a run)."""
    report = RunFolder(model.parent).calibration_report
    if model.name != "export" or not report.is_file():
        return None
    return json.loads(report.read_text())["overall"]["accuracy"]


def workers_table(by_workers: dict[int, dict], first: int) -> list[dict]:
    """Ours with each number of server processes against the first, per concurrency (printed and returned)."""
    rows = []
    for w, measured in by_workers.items():
        for run, baseline in zip(measured["runs"], by_workers[first]["runs"]):
            rows.append(
                {
                    "workers": w,
                    "concurrency": run["concurrency"],
                    "throughput_rps": run["throughput_rps"],
                    "p50_ms": run["p50_ms"],
                    "throughput_ratio": run["throughput_rps"] / baseline["throughput_rps"],
                }
            )
    if len(by_workers) > 1:
        print("\nworkers  c   req/s  p50 ms  req/s vs " + f"{first} worker(s)")
        for row in rows:
            print(
                f"{row['workers']:>7} {row['concurrency']:>2} {row['throughput_rps']:>7.1f} "
                f"{row['p50_ms']:>7.0f} {row['throughput_ratio']:>8.2f}x"
            )
    return rows


INT8_CACHE = ROOT / "benchmarks/.cache/int8"
# Wide enough that `--precision int8` serves the model to be timed; the verdict under params.yaml's bounds is
# printed beside the figures.
TIMING_BOUNDS = {"int8": True, "min_agreement": 0.01, "max_accuracy_drop": 0.99, "max_ece_rise": 0.99}


def precision_bench(args, bodies: list[dict]) -> dict:
    """`--int8`: per family, ours at each precision and backend against laya-serve, interleaved, with each
    precision's quality on the held-out rows (module docstring)."""
    models = {"laya": int8_ready(args.model, args.data, "laya")}
    if args.joint:
        models["joint"] = int8_ready(args.joint, args.data, "joint")
    result: dict = {"families": {}, "goals": {}}
    peer = None
    for family, (folder, rows) in models.items():
        print(f"\n{family}: {folder}", flush=True)
        starts = {
            f"{precision} {backend}": functools.partial(start_ours, precision=precision, backend=backend)
            for precision, backend in precision_columns(args.backends)
        }
        if peer is None:  # laya-serve on the laya-family model: the yardstick of both families
            starts["laya-serve"] = start_laya
        measured = measure_interleaved(starts, folder, bodies, args.concurrency, args.device, args.rounds)
        peer = measured.pop("laya-serve", peer)
        quality = precision_quality(folder, rows, {name.split()[0] for name in measured})
        table = precision_rows(measured, peer, quality)
        result["families"][family] = {"model": str(folder), "rows": table, "quality": quality}
        result["goals"] |= precision_goals(family, table)
    print("\ngoals:", ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in result["goals"].items()))
    return result


def precision_columns(backends: list[str]) -> list[tuple[str, str]]:
    """(precision, backend) of every column: fp32 on each backend, bf16 where native on the backends that serve
    it, int8 on ONNX Runtime (its graph's runtime)."""
    from pipeline.device import cpu_has_native_bf16

    columns = [("fp32", b) for b in backends]
    if cpu_has_native_bf16():
        columns += [("bf16", b) for b in backends if b in BF16_BACKENDS]
    return [*columns, ("int8", "onnxruntime")]


def int8_ready(model: Path, data: Path, family: str) -> tuple[Path, list]:
    """A copy of `model` exported with its int8 encoder and report (made once, in INT8_CACHE), and the held-out
    rows its quality is measured on: an export's run folder's split where it has one, else `data`'s split."""
    import shutil

    from pipeline.config import QuantizeConfig, load_params
    from pipeline.data.split import TrainSource
    from pipeline.families.runtimes.quantize import INT8_REPORT
    from pipeline.scoring.precision import verdict
    from pipeline.stages.export import export_folder
    from pipeline.stages.quantize import Rows, quantize_export, run_rows

    params = load_params(ROOT / "params.yaml")
    rows = run_rows(model.parent) if model.name == "export" else Rows([], [])
    if not rows.check:
        split = TrainSource(data, split_config=params.validate).validated().split
        rows = Rows(split.validation, split.heldout)
    folder = INT8_CACHE / family
    if not (folder / INT8_REPORT).is_file():
        shutil.rmtree(folder, ignore_errors=True)
        folder.parent.mkdir(parents=True, exist_ok=True)
        if (model / "manifest.json").is_file():
            shutil.copytree(model, folder)
        else:
            export_folder(model, folder)
        quantize_export(folder, rows, QuantizeConfig(**TIMING_BOUNDS), params.certify, say=print)
    report = json.loads((folder / INT8_REPORT).read_text())
    passes, why = verdict(report["overall"], params.quantize)
    print(f"{family} int8 under params.yaml's bounds: {'passes' if passes else 'fails'}: {why}", flush=True)
    return folder, rows.check


def precision_quality(folder: Path, records: list, precisions: set[str]) -> dict[str, dict]:
    """Each precision's answers to the held-out rows (as it serves: int8 with its own calibrator) against
    fp32's: argmax agreement, accuracy and ECE with their changes."""
    from pipeline.scoring.precision import compare_precisions
    from pipeline.stages.evaluate import served_logits, served_model

    answered = {}
    for precision in sorted(precisions | {"fp32"}):
        model, _ = served_model(folder, "cpu", precision)
        decisions, logits = served_logits(model, records)
        answered[precision] = (decisions, model.family.served_probabilities(model.loaded, decisions, logits))
    decisions, reference = answered["fp32"]
    quality = {}
    for precision, (_, probabilities) in answered.items():
        quality[precision] = compare_precisions(decisions, reference, probabilities)["overall"]
        figures = quality[precision]
        print(
            f"  {precision}: agreement {figures['argmax_agreement']:.2%}, accuracy {figures['accuracy']:.4f} "
            f"({figures['accuracy_change']:+.4f}), ECE {figures['ece']:.4f} ({figures['ece_change']:+.4f}) on "
            f"{figures['decisions']:,} held-out decisions",
            flush=True,
        )
    return quality


def precision_rows(measured: dict[str, dict], peer: dict, quality: dict[str, dict]) -> list[dict]:
    """Per column and concurrency: requests/s and p50, against laya-serve's and against fp32 on the same
    backend, with the column's quality (printed as a table)."""
    rows = []
    print(
        f"\n{'column':<22}{'c':>3}{'req/s':>8}{'vs laya':>9}{'vs fp32':>9}{'p50 ms':>8}{'agree':>8}{'Δacc':>8}{'ΔECE':>8}"
    )
    for name, result in measured.items():
        precision, backend = name.split()
        fp32 = measured.get(f"fp32 {backend}", measured[next(iter(measured))])
        figures = quality[precision]
        for run, theirs, own in zip(result["runs"], peer["runs"], fp32["runs"]):
            row = {
                "precision": precision,
                "backend": backend,
                "served_by": result.get("backend"),
                "concurrency": run["concurrency"],
                "throughput_rps": run["throughput_rps"],
                "p50_ms": run["p50_ms"],
                "laya_rps": theirs["throughput_rps"],
                "vs_laya": run["throughput_rps"] / theirs["throughput_rps"],
                "vs_fp32": run["throughput_rps"] / own["throughput_rps"],
                **{k: figures[k] for k in ("argmax_agreement", "accuracy_change", "ece_change")},
            }
            rows.append(row)
            print(
                f"{name:<22}{row['concurrency']:>3}{row['throughput_rps']:>8.1f}{row['vs_laya']:>8.2f}x"
                f"{row['vs_fp32']:>8.2f}x{row['p50_ms']:>8.0f}{row['argmax_agreement']:>8.2%}"
                f"{row['accuracy_change']:>+8.4f}{row['ece_change']:>+8.4f}"
            )
    for run in peer["runs"]:
        print(
            f"{'laya-serve':<22}{run['concurrency']:>3}{run['throughput_rps']:>8.1f}{'':>26}{run['p50_ms']:>8.0f}"
        )
    return rows


def precision_goals(family: str, rows: list[dict]) -> dict[str, bool]:
    """The issue's goal figures on this family's int8 rows at c=8 (quality bounds included)."""
    int8 = [r for r in rows if r["precision"] == "int8" and r["concurrency"] == 8]
    if not int8:
        return {}
    row = int8[0]
    quality = (
        row["argmax_agreement"] >= 0.99 and row["accuracy_change"] >= -0.005 and row["ece_change"] <= 0.005
    )
    if family == "laya":
        return {"laya_int8_c8_at_least_3x_laya": row["vs_laya"] >= 3.0 and quality}
    fp32 = max(r["throughput_rps"] for r in rows if r["precision"] == "fp32" and r["concurrency"] == 8)
    return {"joint_int8_c8_at_least_1.5x_its_fp32": row["throughput_rps"] / fp32 >= 1.5 and quality}


if __name__ == "__main__":
    sys.exit(main())
