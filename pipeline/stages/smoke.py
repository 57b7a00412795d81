"""The Decision API smoke test: held-out decisions sent over HTTP, compared with in-process predictions and
with what the trained model answered.

Each held-out row of DATA becomes one request (its usable questions). With `--model-dir`, the same folder is
loaded here and every answer is compared: agreement on the chosen option and the largest probability
difference (fails below 99.5% agreement or above 1e-3). With `--expected` (a run's `expected_answers.npz`,
the calibrated probabilities the trained model gave each held-out decision before export), every answer is
compared with those too: that is what catches a broken merge or export, which the folder's own in-process
answers share. It fails below 99.5% agreement or above `TRAINED_MAX_DIFF` (the export stores weights in 16
bits, so a little more than the answers' rounding is allowed).
Latency is measured per request, one request at a time; any failed request fails the test.

    decision smoke --url http://127.0.0.1:8000 --data data/processed/vader.jsonl --model-dir models/vader-minilm
    decision smoke --url ... --data runs/KEY/slice.jsonl --expected runs/KEY/expected_answers.npz
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from pipeline.data.answers import answer_probabilities, chosen_option, parse_request
from pipeline.data.contract import Record, question_request
from pipeline.families import load_decision_model
from pipeline.families.base import DecisionModel
from pipeline.mlops.promotion import SMOKE_TAG
from pipeline.mlops.registry import client, download_version
from pipeline.scoring.heldout import load_expected

MIN_AGREEMENT = 0.995
MAX_PROBABILITY_DIFF = 1e-3
# Served against trained: measured 5.0e-5 on `make run`'s joint export (the answers' 4-decimal rounding) and
# up to 6e-4 on the tiny LoRA Laya export (its fp16 weights); a corrupted tensor moves answers by far more.
TRAINED_MAX_DIFF = 5e-3


class SmokeInputError(ValueError):
    """An input of the smoke test that cannot be read (the trained model's expected answers)."""


@dataclass(frozen=True)
class SmokeResult:
    url: str
    model: str | None
    requests: int
    decisions: int
    agreement: float | None  # None without a model folder to compare with
    max_probability_diff: float | None
    latency_ms: dict[str, float]
    failures: list[str] = field(default_factory=list)
    trained_agreement: float | None = None  # None without the trained model's expected answers
    trained_max_probability_diff: float | None = None
    trained_mean_probability_diff: float | None = None

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"passed": self.passed}


def heldout_requests(records: list[Record], n: int) -> list[dict[str, Any]]:
    """Request bodies (state and usable questions) of validated rows, up to `n` decisions.

    Given a run's held-out records (`SplitData.split.heldout`), the i-th body is the i-th held-out record (the
    `record` index the trained model's expected answers are keyed by).
    """
    bodies, decisions = [], 0
    for record in records:
        if decisions >= n:
            break
        kept = {d.question.id: question_request(d.question) for d in record.decisions}
        bodies.append({"state": record.state, "questions": kept})
        decisions += len(kept)
    return bodies


def compare_with_trained(
    served: list[dict[str, Any] | None], expected: dict[tuple[int, str], np.ndarray], failures: list[str]
) -> dict[str, float]:
    """Served answers (the i-th for held-out record i) against the trained model's (`load_expected`); failures
    appended."""
    by_record: dict[int, list[tuple[str, np.ndarray]]] = {}
    for (record, qid), want in expected.items():
        by_record.setdefault(record, []).append((qid, want))
    agree = total = 0
    diffs = []
    for record, response in enumerate(served):
        for qid, want in by_record.get(record, []):
            total += 1
            got = None if response is None else response["answers"].get(qid)
            if got is None:
                continue
            p = np.asarray(answer_probabilities(got))
            if p.shape != want.shape:
                continue
            agree += int(p.argmax()) == int(want.argmax())
            diffs.append(float(np.abs(p - want).max()))
    figures = {
        "trained_agreement": agree / total if total else 0.0,
        "trained_max_probability_diff": max(diffs, default=float("nan")),
        "trained_mean_probability_diff": float(np.mean(diffs)) if diffs else float("nan"),
    }
    if not total or figures["trained_agreement"] < MIN_AGREEMENT:
        failures.append(
            f"agreement with the trained model {figures['trained_agreement']:.4f} below {MIN_AGREEMENT} "
            f"({total} decisions)"
        )
    if diffs and figures["trained_max_probability_diff"] > TRAINED_MAX_DIFF:
        failures.append(
            f"largest probability difference from the trained model "
            f"{figures['trained_max_probability_diff']:.2e} above {TRAINED_MAX_DIFF:.0e}"
        )
    return figures


def smoke_test(
    url: str,
    bodies: list[dict[str, Any]],
    model_dir: str | Path | None = None,
    api_key: str | None = None,
    model: str | None = None,
    timeout_s: float = 30.0,
    expected: str | Path | None = None,
) -> SmokeResult:
    """Send each body, time it, and compare the answers with the folder's in-process answers and (with
    `expected`) with the trained model's. The folder and the expected answers are read before any request is
    sent: ModelLayoutError or SmokeInputError names the one that cannot be read."""
    wanted = _expected_answers(expected) if expected is not None else None
    local = load_decision_model(model_dir) if model_dir is not None else None
    served, latencies, failures = _send_all(url, bodies, api_key, model, timeout_s)
    trained = compare_with_trained(served, wanted, failures) if wanted is not None else {}
    names = {answer.get("model") for answer in served if answer}
    agreement = max_diff = None
    if local is not None:
        agreement, max_diff = _compare(served, _in_process(local, bodies))
        if agreement < MIN_AGREEMENT:
            failures.append(f"agreement {agreement:.4f} below {MIN_AGREEMENT}")
        if max_diff > MAX_PROBABILITY_DIFF:
            failures.append(f"largest probability difference {max_diff:.2e} above {MAX_PROBABILITY_DIFF:.0e}")
    if not bodies:
        failures.append("no held-out decisions to send")
    ms = np.asarray(latencies or [float("nan")]) * 1000
    return SmokeResult(
        url=url,
        model=",".join(sorted(n for n in names if n)) or None,
        requests=len(bodies),
        decisions=sum(len(b["questions"]) for b in bodies),
        agreement=agreement,
        max_probability_diff=max_diff,
        latency_ms={f"p{q}": round(float(np.percentile(ms, q)), 2) for q in (50, 95)},
        failures=failures,
        **trained,
    )


def _send_all(
    url: str, bodies: list[dict[str, Any]], api_key: str | None, model: str | None, timeout_s: float
) -> tuple[list[dict[str, Any] | None], list[float], list[str]]:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    served, latencies, failures = [], [], []
    with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s) as http:
        for index, body in enumerate(bodies):
            payload = body | ({"model": model} if model else {})
            started = time.perf_counter()
            try:
                response = http.post(
                    "/v1/systemone",
                    content=orjson.dumps(payload),
                    headers={"Content-Type": "application/json"},
                )
            except httpx.HTTPError as error:
                failures.append(f"request {index}: {type(error).__name__}: {error}")
                served.append(None)
                continue
            latencies.append(time.perf_counter() - started)
            if response.status_code != 200:
                failures.append(f"request {index}: HTTP {response.status_code}: {response.text[:200]}")
                served.append(None)
                continue
            served.append(response.json())
    return served, latencies, failures


def _expected_answers(path: str | Path) -> dict[tuple[int, str], np.ndarray]:
    try:
        return load_expected(path)
    except (OSError, ValueError, KeyError) as error:  # missing, not an .npz, or an .npz of other arrays
        what = "no such file" if isinstance(error, FileNotFoundError) else "not a run's expected answers"
        raise SmokeInputError(
            f"--expected {path}: {what}; give the expected_answers.npz of the run folder that "
            "trained the model"
        ) from error


def _in_process(model: DecisionModel, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The folder's answers, one request per forward pass (no batching with others)."""
    return [model.answer([parse_request(b["state"], b["questions"])])[0].answers for b in bodies]


def _compare(served: list[dict[str, Any] | None], expected: list[dict[str, Any]]) -> tuple[float, float]:
    """(agreement on the chosen option, largest probability difference); a failed request disagrees."""
    agree = total = 0
    max_diff = 0.0
    for response, answers in zip(served, expected):
        total += len(answers)
        if response is None:
            continue
        for qid, want in answers.items():
            got = response["answers"].get(qid)
            if got is None or got.get("type") != want["type"]:
                continue
            agree += chosen_option(got) == chosen_option(want)
            diff = np.abs(np.subtract(answer_probabilities(got), answer_probabilities(want))).max()
            max_diff = max(max_diff, float(diff))
    return (agree / total if total else 0.0), max_diff


def serve_and_smoke(
    model_dir: str | Path,
    bodies: list[dict[str, Any]],
    timeout_s: float = 180.0,
    expected: str | Path | None = None,
) -> SmokeResult:
    """Start `decision serve` on the folder (a real server process on a free loopback port), smoke-test it,
    stop it."""
    import subprocess
    import sys
    import tempfile

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # The smoke test's requests are not traffic: they stay out of the inference log (and so out of drift and
    # harvest). It checks that the trained model serves as trained, at fp32; an int8 encoder is held to its
    # own report's bounds instead (`stages.quantize`).
    command = [
        sys.executable,
        "-m",
        "pipeline.cli",
        "serve",
        "--model",
        str(model_dir),
        "--port",
        str(port),
        "--no-inference-log",
        "--precision",
        "fp32",
    ]
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: a chatty server can never block on it
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, text=True)
        try:
            _wait_healthy(url, server, log, timeout_s)
            return smoke_test(url, bodies, model_dir, expected=expected)
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()


def free_port() -> int:
    """A free TCP port on loopback (for a server this process is about to start)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, server, log, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        if server.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"decision serve exited with {server.returncode}: {log.read()[-2000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"decision serve on {url} not healthy after {timeout_s:.0f} s")
        time.sleep(0.2)


def smoke_version(
    name: str, version: str, heldout: list[Record], n: int, expected: str | Path | None = None
) -> SmokeResult:
    """The flow's smoke-test stage: serve a registered version over HTTP, smoke-test it on the run's `heldout`
    records against its folder and the trained model's `expected` answers, tag the version."""
    bodies = heldout_requests(heldout, n)
    with tempfile.TemporaryDirectory() as tmp:
        result = serve_and_smoke(download_version(name, version, tmp), bodies, expected=expected)
    tags = {
        SMOKE_TAG: "passed" if result.passed else "failed",
        "smoke_agreement": str(result.agreement),
        "smoke_max_probability_diff": str(result.max_probability_diff),
        "smoke_trained_agreement": str(result.trained_agreement),
        "smoke_trained_max_probability_diff": str(result.trained_max_probability_diff),
        "smoke_failures": "; ".join(result.failures)[:4000] or "none",
        "smoke_p50_ms": str(result.latency_ms["p50"]),
        "smoke_p95_ms": str(result.latency_ms["p95"]),
    }
    for key, value in tags.items():
        client().set_model_version_tag(name, version, key, value)
    return result
