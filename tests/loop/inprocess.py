"""Draft and target clients that call the engines in this process: the loop's tests run
without gRPC, behind the same client interface (coordinator.remote.clients), in seconds.

Each client converts its requests with the servers' own conversion functions and calls
the real engine (DraftEngine.propose_batch, TargetEngine.verify_batch) on the tiny
models, so only the transport is left out. `fail` injects a failure into a call: a
function of the request items that returns an ItemFailure to answer every item with
(the whole call failed), or None.
"""

from __future__ import annotations

from concurrent.futures import Future

import grpc

from coordinator.remote.clients import BatchCall, ItemFailure
from draft_service import server as draft_server
from draft_service.config import DraftConfig
from draft_service.engine import DraftEngine
from specdec.errors import grpc_status
from specdec.service_cli import load_cached_model
from specdec.v1 import common_pb2, draft_pb2, target_pb2
from target_service import server as target_server
from target_service.config import TargetConfig
from target_service.engine import TargetEngine


def draft_engine(model: str = "tiny-random-draft", max_draft_tokens: int = 16) -> DraftEngine:
    cfg = DraftConfig(model=model, max_sessions=64, max_draft_tokens=max_draft_tokens)
    return DraftEngine(load_cached_model(cfg), cfg.max_draft_tokens, cfg.top_n,
                       default_top_mass=cfg.top_mass)


def target_engine(model: str = "tiny-random") -> TargetEngine:
    cfg = TargetConfig(model=model, max_sessions=64)
    return TargetEngine(load_cached_model(cfg), cfg.max_draft_tokens)


def _error(exc: Exception) -> common_pb2.ItemError:
    code, message, metadata = grpc_status(exc)
    error = common_pb2.ItemError(code=code.value[0], message=message)
    for key, value in metadata:
        if key == "specdec-cached-len":
            error.cached_len = int(value)
    return error


class _InProcess:
    def __init__(self, engine, fail=None):
        self.engine, self.fail = engine, fail
        self.calls: list[int] = []  # items per batch call, in order

    def _answer(self, request, run, field: str, response_type, outcome_type) -> BatchCall:
        self.calls.append(len(request.items))
        future: Future = Future()
        failure = self.fail(request.items) if self.fail is not None else None
        if failure is not None:
            future.set_exception(_RpcError(failure))
        else:
            response = response_type()
            for result in run(request):
                item = response.items.add()
                if isinstance(result, Exception):
                    item.error.CopyFrom(_error(result))
                else:
                    getattr(item, field).CopyFrom(result)
            future.set_result(response)
        call = BatchCall(future, request, field)
        call.finished = call.started
        return call

    def info(self, timeout=None) -> common_pb2.ModelInfo:
        from specdec import wire

        return wire.info_to_proto(self.engine.info())

    def release(self, session_id: str) -> bool:
        return self.engine.release(session_id)


class _RpcError(grpc.RpcError):
    def __init__(self, failure: ItemFailure):
        super().__init__()
        self.failure = failure

    def code(self):
        return self.failure.code

    def details(self):
        return self.failure.message


class DraftInProcess(_InProcess):
    def propose_batch(self, items) -> BatchCall:
        def run(request):
            args = [draft_server.propose_args(i) for i in request.items]
            return [r if isinstance(r, Exception) else draft_server.propose_response(r)
                    for r in self.engine.propose_batch(args)]

        return self._answer(draft_pb2.ProposeBatchRequest(items=items), run, "result",
                            draft_pb2.ProposeBatchResponse, draft_pb2.ProposeOutcome)


class TargetInProcess(_InProcess):
    def verify_batch(self, items) -> BatchCall:
        def run(request):
            args = [target_server.verify_args(i) for i in request.items]
            return [r if isinstance(r, Exception) else target_server.verify_response(r)
                    for r in self.engine.verify_batch(args)]

        return self._answer(target_pb2.VerifyBatchRequest(items=items), run, "result",
                            target_pb2.VerifyBatchResponse, target_pb2.VerifyOutcome)
