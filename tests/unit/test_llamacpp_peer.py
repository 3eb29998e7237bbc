"""Finding llama.cpp's server for `specdec bench --peers llamacpp`: a binary named by
SPECDEC_LLAMA_SERVER, else .venv-llamacpp's; where neither is usable the error says how
to build it (the bench then skips the peer with that message)."""

from __future__ import annotations

import pytest

from specdec_tools.bench import llamacpp_peer, peers


def test_the_named_binary_is_used(tmp_path, monkeypatch):
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv(llamacpp_peer.BINARY_ENV, str(binary))
    assert llamacpp_peer.find_server() == binary


def test_a_named_file_that_does_not_run_is_refused(tmp_path, monkeypatch):
    binary = tmp_path / "llama-server"
    binary.write_text("not a program")
    monkeypatch.setenv(llamacpp_peer.BINARY_ENV, str(binary))
    with pytest.raises(FileNotFoundError, match="not an executable"):
        llamacpp_peer.find_server()


def test_without_a_build_the_error_says_how_to_build(tmp_path, monkeypatch):
    monkeypatch.delenv(llamacpp_peer.BINARY_ENV, raising=False)
    monkeypatch.setattr(llamacpp_peer, "VENV", tmp_path / "no-venv")
    with pytest.raises(FileNotFoundError, match="make llamacpp"):
        llamacpp_peer.find_server()


def test_the_peer_names_map_to_plain_and_speculative():
    assert peers.kinds_for({"llamacpp"}) == ["llamacpp-plain", "llamacpp-speculative"]
    assert "llamacpp-plain" not in peers.kinds_for({"genai", "hf"})
