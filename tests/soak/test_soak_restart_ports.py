"""A soak service (re)started while another process holds one of its ports: between a
kill and its restart, a port can be taken as someone's ephemeral port (it failed `make
test` once: the restarted target could not serve metrics, "Address already in use").
Pure logic over the launcher's error: the launcher is replaced by a fake that fails as a
service does when its port is taken, then starts it."""

from __future__ import annotations

import pytest

from specdec import launcher
from specdec.pair import TINY_PAIR
from specdec_tools.soak import faults
from specdec_tools.soak.faults import ModelService


class Started:
    """What launcher.start returns, as far as ModelService reads it."""

    class proc:  # noqa: N801 - the attribute launcher.ServiceProcess has
        pid = 4242


def fake_launcher(monkeypatch, errors: list[str]) -> list[list[str]]:
    """launcher.start raising `errors` in turn, then succeeding; the args of each call."""
    calls = []

    def start(module, args, **kwargs):
        calls.append(list(args))
        if len(calls) <= len(errors):
            raise RuntimeError(f"{module} exited before it was ready:\n{errors[len(calls) - 1]}")
        return Started()

    monkeypatch.setattr(launcher, "start", start)
    monkeypatch.setattr(faults.time, "sleep", lambda s: None)
    return calls


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_a_taken_metrics_port_is_replaced(monkeypatch):
    calls = fake_launcher(monkeypatch, [
        "OSError: cannot serve metrics on 0.0.0.0:46159: [Errno 98] Address already in use"])
    service = ModelService("target-b", TINY_PAIR.target, None, port=50052, metrics_port=46159)
    service.start()
    assert len(calls) == 2
    assert flag(calls[0], "--metrics-port") == "46159"
    assert flag(calls[1], "--metrics-port") == str(service.metrics_port) != "46159"
    assert flag(calls[1], "--port") == "50052"  # the coordinator's address is kept
    assert service.pids == [4242]


def test_a_taken_grpc_port_is_waited_for_and_kept(monkeypatch):
    taken = "OSError: cannot bind 127.0.0.1:50052: address in use or not available"
    calls = fake_launcher(monkeypatch, [taken, taken])
    service = ModelService("target-b", TINY_PAIR.target, None, port=50052, metrics_port=46159)
    service.start()
    assert [flag(c, "--port") for c in calls] == ["50052"] * 3
    assert [flag(c, "--metrics-port") for c in calls] == ["46159"] * 3


def test_it_gives_up_after_its_tries_and_on_any_other_error(monkeypatch):
    taken = "OSError: cannot bind 127.0.0.1:50052: address in use or not available"
    calls = fake_launcher(monkeypatch, [taken] * 3)
    with pytest.raises(RuntimeError, match="address in use"):
        ModelService("draft", TINY_PAIR.draft, None).start(tries=3)
    assert len(calls) == 3
    calls = fake_launcher(monkeypatch, ["ValueError: no such model"])
    with pytest.raises(RuntimeError, match="no such model"):
        ModelService("draft", TINY_PAIR.draft, None).start()
    assert len(calls) == 1
