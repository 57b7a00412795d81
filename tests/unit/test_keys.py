"""API keys: hashed storage, file and environment sources, clear errors, and the open server."""

import json
import stat

import pytest

from pipeline.serving.keys import KEYS_ENV, KeyConfigError, add_key, hash_key, load_keys


def test_no_keys_means_an_open_server(tmp_path):
    assert load_keys(None, environ={}).open


def test_keygen_stores_only_the_hash_and_the_key_resolves_to_its_owner(tmp_path):
    path = tmp_path / "keys.json"
    alice, bob = add_key(path, "alice"), add_key(path, "bob")
    text = path.read_text()
    assert alice not in text and bob not in text and hash_key(alice) in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    store = load_keys(path, environ={})
    assert not store.open
    assert store.owner_of(alice) == "alice" and store.owner_of(f"  {bob} ") == "bob"
    assert store.owner_of("dp-guess") is None


def test_environment_entries_add_to_the_file(tmp_path):
    path = tmp_path / "keys.json"
    add_key(path, "alice")
    store = load_keys(path, environ={KEYS_ENV: f"carol={hash_key('carol-key')}, dave={hash_key('d')}"})
    assert store.owner_of("carol-key") == "carol" and store.owner_of("d") == "dave"


def test_every_bad_entry_is_named_in_one_error(tmp_path):
    bad_file = tmp_path / "keys.json"
    bad_file.write_text(json.dumps({"keys": [{"owner": "eve", "sha256": "short"}]}))
    with pytest.raises(KeyConfigError) as caught:
        load_keys(bad_file, environ={KEYS_ENV: "no-equals-sign,frank=" + "z" * 64})
    message = str(caught.value)
    assert "'eve'" in message and "no-equals" in message and "'frank'" in message
    with pytest.raises(KeyConfigError, match="no such key file"):
        load_keys(tmp_path / "missing.json", environ={})
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(KeyConfigError, match=r"broken\.json"):
        load_keys(tmp_path / "broken.json", environ={})


@pytest.mark.parametrize(
    ("owner", "where", "content", "expected"),
    [
        ("", "keys.json", None, "owner ''"),
        ("a,b", "keys.json", None, "without ','"),
        ("alice", "missing/keys.json", None, "does not exist"),
        ("alice", ".", None, "a folder"),
        ("alice", "notes.json", "my notes", "expected"),
        ("alice", "list.json", "[1, 2]", "expected"),
    ],
)
def test_keygen_refuses_a_bad_owner_or_place_and_leaves_the_file_as_it_was(
    tmp_path, owner, where, content, expected
):
    path = tmp_path / where
    if content is not None:
        path.write_text(content)
    with pytest.raises(KeyConfigError, match=expected):
        add_key(path, owner)
    assert content is None or path.read_text() == content
    assert not list(tmp_path.glob("*.tmp")) and not (tmp_path / "missing").exists()
