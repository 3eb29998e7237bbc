"""Protobuf <-> domain conversions shared by the servers and their clients."""

from __future__ import annotations

import torch

from specdec import contrastive
from specdec.client.request import FORMULATIONS
from specdec.errors import InvalidArgument, require
from specdec.grammar import KINDS, Grammar
from specdec.messages import message_fields
from specdec.propose import ProposeOptions
from specdec.runtime.cached_model import ServiceInfo
from specdec.sampling import SamplingParams
from specdec.v1 import common_pb2
from specdec.verify import SparseQ


def propose_options_from_proto(msg) -> ProposeOptions:
    """The options a ProposeRequest carries (by field name; an unset optional is None).
    The other way is specdec.messages.message_from(ProposeRequest, options, ...)."""
    names = vars(ProposeOptions())
    return ProposeOptions(**{k: v for k, v in message_fields(msg).items() if k in names})


def sampling_from_proto(msg: common_pb2.SamplingParams) -> SamplingParams:
    """Unchecked (SamplingParams.validate); repetition_penalty 0 (unset) is 1 (off)."""
    return SamplingParams(msg.temperature, msg.top_k, msg.top_p, msg.seed,
                          msg.presence_penalty, msg.frequency_penalty,
                          msg.repetition_penalty or 1.0, msg.min_p,
                          tuple(sorted(msg.logit_bias.items())), msg.prompt_len,
                          grammar_from_proto(msg.grammar) if msg.HasField("grammar")
                          else None, msg.min_tokens, tuple(msg.stop_token_ids))


def sampling_to_proto(params: SamplingParams,
                      grammar_spec: bool = True) -> common_pb2.SamplingParams:
    """`grammar_spec` False leaves the grammar's text off (its digest names it: a
    session that has started holds it; specdec.grammar)."""
    msg = common_pb2.SamplingParams(
        temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
        seed=params.seed, presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        repetition_penalty=0.0 if params.repetition_penalty == 1.0
        else params.repetition_penalty, min_p=params.min_p,
        logit_bias=dict(params.logit_bias), prompt_len=params.prompt_len,
        min_tokens=params.min_tokens, stop_token_ids=list(params.stop_token_ids))
    if params.grammar is not None:
        msg.grammar.CopyFrom(grammar_to_proto(params.grammar, grammar_spec))
    return msg


# specdec.grammar's kinds <-> Grammar.Kind (KIND_JSON_SCHEMA is "json_schema", ...)
GRAMMAR_KINDS = {kind: common_pb2.Grammar.Kind.Value("KIND_" + kind.upper())
                 for kind in KINDS}
_KIND_NAMES = {v: k for k, v in GRAMMAR_KINDS.items()}


def grammar_to_proto(g: Grammar, spec: bool = True) -> common_pb2.Grammar:
    return common_pb2.Grammar(kind=GRAMMAR_KINDS[g.kind], spec=g.spec if spec else "",
                              digest=g.digest)


def grammar_from_proto(msg: common_pb2.Grammar) -> Grammar:
    """Kind 0 (unset) or unknown reads as "" (refused by SamplingParams.validate). With
    its text, the digest is computed here (a sent one is not trusted: the services cache
    compiled grammars by it); without, the sent digest names the session's grammar. A
    json_object grammar has no text (any sent is ignored)."""
    kind = _KIND_NAMES.get(msg.kind, "")
    if kind == "json_object":
        return Grammar.of(kind)
    if msg.spec or not msg.digest:
        return Grammar.of(kind, msg.spec)
    return Grammar(kind, "", msg.digest)


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
    """A quantised q (Quantize-Sample-Verify) in SparseDist's compact form: ids sorted
    ascending and delta-coded, their counts in the same order."""
    if q.counts is None:
        raise ValueError("only a quantised q (sampling.quantise) goes on the wire")
    order = torch.argsort(q.token_ids)
    ids = q.token_ids[order]
    deltas = torch.diff(ids, prepend=ids.new_zeros(1))
    return common_pb2.SparseDist(id_deltas=deltas.tolist(), counts=q.counts[order].tolist())


def dist_from_proto(msg: common_pb2.SparseDist, where: str = "dist") -> SparseQ:
    """Either form of SparseDist as a SparseQ: the compact one with its counts (ids
    ascending when the deltas after the first are >= 1), the float one as sent.
    InvalidArgument, prefixed with `where`, when the fields do not pair up; whether the
    values make a distribution is the target's to check (TargetEngine.validate)."""
    if msg.id_deltas or msg.counts:
        require(not msg.token_ids and not msg.probs,
                f"{where}: send id_deltas and counts, or token_ids and probs, not both")
        require(len(msg.id_deltas) == len(msg.counts),
                f"{where}: id_deltas and counts must have the same, non-zero length "
                f"(got {len(msg.id_deltas)} and {len(msg.counts)})")
        ids = torch.tensor(msg.id_deltas, dtype=torch.long).cumsum(0)
        return SparseQ.quantised(ids, torch.tensor(msg.counts, dtype=torch.long))
    require(len(msg.token_ids) == len(msg.probs) and msg.token_ids,
            f"{where}: token_ids and probs must have the same, non-zero length "
            f"(got {len(msg.token_ids)} and {len(msg.probs)})")
    return SparseQ(torch.tensor(msg.token_ids, dtype=torch.long),
                   torch.tensor(msg.probs, dtype=torch.float32))


def point_mass_dist(token: int) -> common_pb2.SparseDist:
    """A q with all its mass on `token`, in the compact form (a model-free draft's)."""
    return dist_to_proto(SparseQ.one_hot(token))


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
