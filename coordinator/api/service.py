"""The client API without Ray or gRPC servers: GenerateRequest in, responses out.

Validates the request, tokenizes the prompt (raw text, chat messages through the
model's template, or ids), runs the speculative loop, turns ids into streamed text
(incremental detokenization, stop strings) and fills kinds, finish_reason and stats.
The Ray Serve deployment (coordinator.deploy.app) is a thin shell around this class.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from coordinator.api.text import IncrementalDetokenizer, TextStream
from coordinator.loop import LoopStats, SpeculativeLoop
from specdec import chat_template, wire
from specdec.contrastive import ContrastiveParams
from specdec.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    require,
)
from specdec.grammar import Grammars
from specdec.grammar import check as grammar_check
from specdec.logprobs import MAX_TOP_LOGPROBS, logprobs_to_proto
from specdec.messages import message_from
from specdec.sampling import SamplingParams
from specdec.v1 import generate_pb2

CHAT_ROLES = ("system", "user", "assistant", "tool")
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256


@dataclass(frozen=True)
class Limits:
    vocab_size: int
    max_context: int
    max_draft_tokens: int  # the draft's (0 when there is no draft)
    default_k: int = 4
    max_new_tokens_cap: int = 4096
    max_concurrency: int = 32
    # A draft replica's logits depend on its passes' size (ModelInfo.batch_dependent_logits):
    # no use as contrastive decoding's amateur.
    amateur_batch_dependent: bool = False


@dataclass(frozen=True)
class ModelCard:
    """What this coordinator serves, as clients see it (GET /v1/models)."""

    id: str  # the name requests give as `model`
    target: str  # the target's model_id
    draft: str | None  # the draft's model_id (None: target-only)
    max_context: int
    default_k: int


@dataclass
class Plan:
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams
    k: int
    stop: list[str]
    k_from_server: bool = False  # the request left K to the server (load-aware K may move it)
    contrastive: ContrastiveParams | None = None  # contrastive decoding (None: speculative)
    logprobs: int | None = None  # each token's raw log-probability, with this many top
    prompt_logprobs: bool = False  # ... and the prompt's
    prediction: list[int] = field(default_factory=list)  # Predicted Outputs' token ids
    guide: object = None  # the coordinator's matcher of sampling.grammar (jump-forward)
    ignore_eos: bool = False  # vLLM's: end tokens do not end the generation


class GenerationService:
    def __init__(self, loop: SpeculativeLoop, tokenizer, limits: Limits,
                 eos_token_ids: list[int], card: ModelCard | None = None,
                 expose_replicas: bool = False):
        self.loop = loop
        # --expose-replicas: stats name who served; served_by is (Serve replica, Ray node),
        # set by coordinator.deploy.app (empty in a process without Serve).
        self.expose_replicas = expose_replicas
        self.served_by = ("", "")
        self.card = card or ModelCard("specdec", "unknown", None, limits.max_context,
                                      limits.default_k)
        self.tokenizer = tokenizer
        self.limits = limits
        self.eos_token_ids = eos_token_ids
        self._slots = threading.BoundedSemaphore(limits.max_concurrency)
        # Structured outputs: the coordinator's own matchers (jump-forward; the services
        # mask with theirs).
        self.grammars = Grammars(lambda: tokenizer, limits.vocab_size) \
            if tokenizer is not None else None
        if self.grammars is not None:
            self.grammars.warm()

    # -- validation --------------------------------------------------------------------

    def plan(self, req: generate_pb2.GenerateRequest) -> Plan:
        """INVALID_ARGUMENT (with the field named) for anything a client can get wrong."""
        lim = self.limits
        given = [bool(req.prompt), len(req.messages) > 0, len(req.prompt_token_ids) > 0]
        require(sum(given) == 1, "give exactly one of prompt, messages or prompt_token_ids "
                                 f"(got {sum(given)})")
        least = 0 if req.prompt_logprobs else 1  # 0: score the prompt only
        require(least <= req.max_new_tokens <= lim.max_new_tokens_cap,
                f"max_new_tokens must be in [{least}, {lim.max_new_tokens_cap}] (0 only "
                f"with prompt_logprobs), got {req.max_new_tokens}")
        logprobs = req.logprobs if req.HasField("logprobs") else None
        require(logprobs is None or 0 <= logprobs <= MAX_TOP_LOGPROBS,
                f"logprobs must be in [0, {MAX_TOP_LOGPROBS}] (the alternatives per token; "
                f"unset = none), got {logprobs}")
        require(not req.prompt_logprobs or logprobs is not None,
                "prompt_logprobs needs logprobs (0 or more alternatives per token)")
        sampling = wire.sampling_from_proto(req.sampling).validate()
        require(sampling.min_tokens <= req.max_new_tokens,
                f"sampling.min_tokens ({sampling.min_tokens}) must not exceed max_new_tokens "
                f"({req.max_new_tokens})")
        # the model's end ids, which min_tokens holds back (a client's list is ignored)
        sampling = replace(sampling, stop_token_ids=tuple(self.eos_token_ids)
                           if sampling.min_tokens and not req.ignore_eos else ())
        bad = [t for t, _ in sampling.logit_bias if t >= lim.vocab_size]
        require(not bad, f"sampling.logit_bias keys must be token ids in [0, "
                         f"{lim.vocab_size}), got {bad[:5]}")
        k = req.num_draft_tokens if req.HasField("num_draft_tokens") else lim.default_k
        if not req.HasField("num_draft_tokens"):
            k = min(k, lim.max_draft_tokens)
        require(0 <= k <= lim.max_draft_tokens,
                f"num_draft_tokens must be in [0, {lim.max_draft_tokens}] (the draft's "
                f"max_draft_tokens; 0 = target only), got {k}")
        require(len(req.stop) <= MAX_STOP_STRINGS,
                f"stop holds {len(req.stop)} strings; at most {MAX_STOP_STRINGS} are allowed")
        require(all(len(s) <= MAX_STOP_CHARS for s in req.stop),
                f"stop strings must be at most {MAX_STOP_CHARS} characters")
        if sampling.grammar is not None:
            error = grammar_check(sampling.grammar)
            require(not error, f"sampling.grammar ({sampling.grammar.kind}): {error}")
        contrastive = self._contrastive(req, sampling)
        require(contrastive is None or (logprobs is None and not sampling.penalised
                                        and sampling.grammar is None),
                "decoding = CONTRASTIVE takes no logprobs, penalties, logit_bias or grammar: "
                "they are the target's distribution's, and contrastive decoding samples "
                "another")
        ids = self._prompt_ids(req)
        require(len(ids) >= 1, "the prompt encodes to no tokens")
        room = lim.max_context - len(ids)
        if room < 1:
            raise InvalidArgument(
                f"prompt is {len(ids)} tokens; the model's context is {lim.max_context} "
                "and leaves no room to generate: shorten the prompt")
        guide = self.grammars.new_state(sampling.grammar, len(ids)) \
            if sampling.grammar is not None and self.grammars is not None else None
        return Plan(ids, min(req.max_new_tokens, room), sampling, k, list(req.stop),
                    ignore_eos=req.ignore_eos,
                    k_from_server=not req.HasField("num_draft_tokens"),
                    contrastive=contrastive, logprobs=logprobs,
                    prompt_logprobs=req.prompt_logprobs,
                    prediction=self._prediction(req, contrastive), guide=guide)

    def _prediction(self, req, contrastive) -> list[int]:
        """Predicted Outputs' text as token ids (empty without one)."""
        if not req.prediction:
            return []
        require(contrastive is None, "prediction is for speculative decoding; contrastive "
                                     "decoding samples another distribution")
        require(self.tokenizer is not None,
                "prediction needs the coordinator's tokenizer, and this one has none")
        ids = list(self.tokenizer.encode(req.prediction, add_special_tokens=False))
        require(len(ids) <= self.limits.max_context,
                f"prediction is {len(ids)} tokens, more than the model's context "
                f"({self.limits.max_context})")
        return ids

    def _contrastive(self, req, sampling: SamplingParams) -> ContrastiveParams | None:
        """The contrastive parameters of a CONTRASTIVE request (None for SPECULATIVE)."""
        if req.decoding not in (generate_pb2.DECODING_SPECULATIVE,
                                generate_pb2.DECODING_CONTRASTIVE):
            raise InvalidArgument(f"decoding must be SPECULATIVE (0) or CONTRASTIVE (1), "
                                  f"got {req.decoding}")
        if req.decoding != generate_pb2.DECODING_CONTRASTIVE:
            require(not req.HasField("contrastive"),
                    "contrastive parameters were given, but decoding is SPECULATIVE; set "
                    "decoding = CONTRASTIVE")
            return None
        params = wire.contrastive_from_proto(req.contrastive)
        require(sampling.top_k == 0 and sampling.top_p in (0.0, 1.0),
                "top_k and top_p must be off with contrastive decoding: its plausible set "
                "(alpha) is its truncation")
        if self.loop.draft is None or self.limits.max_draft_tokens == 0:
            raise FailedPrecondition("contrastive decoding needs a draft service (the "
                                     "amateur); this coordinator runs without one")
        if self.limits.amateur_batch_dependent:
            raise FailedPrecondition(
                "contrastive decoding needs an amateur whose logits depend on the prefix "
                "alone, and this coordinator's draft quantizes activations per pass; "
                "restart the draft with --dynamic-quantization off (OpenVINO) or without "
                "--quantize int8 (torch)")
        return params

    def _prompt_ids(self, req) -> list[int]:
        if req.prompt_token_ids:
            ids = list(req.prompt_token_ids)
            bad = [t for t in ids if not 0 <= t < self.limits.vocab_size]
            require(not bad, f"prompt_token_ids outside the vocabulary [0, "
                             f"{self.limits.vocab_size}): {bad[:5]}")
            return ids
        require(self.tokenizer is not None,
                "this coordinator has no tokenizer; send prompt_token_ids")
        if req.messages:
            for i, m in enumerate(req.messages):
                require(m.role in CHAT_ROLES, f"messages[{i}].role must be one of "
                                              f"{', '.join(CHAT_ROLES)}, got {m.role!r}")
            text = chat_template.render(self.tokenizer, chat_template.turns(req.messages),
                                        chat_template.tools_of(req.tools))
        else:
            text = req.prompt
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    # -- generation --------------------------------------------------------------------

    def stream(self, req: generate_pb2.GenerateRequest, deadline: float | None = None,
               tenant: str = "") -> Iterator[generate_pb2.GenerateChunk]:
        """One chunk per round; the last carries finish_reason and stats. Closing the
        iterator (client gone) ends the generation and frees its sessions. Past
        `deadline` (time.monotonic()) the next round raises DEADLINE_EXCEEDED. `tenant`
        (an API key's name): whose recent outputs the look-up drafts from, when the
        coordinator keeps them (--lookup-cache)."""
        plan = self.plan(req)
        if not self._slots.acquire(blocking=False):
            raise ResourceExhausted(
                f"coordinator is at its concurrency limit ({self.limits.max_concurrency} "
                "generations); retry later")
        try:
            yield from self._stream(plan, deadline, tenant)
        finally:
            self._slots.release()

    def _stream(self, plan: Plan, deadline: float | None,
                tenant: str = "") -> Iterator[generate_pb2.GenerateChunk]:
        stats = LoopStats()
        detok = (IncrementalDetokenizer(self.tokenizer, plan.prompt_ids)
                 if self.tokenizer is not None else None)
        # vLLM's min_tokens: stop strings act only once min_tokens tokens are out
        text = TextStream(plan.stop, armed=plan.sampling.min_tokens == 0)
        rounds = self.loop.rounds(plan.prompt_ids, plan.max_new_tokens, plan.sampling, plan.k,
                                  () if plan.ignore_eos else self.eos_token_ids, stats,
                                  load_aware=plan.k_from_server,
                                  contrastive=plan.contrastive, tenant=tenant,
                                  logprobs=plan.logprobs,
                                  prompt_logprobs=plan.prompt_logprobs,
                                  prediction=plan.prediction, guide=plan.guide)
        generated = 0
        reason = "length"
        try:
            for out in rounds:
                if deadline is not None and time.monotonic() > deadline:
                    raise DeadlineExceeded(
                        f"the request's deadline passed after {generated} generated tokens; "
                        "give it a longer timeout or ask for fewer tokens")
                # Token by token, so each token's text is known (the demo colours it by
                # kind) and the text does not depend on how rounds chunk the ids. A stop
                # string ends the ids at the token that settled it: the rest of the round
                # is dropped, so ids, like text, do not depend on the round size (K=0
                # would have stopped there too).
                pieces = []
                for t in out.tokens:
                    text.armed = text.armed or generated + len(pieces) + 1 >= \
                        plan.sampling.min_tokens
                    pieces.append(text.push(detok.add([t])) if detok else "")
                    if text.stopped:
                        break
                kept = len(pieces)
                generated += kept
                if out.finish_reason:
                    reason = out.finish_reason
                if text.stopped:
                    reason = "stop"
                done = bool(out.finish_reason) or text.stopped
                tail = ""
                if done and detok and not text.stopped:
                    tail = text.push(detok.flush()) + text.finish()
                    if pieces:  # the last token released it
                        pieces[-1], tail = pieces[-1] + tail, ""
                    reason = "stop" if text.stopped else reason
                chunk = generate_pb2.GenerateChunk(text="".join(pieces) + tail,
                                                   token_ids=out.tokens[:kept],
                                                   kinds=[int(k) for k in out.kinds[:kept]],
                                                   token_texts=pieces)
                if out.logprobs is not None:
                    chunk.logprobs.extend(map(logprobs_to_proto, out.logprobs[:kept]))
                if out.prompt_logprobs is not None:
                    chunk.prompt_token_ids.extend(plan.prompt_ids)
                    chunk.prompt_logprobs.extend(map(logprobs_to_proto,
                                                     out.prompt_logprobs))
                if done:
                    rounds.close()  # frees the sessions now; a pre-draft in flight counts
                    chunk.finish_reason = reason
                    chunk.stats.CopyFrom(self._stats(plan, generated, stats))
                    yield chunk
                    return
                yield chunk
        finally:
            rounds.close()

    def generate(self, req: generate_pb2.GenerateRequest) -> generate_pb2.GenerateResponse:
        resp = generate_pb2.GenerateResponse()
        for chunk in self.stream(req):
            add_chunk(resp, chunk)
        return resp

    def _stats(self, plan: Plan, generated: int, s: LoopStats) -> generate_pb2.GenerationStats:
        """The wire's stats, field by field from the loop's (specdec.messages); who served
        it only with --expose-replicas."""
        hidden = {} if self.expose_replicas else {"draft_replicas": (), "target_replicas": ()}
        stats = message_from(generate_pb2.GenerationStats, s,
                             prompt_tokens=len(plan.prompt_ids), generated_tokens=generated,
                             seconds=s.seconds if math.isfinite(s.seconds) else 0.0, **hidden)
        if self.expose_replicas:
            stats.coordinator_replica, stats.coordinator_node = self.served_by
        return stats


def add_chunk(resp: generate_pb2.GenerateResponse, chunk: generate_pb2.GenerateChunk) -> None:
    """Fold one streamed chunk into a unary response (the last brings reason and stats)."""
    resp.text += chunk.text
    resp.token_ids.extend(chunk.token_ids)
    resp.kinds.extend(chunk.kinds)
    resp.token_texts.extend(chunk.token_texts)
    resp.logprobs.extend(chunk.logprobs)
    resp.prompt_logprobs.extend(chunk.prompt_logprobs)
    resp.prompt_token_ids.extend(chunk.prompt_token_ids)
    if chunk.finish_reason:
        resp.finish_reason = chunk.finish_reason
        resp.stats.CopyFrom(chunk.stats)

