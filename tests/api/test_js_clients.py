"""Two more real clients from the registries against a live server: the JavaScript SDK `@typesafe-ai/sdk`
(npm, run under Node.js) and `jev-lite` (PyPI, an independent Python client with Pydantic answer models).

Each is installed once, at a pinned version, into `tests/.cache/` (git-ignored); the tests skip, saying why,
when the installer or the registry cannot be reached. Each client runs as a subprocess that reads our URL and
a dummy key from its environment (`TYPESAFE_BASE_URL`, `TYPESAFE_API_KEY`) and prints what it parsed as
JSON: the tests assert what a user of that client sees. Neither client compresses bodies (both send plain
JSON), so the large body here goes plain. In `make test-all` only (tests/conftest.py FULL_ONLY):

    pytest tests/api/test_js_clients.py -q
"""

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.api.conftest import live_server, make_app

CACHE = Path(__file__).resolve().parents[1] / ".cache"
JS_SDK = "@typesafe-ai/sdk@0.6.0"
JEV_LITE = "jev-lite==0.0.6"
INSTALL_TIMEOUT_S = 300
RUN_TIMEOUT_S = 120
OPTIONS = {"negative": "unhappy or annoyed", "neutral": None, "positive": "happy"}
LEVELS = ["none", "mild", "strong"]
ELEVEN_LEVELS = [f"level {i}" for i in range(11)]  # one past MAX_SCORE_LEVELS: our 422, not the client's
LONG_STATE_REPEATS = 3000  # "the order was late " x 3000: a 57 KB body, sent as it is
LEVELS_AS_A_MAP = {"type": "score", "instructions": "?", "criteria": {"0": "low", "1": "high"}}
CONSTANTS = json.dumps([OPTIONS, LEVELS, ELEVEN_LEVELS, LONG_STATE_REPEATS, LEVELS_AS_A_MAP])
"""What both client scripts ask with, passed to them as their first argument."""

JS_SCRIPT = """
import { choice, noul, score, TypeSafeClient } from "@typesafe-ai/sdk";

const [OPTIONS, LEVELS, ELEVEN, REPEATS, LEVELS_AS_A_MAP] = JSON.parse(process.argv[2]);
// No retries: a failure shows at once, not after the SDK's backoff.
const client = new TypeSafeClient({ timeout: 60000, retry: { maxRetries: 0 } });
const questions = {
  tone: choice("What is the tone?", OPTIONS),
  intensity: score("How intense?", LEVELS),
  late: noul("The order was late."),
};
const caught = (error) => ({ name: error.name, status: error.status ?? null, message: error.message,
                             body: error.body ?? null });
const refusal = (promise) => promise.then(() => null, caught);
const refusedHere = (call) => { try { call(); return null; } catch (error) { return caught(error); } };

const result = await client.systemOne({ state: "The order came late and the box was broken.", questions });
const longState = "the order was late ".repeat(REPEATS);
const long = await client.systemOne({ state: longState, questions: { late: questions.late } });
console.log(JSON.stringify({
  model: result.model, answers: result.answers, usage: result.usage, long: long.answers.late,
  models: (await client.models.list()).map((card) => card.name),
  unknown_model: await refusal(client.systemOne({ state: "s", questions, model: "no-such-model" })),
  eleven_levels: await refusal(client.systemOne({ state: "s", questions: { q: score("?", ELEVEN) } })),
  levels_as_a_map: refusedHere(() => client.systemOne({ state: "s", questions: { q: LEVELS_AS_A_MAP } })),
}));
"""

PY_SCRIPT = """
import json, sys
import jev_lite
from jev_lite import Choice, Noul, Score, TypeSafe

OPTIONS, LEVELS, ELEVEN, REPEATS, LEVELS_AS_A_MAP = json.loads(sys.argv[1])

def refusal(call):
    try:
        call()
    except (jev_lite.TypeSafeError, ValueError) as error:  # ValueError: pydantic refusing before sending
        return {"name": type(error).__name__, "status": getattr(error, "status_code", None),
                "message": getattr(error, "message", str(error)), "body": getattr(error, "body", None),
                "error_type": getattr(error, "type", None)}
    return None

with TypeSafe(timeout=60, max_retries=0) as client:
    questions = {"tone": Choice(instructions="What is the tone?", criteria=OPTIONS),
                 "intensity": Score(instructions="How intense?", criteria=LEVELS),
                 "late": Noul(instructions="The order was late.")}
    ask = client.system_one.create
    result = ask(state="The order came late and the box was broken.", questions=questions)
    long = ask(state="the order was late " * REPEATS, questions={"late": questions["late"]})
    print(json.dumps({
        "model": result.model, "answers": {k: a.model_dump() for k, a in result.answers.items()},
        "usage": result.usage.model_dump(), "long": long.answers["late"].model_dump(),
        "models": [card.name for card in client.models.list()],
        "unknown_model": refusal(lambda: ask(state="s", questions=questions, model="no-such-model")),
        "eleven_levels": refusal(lambda: ask(state="s", questions={"q": Score(criteria=ELEVEN)})),
        "levels_as_a_map": refusal(lambda: ask(state="s", questions={"q": LEVELS_AS_A_MAP})),
    }))
"""


@pytest.fixture(scope="module")
def server_url(served_folder):
    with live_server(make_app(served_folder)) as url:
        yield url


@pytest.fixture(scope="module")
def client_env(server_url) -> dict[str, str]:
    """Both clients pointed at us by their documented variables, with no default model from the caller."""
    env = {k: v for k, v in os.environ.items() if k != "TYPESAFE_DEFAULT_MODEL"}
    return env | {"TYPESAFE_BASE_URL": server_url, "TYPESAFE_API_KEY": "dummy-key"}


@pytest.fixture(scope="module")
def js_sdk() -> Path:
    """The npm prefix folder holding @typesafe-ai/sdk (its node_modules/)."""
    _require_node()
    return _install(CACHE / "npm", JS_SDK, _npm_install)


@pytest.fixture(scope="module")
def jev_lite() -> Path:
    """A folder holding the jev_lite package alone, for PYTHONPATH."""
    return _install(CACHE / "pip", JEV_LITE, _pip_install)


@pytest.fixture(scope="module")
def js_parsed(js_sdk, client_env, tmp_path_factory) -> dict:
    """What the JavaScript SDK parsed from our answers and refusals, from one run of JS_SCRIPT."""
    folder = tmp_path_factory.mktemp("js")
    # ESM imports find packages in node_modules folders above the script, never through NODE_PATH.
    (folder / "node_modules").symlink_to(js_sdk / "node_modules")
    script = folder / "client.mjs"
    script.write_text(JS_SCRIPT)
    return _run(["node", str(script), CONSTANTS], client_env)


@pytest.fixture(scope="module")
def jev_lite_parsed(jev_lite, client_env, tmp_path_factory) -> dict:
    """What jev-lite parsed from our answers and refusals, from one run of PY_SCRIPT."""
    script = tmp_path_factory.mktemp("jev_lite") / "client.py"
    script.write_text(PY_SCRIPT)
    return _run([sys.executable, str(script), CONSTANTS], client_env | {"PYTHONPATH": str(jev_lite)})


@pytest.mark.parametrize("parsed", ["js_parsed", "jev_lite_parsed"])
def test_the_client_parses_every_answer_type_and_our_confidence(parsed, request):
    result = request.getfixturevalue(parsed)
    tone, intensity, late = (result["answers"][q] for q in ("tone", "intensity", "late"))
    assert tone["choice"] in OPTIONS and set(tone["probabilities"]) == set(OPTIONS)
    assert set(intensity["probabilities"]) == {"0", "1", "2"}
    assert intensity["legend"] == {str(i): text for i, text in enumerate(LEVELS)}
    levels = intensity["probabilities"].items()
    assert 0.0 <= intensity["score"] <= 2.0
    assert intensity["score"] == pytest.approx(sum(int(i) * p for i, p in levels), abs=1e-3)
    for answer in (tone, intensity):
        p = answer["probabilities"].values()
        assert sum(p) == pytest.approx(1.0, abs=1e-3)
        n = len(p)
        assert answer["confidence"] == pytest.approx((max(p) - 1 / n) / (1 - 1 / n), abs=2e-4)
    assert 0.0 <= late["noul"] <= 1.0 and "confidence" not in late
    assert 0.0 <= result["long"]["noul"] <= 1.0  # a 57 KB state, plain JSON, answered
    assert result["usage"]["input_tokens"] > 0
    assert {"default", "jev-latest", result["model"]} <= set(result["models"])


def test_the_javascript_sdk_hands_over_our_x_fields_as_they_are(js_parsed):
    tone, late = js_parsed["answers"]["tone"], js_parsed["answers"]["late"]
    assert tone["x_top_probability"] == max(tone["probabilities"].values())
    assert late["x_confidence"] == pytest.approx(max(late["noul"], 1 - late["noul"]), abs=2e-4)


def test_jev_lite_drops_our_x_fields_and_keeps_the_jev_answer(jev_lite_parsed):
    answers = jev_lite_parsed["answers"]
    assert set(answers["tone"]) == {"type", "choice", "probabilities", "confidence"}
    assert set(answers["late"]) == {"type", "noul"}


def test_the_javascript_sdk_raises_our_refusals_with_our_message(js_parsed):
    missing = js_parsed["unknown_model"]
    assert missing["name"] == "NotFoundError" and missing["status"] == 404
    detail = missing["body"]["detail"]
    assert detail["error_type"] == "not_found_error" and "no-such-model" in detail["message"]
    assert missing["message"] == f"404 {detail['message']}"
    too_many = js_parsed["eleven_levels"]
    assert too_many["name"] == "UnprocessableEntityError" and too_many["status"] == 422
    [problem] = too_many["body"]["detail"]
    assert too_many["message"] == f"422 questions.q.criteria: {problem['msg']}"
    # Score levels as a map: the SDK refuses it before sending, as our 422 would.
    assert js_parsed["levels_as_a_map"]["name"] == "TypeSafeError"
    assert "not a list" in js_parsed["levels_as_a_map"]["message"]


def test_jev_lite_raises_our_refusals_with_our_message(jev_lite_parsed):
    missing = jev_lite_parsed["unknown_model"]
    assert missing["name"] == "NotFoundError" and missing["status"] == 404
    assert missing["error_type"] == "not_found_error"
    assert missing["message"] == missing["body"]["detail"]["message"]
    assert "no-such-model" in missing["message"]
    too_many = jev_lite_parsed["eleven_levels"]
    assert too_many["name"] == "UnprocessableEntityError" and too_many["status"] == 422
    [problem] = too_many["body"]["detail"]
    assert problem["loc"] == ["body", "questions", "q", "criteria"]
    assert too_many["message"] == f"{problem['msg']} ({problem['loc']})"
    # Score levels as a map: jev-lite's Score model refuses it before sending, as our 422 would.
    as_a_map = jev_lite_parsed["levels_as_a_map"]
    assert as_a_map["name"] == "ValidationError" and as_a_map["status"] is None
    assert "criteria" in as_a_map["message"]


def _require_node() -> None:
    node = shutil.which("node")
    if node is None or shutil.which("npm") is None:
        pytest.skip("no node/npm on PATH: the JavaScript SDK needs Node.js 20 or newer")
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
    if int(version.lstrip("v").split(".")[0]) < 20:
        pytest.skip(f"node {version}: @typesafe-ai/sdk needs Node.js 20 or newer")


def _npm_install(spec: str, folder: Path) -> list[str]:
    # --ignore-scripts: nothing from the registry runs at install time.
    return [
        "npm",
        "install",
        "--prefix",
        str(folder),
        "--no-audit",
        "--no-fund",
        "--ignore-scripts",
        "--fetch-retries=1",
        "--fetch-timeout=30000",
        spec,
    ]


def _pip_install(spec: str, folder: Path) -> list[str]:
    # --no-deps: it needs httpx, pydantic and opentelemetry-api, all pinned here; nothing may shadow those.
    return [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--target",
        str(folder),
        "--no-input",
        "--disable-pip-version-check",
        "--timeout",
        "30",
        "--retries",
        "1",
        spec,
    ]


def _install(cache: Path, spec: str, command) -> Path:
    """`spec` installed once into its own folder of `cache`: staged beside it, swapped in by one rename."""
    folder = cache / re.sub(r"[^A-Za-z0-9.]+", "-", spec).strip("-")  # e.g. typesafe-ai-sdk-0.6.0
    if folder.is_dir():
        return folder
    staging = folder.with_name(f"{folder.name}.{os.getpid()}.partial")
    cache.mkdir(parents=True, exist_ok=True)
    try:
        _run_installer(command(spec, staging), spec)
        with contextlib.suppress(OSError):  # another pytest worker swapped its copy in first: use that one
            staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _run_installer(argv: list[str], spec: str) -> None:
    """Skips the test, with the installer's first error line, when it fails or hangs (no registry here)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.skip(f"installing {spec} took over {INSTALL_TIMEOUT_S} s (is the registry reachable?)")
    if done.returncode != 0:
        errors = [line.strip() for line in done.stderr.splitlines() if "error" in line.lower()]
        why = errors[0] if errors else done.stderr[-300:]
        pytest.skip(f"could not install {spec} (is the registry reachable?): {why}")


def _run(command: list[str], env: dict[str, str]) -> dict:
    """The JSON a client script printed; its stderr in the failure when it did not exit cleanly."""
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, f"{command[0]} exited {done.returncode}:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])
