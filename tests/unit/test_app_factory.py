"""The Decision API's app factory stays short: `create_app` puts parts together, and the routes, the error
handlers, the middleware and the lifespan live at module level (`pipeline.serving.routes`, `server.lifespan`),
not as closures inside it.

    .venv/bin/python -m pytest tests/unit/test_app_factory.py
"""

import ast
import inspect
import textwrap

import pytest

from pipeline.serving.keys import KeyConfigError, KeyStore, hash_key
from pipeline.serving.server import create_app

MAX_FACTORY_LINES = 40


def test_create_app_is_a_short_factory():
    lines = inspect.getsource(create_app).splitlines()
    assert len(lines) <= MAX_FACTORY_LINES, f"create_app has {len(lines)} lines (at most {MAX_FACTORY_LINES})"


def test_create_app_defines_no_closures():
    tree = ast.parse(textwrap.dedent(inspect.getsource(create_app)))
    nested = [
        node.name
        for node in ast.walk(tree.body[0])
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    assert nested == [create_app.__name__]


def test_require_key_needs_keys_in_one_rule():
    """The rule the CLI and the app factory both apply: `--require-key` with no keys configured is refused."""
    with pytest.raises(KeyConfigError, match="--require-key: no API keys are configured"):
        KeyStore().check_require_key(True)
    KeyStore().check_require_key(False)  # an open server
    KeyStore({hash_key("alice-key"): "alice"}).check_require_key(True)
