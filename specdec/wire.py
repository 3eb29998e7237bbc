"""Protobuf <-> domain conversions shared by the servers and their clients."""

from __future__ import annotations

from specdec import contrastive
from specdec.client.request import FORMULATIONS
from specdec.errors import InvalidArgument
from specdec.runtime.cached_model import ServiceInfo
from specdec.sampling import SamplingParams
from specdec.v1 import common_pb2
from specdec.verify import SparseQ


def sampling_from_proto(msg: common_pb2.SamplingParams) -> SamplingParams:
    return SamplingParams(msg.temperature, msg.top_k, msg.top_p, msg.seed)


def sampling_to_proto(params: SamplingParams) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(temperature=params.temperature, top_k=params.top_k,
                                     top_p=params.top_p, seed=params.seed)


def info_to_proto(info: ServiceInfo) -> common_pb2.ModelInfo:
    return common_pb2.ModelInfo(
        model_id=info.model_id, vocab_size=info.vocab_size,
        tokenizer_digest=info.tokenizer_digest, max_context=info.max_context,
        backend=info.backend, device=info.device, max_draft_tokens=info.max_draft_tokens,
        max_sessions=info.max_sessions, default_top_n=info.default_top_n,
        batch_dependent_logits=info.batch_dependent_logits,
        skip_layers=list(info.skip_layers),
    )


def dist_to_proto(q: SparseQ) -> common_pb2.SparseDist:
    return common_pb2.SparseDist(token_ids=q.token_ids.tolist(), probs=q.probs.tolist())


def dist_from_proto(msg: common_pb2.SparseDist) -> tuple[list[int], list[float]]:
    return list(msg.token_ids), list(msg.probs)


_FORMULATIONS = {code: name for name, code in FORMULATIONS.items()}


def contrastive_from_proto(msg: common_pb2.ContrastiveParams) -> contrastive.ContrastiveParams:
    """Unset fields take the defaults; validated (InvalidArgument names the field)."""
    d = contrastive.ContrastiveParams()
    formulation = _FORMULATIONS.get(msg.formulation)
    if formulation is None:
        raise InvalidArgument(f"contrastive.formulation: unknown value {msg.formulation} "
                              "(0 = O'Brien & Lewis, 1 = Li et al.)")
    return contrastive.ContrastiveParams(
        msg.alpha if msg.HasField("alpha") else d.alpha,
        msg.beta if msg.HasField("beta") else d.beta,
        msg.amateur_temperature if msg.HasField("amateur_temperature")
        else d.amateur_temperature, formulation).validate()


def contrastive_to_proto(params: contrastive.ContrastiveParams) -> common_pb2.ContrastiveParams:
    code = {v: k for k, v in _FORMULATIONS.items()}[params.formulation]
    return common_pb2.ContrastiveParams(alpha=params.alpha, beta=params.beta,
                                        amateur_temperature=params.amateur_temperature,
                                        formulation=code)
