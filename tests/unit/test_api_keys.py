"""coordinator.api.auth: the key file, Bearer parsing, constant-time matching, per-key caps."""

from __future__ import annotations

import pytest

from coordinator.api.auth import APIKeys, metadata_value
from specdec.errors import ResourceExhausted, Unauthenticated

KEY_A, KEY_B = "a" * 24 + "-alpha", "b" * 24 + "-beta"


def write(tmp_path, text: str):
    path = tmp_path / "keys"
    path.write_text(text)
    return path


def test_key_file_names_comments_and_blank_lines(tmp_path):
    keys = APIKeys.load(write(tmp_path, f"# team keys\n\nalice:{KEY_A}\n  {KEY_B}  \n"))
    assert keys.names == ["alice", "key-4"]
    assert keys.identify(f"Bearer {KEY_A}", "header") == "alice"
    assert keys.identify(f"bearer   {KEY_B} ", "header") == "key-4"
    assert KEY_A not in repr(vars(keys))  # held as digests only


@pytest.mark.parametrize("text", ["", "# nothing\n", "short\n", f"x:{KEY_A}\nx:{KEY_B}\n",
                                  f"{KEY_A}\n{KEY_A}\n", "has space inside the key-value\n"])
def test_bad_key_files_are_refused_without_showing_keys(tmp_path, text):
    with pytest.raises(ValueError) as info:
        APIKeys.load(write(tmp_path, text))
    assert KEY_A not in str(info.value) and KEY_B not in str(info.value)


@pytest.mark.parametrize(("value", "fragment"), [
    (None, "needs an API key"), ("", "needs an API key"), (KEY_A, "not 'Bearer <key>'"),
    ("Basic abc", "not 'Bearer <key>'"), ("Bearer ", "not 'Bearer <key>'"),
    ("Bearer " + KEY_A + "x", "not valid"), ("Bearer " + KEY_A.upper(), "not valid"),
])
def test_missing_or_wrong_keys_say_what_to_send(value, fragment):
    keys = APIKeys({"alice": KEY_A})
    with pytest.raises(Unauthenticated) as info:
        keys.identify(value, "metadata")
    assert fragment in info.value.message
    assert "'authorization: Bearer <key>' metadata" in info.value.message
    assert KEY_A not in info.value.message


def test_per_key_concurrency_cap():
    keys = APIKeys({"alice": KEY_A, "bob": KEY_B}, max_concurrency=2)
    a = f"Bearer {KEY_A}"
    with keys.admit(a, "header"), keys.admit(a, "header"):
        with pytest.raises(ResourceExhausted) as info:
            with keys.admit(a, "header"):
                pass
        assert "'alice'" in info.value.message and KEY_A not in info.value.message
        with keys.admit(f"Bearer {KEY_B}", "header"):  # another key is not affected
            pass
    with keys.admit(a, "header"):  # slots came back
        pass
    with pytest.raises(Unauthenticated), keys.admit(None, "header"):
        pass


def test_metadata_lookup_is_case_insensitive():
    assert metadata_value((("x", "1"), ("Authorization", "Bearer k"))) == "Bearer k"
    assert metadata_value(()) is None and metadata_value(None) is None
