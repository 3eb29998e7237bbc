"""Property-based fuzzing (hypothesis) of the model services' RPCs and the client API:
one stack for the whole folder (tests/fuzz/_fuzz_stack.py says what it holds and how
hypothesis is set up)."""

from __future__ import annotations

import pytest

from tests.fuzz._fuzz_stack import Stack


@pytest.fixture(scope="session")
def stack():
    """Draft and target (tiny models, a session cap of 8 so the fuzz reaches it), the
    GenerationService over them and its HTTP frontend; references recorded first."""
    from coordinator.deploy.config import CoordinatorConfig
    from coordinator.deploy.setup import build_service
    from draft_service.__main__ import create as create_draft
    from draft_service.config import DraftConfig
    from target_service.__main__ import create as create_target
    from target_service.config import TargetConfig
    from tests.http_frontend import serve_frontend

    draft, dport, dengine = create_draft(DraftConfig(model="tiny-random-draft", port=0,
                                                     max_sessions=8))
    target, tport, tengine = create_target(TargetConfig(model="tiny-random", port=0,
                                                        max_sessions=8))
    draft.start()
    target.start()
    s = Stack(f"127.0.0.1:{dport}", dengine, f"127.0.0.1:{tport}", tengine)
    try:
        # Load-aware K off: the default K stays the default (it would pick K = 0 on the
        # tiny models, where a draft costs as much as the target).
        s.service = build_service(CoordinatorConfig(
            draft=s.draft_addr, target=s.target_addr, load_aware_k=False,
            max_concurrency=4, rpc_deadline=30))
        with serve_frontend(s.service, timeout_s=60) as url:
            s.http_url = url
            s.record()
            yield s
    finally:
        s.draft_channel.close()
        s.target_channel.close()
        draft.stop(0)
        target.stop(0)


@pytest.fixture()
def fuzz_services(stack):
    """The stack, checked healthy (exact answers, no session) after the test."""
    yield stack
    stack.release_all()
    stack.assert_healthy(layers=("draft", "target"))
