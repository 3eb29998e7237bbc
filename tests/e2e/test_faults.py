"""Faults with real processes: the generation completes, with the same greedy ids."""

from __future__ import annotations

import signal
import time

import pytest

from coordinator.deploy.config import CoordinatorConfig
from coordinator.deploy.setup import build_service
from specdec import launcher
from specdec.pair import TINY_PAIR, ServiceSpec
from specdec.v1 import generate_pb2

pytestmark = pytest.mark.slow

PROMPT = [7, 77, 177, 277]
N = 400
TARGET, DRAFT = TINY_PAIR.target, TINY_PAIR.draft


def start_service(spec: ServiceSpec, port: int = 0) -> launcher.ServiceProcess:
    return launcher.start(spec.module, spec.args(port), timeout=60.0)


def request(k: int) -> generate_pb2.GenerateRequest:
    return generate_pb2.GenerateRequest(prompt_token_ids=PROMPT, max_new_tokens=N,
                                        num_draft_tokens=k)


def stream_with(service, k: int, after_first_chunk, speculated: bool = False
                ) -> tuple[list[int], list]:
    """Stream a generation; call `after_first_chunk` after its first chunk (with
    `speculated`: after its first chunk of drafted tokens; pipelined rounds start with a
    target-only round while the draft prefills)."""
    ids, chunks, called = [], [], False
    for chunk in service.stream(request(k)):
        ids += chunk.token_ids
        chunks.append(chunk)
        drafted = generate_pb2.TOKEN_KIND_TARGET not in chunk.kinds
        if not called and (drafted or not speculated):
            after_first_chunk()
            called = True
    return ids, chunks


def test_draft_killed_mid_generation_falls_back_to_target_only():
    target = start_service(TARGET)
    draft = start_service(DRAFT)
    try:
        service = build_service(CoordinatorConfig(draft=draft.address, target=target.address,
                                                  draft_backoff=0.05, rpc_deadline=5))
        baseline = list(service.generate(request(0)).token_ids)
        ids, chunks = stream_with(service, 4, lambda: draft.stop(signal.SIGKILL),
                                  speculated=True)
        assert ids == baseline
        assert chunks[-1].finish_reason == "length"
        # Speculated before the kill, target-only after it.
        first = next(i for i, c in enumerate(chunks)
                     if generate_pb2.TOKEN_KIND_TARGET not in c.kinds)
        assert generate_pb2.TOKEN_KIND_TARGET in [k for c in chunks[first + 1:] for k in c.kinds]
    finally:
        draft.stop()
        target.stop()


@pytest.mark.long  # make test's soak (tests/soak) restarts a target mid-run, outputs checked
def test_target_restarted_mid_generation_repins_to_the_other_replica():
    targets = [start_service(TARGET) for _ in range(2)]
    draft = start_service(DRAFT)
    restarted = []
    try:
        service = build_service(CoordinatorConfig(
            draft=draft.address, target=",".join(t.address for t in targets), rpc_deadline=5))
        baseline = list(service.generate(request(0)).token_ids)

        def restart_pinned_target():
            pinned = [r for r in service.loop.target.replicas() if r.pinned]
            assert len(pinned) == 1
            victim = next(t for t in targets if t.address == pinned[0].address)
            victim.stop(signal.SIGKILL)
            port = victim.address.rsplit(":", 1)[1]
            restarted.append(start_service(TARGET, int(port)))

        ids, chunks = stream_with(service, 4, restart_pinned_target)
        assert ids == baseline
        assert chunks[-1].finish_reason == "length"
        # The restarted replica serves again (a new generation may land on it).
        again = list(service.generate(request(4)).token_ids)
        assert again == baseline
    finally:
        for proc in targets + restarted + [draft]:
            proc.stop()


def test_coordinator_refuses_a_mismatched_pair(tmp_path):
    """A target whose tokenizer differs from the draft's: exit 2 with a clear message."""
    import subprocess
    import sys

    from tests.procs import ROOT
    from tests.runtime.test_model_folder import save_tiny_folder

    save_tiny_folder(tmp_path, 768)  # same vocabulary size, another tokenizer
    target = start_service(TARGET.with_(model=str(tmp_path)))
    draft = start_service(DRAFT)
    try:
        run = subprocess.run([sys.executable, "-m", "coordinator", "--draft", draft.address,
                              "--target", target.address, "--port", "0"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 2, run.stderr[-2000:]
        assert "must share a tokenizer" in run.stderr
        assert "Traceback" not in run.stderr
    finally:
        draft.stop()
        target.stop()


def test_http_api_answers_503_when_no_target_is_left():
    """The HTTP API over a service whose only target is killed: a generation gets 503 in
    OpenAI's error shape (UNAVAILABLE), /health turns 503, and both recover when a target
    is back on the same address."""
    import httpx

    from tests.http_frontend import serve_frontend

    target = start_service(TARGET)
    restarted = []
    try:
        service = build_service(CoordinatorConfig(target=target.address, rpc_deadline=5))
        body = {"model": service.card.id, "prompt": "hello", "max_tokens": 8,
                "temperature": 0}
        with serve_frontend(service) as url, httpx.Client(base_url=url, timeout=60) as http:
            assert http.get("/health").status_code == 200
            ok = http.post("/v1/completions", json=body)
            assert ok.status_code == 200, ok.text
            target.stop(signal.SIGKILL)
            gone = http.post("/v1/completions", json=body)
            assert gone.status_code == 503, gone.text
            assert gone.json()["error"]["type"] == "service_unavailable"
            assert http.get("/health").status_code == 503
            restarted.append(start_service(TARGET, int(target.address.rsplit(":", 1)[1])))
            deadline = time.monotonic() + 30
            while http.get("/health").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.2)
            # The router's back-off and the channel's reconnect back-off (at most 2 s) may
            # each refuse a first try: 4 s measured, 12 s before the channel's was capped.
            deadline = time.monotonic() + 15
            while (again := http.post("/v1/completions", json=body)).status_code != 200 \
                    and time.monotonic() < deadline:
                time.sleep(0.2)
            assert again.status_code == 200, again.text
            assert again.json()["choices"][0]["text"] == ok.json()["choices"][0]["text"]
    finally:
        for proc in [target, *restarted]:
            proc.stop()
