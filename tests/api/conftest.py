"""Decision API fixtures: an app on the tiny model, and a live uvicorn server on a free loopback port."""

import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from pipeline.stages.smoke import free_port

TONE = {
    "type": "choice",
    "instructions": "What is the tone?",
    "criteria": {"negative": None, "neutral": "neither", "positive": None},
}
INTENSITY = {"type": "score", "instructions": "How intense?", "criteria": ["none", "mild", "strong"]}
POSITIVE = {"type": "noul", "instructions": "The text is positive.", "criteria": None}
QUESTIONS = {"tone": TONE, "intensity": INTENSITY, "positive": POSITIVE}


@contextmanager
def live_server(app, timeout_s: float = 60.0):
    """Run `app` with uvicorn in a thread; yield its base URL once /healthz says the model is loaded."""
    import httpx
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"server on {url} did not become healthy")
            time.sleep(0.05)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def make_app(source: Path | str, keys=None, finetunes=None, poll_s: float = 5.0, **config):
    from pipeline.serving.catalog import Catalog
    from pipeline.serving.keys import KeyStore
    from pipeline.serving.server import ServerConfig, create_app

    return create_app(
        Catalog(str(source), finetunes, poll_s=poll_s), keys or KeyStore(), ServerConfig(**config)
    )


@pytest.fixture(scope="session")
def served_folder(tiny_base: Path) -> Path:
    """The tiny base as a served model (a Laya-layout folder is servable as it is)."""
    return tiny_base


def wait_ready(client, timeout_s: float = 120):
    """The client once /healthz says the model is loaded; fails with the health body after `timeout_s`."""
    import time

    deadline = time.monotonic() + timeout_s
    while client.get("/healthz").status_code != 200:
        assert time.monotonic() < deadline, client.get("/healthz").json()
        time.sleep(0.05)
    return client
