"""Where a joint-family answer's time goes, per encoder backend, in process: the encoder pass against the rest
(tokenising, the head in torch, calibration, answer shaping), with the question texts' token cache on and off.

On bench_serve.py's 5-question requests, answered 8 at a time as the server groups them at concurrency 8, it
runs, interleaved round by round in one process, each backend that is installed (torch, ONNX Runtime,
OpenVINO, fp32) with the token cache (`joint.token_cache`, what a server keeps) and without it (capacity 0:
every question text tokenised again in every request, as before the cache). It prints per variant the best
round's requests/s, the encoder's and the rest's milliseconds per request, the ratio of each runtime to torch,
and the cache's ratio. The encoder's share bounds what any encoder runtime can do for the whole answer: a
runtime k times faster on the encoder makes the answer 1 / (1 - s + s / k) times faster at encoder share s.

    python benchmarks/bench_joint_answer.py --model runs/<key>/export [--requests 80] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from bench_serve import build_requests  # noqa: E402  (a sibling script)

from pipeline.data.answers import parse_request  # noqa: E402
from pipeline.families import load_decision_model  # noqa: E402
from pipeline.families.joint.token_cache import TokenCache  # noqa: E402
from pipeline.families.runtimes.backends import choose_backend  # noqa: E402

BATCH = 8  # requests per answer call: the server's batch at concurrency 8


class TimedEncoder:
    """An encoder pass that adds the seconds it runs to `seconds`."""

    def __init__(self, name: str, run) -> None:
        self.name, self.run, self.seconds = name, run, 0.0

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        hidden = self.run(input_ids, attention_mask)
        self.seconds += time.perf_counter() - start
        return hidden


def encoders(model, folder: Path, wanted: list[str]) -> dict[str, TimedEncoder]:
    """Each wanted backend that serves this model here, timed; torch is the model's own pass."""
    out = {}
    for name in wanted:
        choice = choose_backend(
            model, name, ROOT / "benchmarks/.cache/joint_answer/encoder.onnx", shipped=folder / "encoder.onnx"
        )
        if choice.name != name:
            print(f"{name}: not measured ({choice.reason})")
            continue
        run = choice.encoder if choice.encoder is not None else model.loaded.model.hidden_states
        out[name] = TimedEncoder(name, run)
    return out


def one_round(model, requests, encoder: TimedEncoder, cached: bool) -> dict[str, float]:
    model.encoder = encoder
    model.loaded.token_cache = TokenCache() if cached else TokenCache(capacity=0)
    model.answer(requests[:BATCH])  # warm: field vectors and question texts kept, as in a running server
    encoder.seconds = 0.0
    start = time.perf_counter()
    for i in range(0, len(requests), BATCH):
        model.answer(requests[i : i + BATCH])
    wall = time.perf_counter() - start
    n = len(requests)
    return {
        "requests_per_s": n / wall,
        "encoder_ms": 1e3 * encoder.seconds / n,
        "rest_ms": 1e3 * (wall - encoder.seconds) / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True, help="a joint-family export")
    parser.add_argument("--data", type=Path, default=ROOT / "data/processed/vader.jsonl")
    parser.add_argument("--requests", type=int, default=80)
    parser.add_argument("--repeats", type=int, default=5, help="rounds; each variant's best round is kept")
    parser.add_argument("--backends", nargs="+", default=["torch", "onnxruntime", "openvino"])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/bench_joint_answer.json")
    args = parser.parse_args()

    model = load_decision_model(args.model)
    if model.family.name != "joint":
        parser.error(
            f"{args.model} is a {model.family.name}-family model; this benchmark measures the joint family"
        )
    bodies = build_requests(args.data, args.requests)
    requests = [parse_request(body["state"], body["questions"]) for body in bodies]
    timed = encoders(model, args.model, args.backends)
    best: dict[tuple[str, bool], dict[str, float]] = defaultdict(lambda: {"requests_per_s": 0.0})
    with torch.inference_mode():
        for _ in range(args.repeats):
            for name, encoder in timed.items():
                for cached in (True, False):
                    result = one_round(model, requests, encoder, cached)
                    if result["requests_per_s"] > best[name, cached]["requests_per_s"]:
                        best[name, cached] = result
    rows = [
        {"backend": name, "token_cache": cached, **best[name, cached]}
        for name in timed
        for cached in (True, False)
    ]
    print(
        f"{args.model}: {len(requests)} requests, {BATCH} per call, best of {args.repeats} rounds, "
        f"{torch.get_num_threads()} threads"
    )
    print(
        f"{'backend':12s} {'cache':5s} {'req/s':>7s} {'encoder ms':>10s} {'rest ms':>8s} {'share':>6s} "
        f"{'x torch':>7s} {'x no cache':>10s}"
    )
    for row in rows:
        torch_row = best["torch", row["token_cache"]] if "torch" in timed else None
        share = row["encoder_ms"] / (row["encoder_ms"] + row["rest_ms"])
        versus_torch = row["requests_per_s"] / torch_row["requests_per_s"] if torch_row else float("nan")
        versus_off = row["requests_per_s"] / best[row["backend"], False]["requests_per_s"]
        row.update(encoder_share=share, x_torch=versus_torch, x_no_cache=versus_off)
        print(
            f"{row['backend']:12s} {'on' if row['token_cache'] else 'off':5s} {row['requests_per_s']:7.1f} "
            f"{row['encoder_ms']:10.2f} {row['rest_ms']:8.2f} {share:6.0%} {versus_torch:6.2f}x "
            f"{versus_off:9.2f}x"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": str(args.model), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
