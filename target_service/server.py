"""TargetService over gRPC: protobuf in, TargetEngine, protobuf out."""

from __future__ import annotations

from specdec import wire
from specdec.grpc_server import Service, answer_batch, busy_wait_s
from specdec.logprobs import logprobs_to_proto
from specdec.v1 import common_pb2, target_pb2, target_pb2_grpc
from target_service.engine import TargetEngine, VerifyArgs, VerifyResult

SERVICE_NAME = target_pb2.DESCRIPTOR.services_by_name["TargetService"].full_name


class TargetServicer(target_pb2_grpc.TargetServiceServicer):
    def __init__(self, engine: TargetEngine):
        self.engine = engine

    def Info(self, request, context):
        return wire.info_to_proto(self.engine.info())

    def Verify(self, request: target_pb2.VerifyRequest, context):
        result = self.engine.verify(verify_args(request), busy_wait_s(context),
                                    cancelled=lambda: not context.is_active())
        return verify_response(result)

    def VerifyBatch(self, request: target_pb2.VerifyBatchRequest, context):
        """Each item as a Verify of its own, one forward pass for all: an item that fails
        (even one that does not parse) gets its ItemError and the others their results."""
        return answer_batch(request, verify_args, lambda args: self.engine.verify_batch(
            args, busy_wait_s(context), cancelled=lambda: not context.is_active()),
            verify_response, target_pb2.VerifyBatchResponse())

    def Release(self, request, context):
        return common_pb2.ReleaseResponse(released=self.engine.release(request.session_id))


def verify_args(request: target_pb2.VerifyRequest) -> VerifyArgs:
    return VerifyArgs(
        session_id=request.session_id, keep_len=request.keep_len,
        keep_digest=request.keep_digest, new_tokens=list(request.new_tokens),
        num_draft=request.num_draft,
        draft_dists=[wire.dist_from_proto(d, f"draft_dists[{i}]")
                     for i, d in enumerate(request.draft_dists)],
        sampling=wire.sampling_from_proto(request.sampling), round_seed=request.round_seed,
        bonus_seed=request.bonus_seed if request.HasField("bonus_seed") else None,
        contrastive=wire.contrastive_from_proto(request.contrastive)
        if request.HasField("contrastive") else None,
        logprobs=request.logprobs if request.HasField("logprobs") else None,
        prompt_logprobs=request.prompt_logprobs,
    )


def verify_response(result: VerifyResult) -> target_pb2.VerifyResponse:
    r, ran_in = result.round, result.ran_in
    response = target_pb2.VerifyResponse(
        target_probs=r.target_probs, recovered_tokens=r.recovered_tokens,
        bonus_token=r.bonus_token, cached_len=result.cached_len,
    )
    response.logprobs.extend(logprobs_to_proto(e) for e in r.logprobs or ())
    response.prompt_logprobs.extend(logprobs_to_proto(e)
                                    for e in r.prompt_logprobs or ())
    for h in result.heads or ():
        response.heads.add(token_ids=h.token_ids.tolist(), values=h.values.tolist())
    if ran_in is not None:
        response.pass_sessions, response.pass_tokens = ran_in.sessions, ran_in.tokens
        response.pass_seconds = ran_in.seconds
    return response


def service(engine: TargetEngine) -> Service:
    return Service(target_pb2_grpc.add_TargetServiceServicer_to_server,
                   TargetServicer(engine), SERVICE_NAME)
