"""Fuzzing while other clients generate: fuzzed Propose and Verify calls and fuzzed HTTP
bodies run while two background clients generate over and over (one through the
GenerationService, one through the HTTP API). Every background generation must give
exactly the recorded output: hostile input to a service never disturbs another
session. Only the fuzzed requests' own sessions are released between examples."""

from __future__ import annotations

import json
import threading

import grpc
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdec.v1 import common_pb2, draft_pb2, target_pb2
from tests.fuzz._fuzz_stack import RPC_TIMEOUT_S, examples
from tests.fuzz.test_fuzz_client_api import check_http, http_bodies
from tests.fuzz.test_fuzz_model_services import (
    PROPOSE,
    VERIFY,
    assert_client_error,
    valid_dists_for,
)

pytestmark = pytest.mark.slow


@pytest.fixture()
def background(stack):
    """Two clients generating the reference request in a loop; checked at the end."""
    stop = threading.Event()
    results: list = []
    errors: list = []

    def via_service():
        while not stop.is_set():
            try:
                resp = stack.generate()
                results.append(("service", list(resp.token_ids), resp.text))
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(f"service: {exc!r}")

    def via_http():
        with httpx.Client(base_url=stack.http_url, timeout=60) as http:
            while not stop.is_set():
                try:
                    r = stack.http_completion(http)
                    out = r.json()
                    results.append(("http", out["specdec"]["token_ids"],
                                    out["choices"][0]["text"]))
                except Exception as exc:  # noqa: BLE001
                    errors.append(f"http: {exc!r}")

    threads = [threading.Thread(target=f, daemon=True) for f in (via_service, via_http)]
    for t in threads:
        t.start()
    yield
    stop.set()
    for t in threads:
        t.join(60)
    assert not errors, errors[:5]
    expected = (stack.ref.generate_ids, stack.ref.generate_text)
    wrong = [r for r in results if (r[1], r[2]) != expected]
    assert not wrong, wrong[:3]
    assert {"service", "http"} <= {r[0] for r in results}
    stack.assert_healthy()


def _release(stack, service: str, session_id: str) -> None:
    stub = stack.draft if service == "draft" else stack.target
    try:
        stub.Release(common_pb2.ReleaseRequest(session_id=session_id), timeout=RPC_TIMEOUT_S)
    except grpc.RpcError as err:
        assert_client_error(err)  # an empty id


@examples(60)
@given(kind=st.sampled_from(["propose", "verify", "http"]), data=st.data())
def test_fuzz_beside_running_generations(stack, background, kind, data):
    if kind == "http":
        path, body = data.draw(http_bodies(stack.service.card.id))
        with httpx.Client(base_url=stack.http_url, timeout=60) as http:
            r = http.post(path, content=json.dumps(body).encode(),
                          headers={"content-type": "application/json"})
        check_http(r, body)
        return
    service = "draft" if kind == "propose" else "target"
    values, prefix = data.draw(PROPOSE if kind == "propose" else VERIFY)
    sid = values["session_id"]
    if service == "draft":
        start = draft_pb2.ProposeRequest(session_id=sid, new_tokens=prefix or [1],
                                         num_tokens=1)
    else:
        if values["draft_dists"] == "valid":
            values["draft_dists"] = [] if values["sampling"].temperature == 0 else \
                valid_dists_for(values["new_tokens"], values["num_draft"])
        start = target_pb2.VerifyRequest(session_id=sid, new_tokens=prefix or [1])
    rpc = stack.draft.Propose if service == "draft" else stack.target.Verify
    request = (draft_pb2.ProposeRequest if service == "draft" else
               target_pb2.VerifyRequest)(**values)
    try:
        for req in ([start] if prefix is not None else []) + [request]:
            try:
                rpc(req, timeout=RPC_TIMEOUT_S)
            except grpc.RpcError as err:
                assert_client_error(err)
    finally:
        if sid:
            _release(stack, service, sid)
