"""Fuzzing gRPC Generate: the Serve deployment's own class (coordinator.deploy.app's
CoordinatorReplica, which Serve's gRPC proxy calls by method name) behind a gRPC
server on loopback, without Ray (the Ray Serve coordinator fixture of tests/e2e costs a
cluster start; tests/e2e covers Serve's proxy itself). Fuzzed GenerateRequests get OK
with a consistent response or a client status (INVALID_ARGUMENT, RESOURCE_EXHAUSTED,
...) with a message, never INTERNAL or UNKNOWN; afterwards Generate still gives exactly
the recorded output and no session is left."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest
from hypothesis import event, given

from specdec.v1 import common_pb2, generate_pb2, generate_pb2_grpc
from tests.fuzz._fuzz_stack import GREEDY, PROMPT, examples
from tests.fuzz.test_fuzz_client_api import check_response, generate_requests

pytestmark = pytest.mark.slow

CLIENT_CODES = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE,
                grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION}


class _Generator(generate_pb2_grpc.GeneratorServicer):
    """Runs the replica's async Generate on its own event loop, as Serve's proxy calls it
    (unary Generate only: a stream's error status is Serve's proxy's business, see
    coordinator.deploy.app)."""

    def __init__(self, replica, loop):
        self.replica, self.loop = replica, loop

    def Generate(self, request, context):  # noqa: N802 - RPC name
        return asyncio.run_coroutine_threadsafe(self.replica.Generate(request, context),
                                                self.loop).result()


@pytest.fixture(scope="module")
def generator(stack):
    from concurrent.futures import ThreadPoolExecutor

    from coordinator.deploy.app import CoordinatorReplica

    replica = CoordinatorReplica({"draft": stack.draft_addr, "target": stack.target_addr,
                                  "load_aware_k": False, "max_concurrency": 4,
                                  "log_level": "WARNING"})
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = grpc.server(ThreadPoolExecutor(8))
    generate_pb2_grpc.add_GeneratorServicer_to_server(_Generator(replica, loop), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield generate_pb2_grpc.GeneratorStub(channel)
    finally:
        server.stop(0).wait()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        replica.executor.shutdown(wait=False)


def _normal(stub) -> generate_pb2.GenerateResponse:
    return stub.Generate(generate_pb2.GenerateRequest(
        prompt_token_ids=PROMPT, max_new_tokens=12, num_draft_tokens=4, sampling=GREEDY),
        timeout=60)


@examples(30)
@given(req=generate_requests())
def test_grpc_generate_fuzz(stack, generator, req):
    try:
        resp = generator.Generate(req, timeout=60)
    except grpc.RpcError as err:
        assert err.code() in CLIENT_CODES, (err.code(), err.details())
        assert err.details()
        event(err.code().name)
        return
    event("OK")
    check_response(stack, req, resp)


def test_grpc_generate_after_the_fuzz(stack, generator):
    resp = _normal(generator)
    assert (list(resp.token_ids), resp.text) == (stack.ref.generate_ids,
                                                 stack.ref.generate_text)
    bad = generate_pb2.GenerateRequest(prompt="x", max_new_tokens=4,
                                       sampling=common_pb2.SamplingParams(temperature=-1))
    with pytest.raises(grpc.RpcError) as info:
        generator.Generate(bad, timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "temperature" in info.value.details()
    stack.assert_healthy()
