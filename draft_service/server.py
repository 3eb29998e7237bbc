"""DraftService over gRPC: protobuf in, DraftEngine, protobuf out."""

from __future__ import annotations

from draft_service.amateur import ScoreArgs
from draft_service.engine import DraftEngine, ProposeArgs, ProposeResult
from specdec import wire
from specdec.grpc_server import Service, answer_batch, busy_wait_s
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc

SERVICE_NAME = draft_pb2.DESCRIPTOR.services_by_name["DraftService"].full_name


class DraftServicer(draft_pb2_grpc.DraftServiceServicer):
    def __init__(self, engine: DraftEngine):
        self.engine = engine

    def Info(self, request, context):
        return wire.info_to_proto(self.engine.info())

    def Propose(self, request: draft_pb2.ProposeRequest, context):
        result = self.engine.propose(propose_args(request),
                                     cancelled=lambda: not context.is_active(),
                                     busy_wait_s=busy_wait_s(context))
        return propose_response(result)

    def ProposeBatch(self, request: draft_pb2.ProposeBatchRequest, context):
        """Each item as a Propose of its own, drafted together: an item that fails (even
        one that does not parse) gets its ItemError and the others their results."""
        return answer_batch(request, propose_args, lambda args: self.engine.propose_batch(
            args, cancelled=lambda: not context.is_active(), busy_wait_s=busy_wait_s(context)),
            propose_response, draft_pb2.ProposeBatchResponse())

    def Score(self, request: draft_pb2.ScoreRequest, context):
        result = self.engine.score(ScoreArgs(
            session_id=request.session_id, keep_len=request.keep_len,
            keep_digest=request.keep_digest, new_tokens=list(request.new_tokens),
            heads=[list(h.token_ids) for h in request.heads],
            params=wire.contrastive_from_proto(request.contrastive),
            read_only=request.read_only,
        ), cancelled=lambda: not context.is_active(), busy_wait_s=busy_wait_s(context))
        return draft_pb2.ScoreResponse(
            values=[common_pb2.HeadValues(values=v.tolist()) for v in result.values],
            cached_len=result.cached_len, next_token=result.next_token)

    def Release(self, request, context):
        return common_pb2.ReleaseResponse(released=self.engine.release(request.session_id))


def propose_args(request: draft_pb2.ProposeRequest) -> ProposeArgs:
    return ProposeArgs(
        session_id=request.session_id, keep_len=request.keep_len,
        keep_digest=request.keep_digest, new_tokens=list(request.new_tokens),
        sampling=wire.sampling_from_proto(request.sampling),
        **vars(wire.propose_options_from_proto(request)))


def propose_response(result: ProposeResult) -> draft_pb2.ProposeResponse:
    return draft_pb2.ProposeResponse(
        tokens=result.tokens, dists=[wire.dist_to_proto(q) for q in result.dists],
        cached_len=result.cached_len, step_seconds=result.step_seconds)


def service(engine: DraftEngine) -> Service:
    return Service(draft_pb2_grpc.add_DraftServiceServicer_to_server, DraftServicer(engine),
                   SERVICE_NAME)
