"""Build a GenerationService from a CoordinatorConfig: routers, checks, tokenizer."""

from __future__ import annotations

import logging
import time

import grpc

from coordinator.api.service import GenerationService, Limits, ModelCard
from coordinator.deploy.config import CoordinatorConfig
from coordinator.loop import SpeculativeLoop
from coordinator.remote.clients import DraftClient, TargetClient
from coordinator.remote.routing import Router, address_source
from specdec.tls import client_tls

log = logging.getLogger(__name__)


def wait_for_infos(router: Router, kind: str, timeout_s: float) -> dict:
    """Info from every replica, retrying while they start; {address: ModelInfo}."""
    deadline = time.monotonic() + timeout_s
    while not router.replicas():  # e.g. a headless Service whose pods are not up yet
        if time.monotonic() > deadline:
            raise ConnectionError(f"no {kind} replica found within {timeout_s:.0f} s")
        time.sleep(1.0)
    infos = {}
    for replica in router.replicas():
        warned = False
        while True:
            try:
                infos[replica.address] = replica.client.info()
                break
            except grpc.RpcError as e:
                details = e.details() or ""
                if not warned and _looks_like_tls(details):
                    log.warning("%s service at %s: TLS handshake failed (retrying until the "
                                "start-up timeout): %s", kind, replica.address, details)
                    warned = True
                if time.monotonic() > deadline:
                    raise ConnectionError(
                        f"{kind} service at {replica.address} did not answer Info within "
                        f"{timeout_s:.0f} s ({e.code().name}: {details}); is it running, "
                        "and do its TLS settings match the coordinator's?") from e
                time.sleep(0.5)
    return infos


def _looks_like_tls(details: str) -> bool:
    text = details.lower()
    return any(word in text for word in ("ssl", "tls", "handshake", "certificate"))


def check_compatible(drafts: dict, targets: dict) -> None:
    """Refuse replicas whose token ids would not mean the same thing."""
    everyone = [("target", a, i) for a, i in targets.items()] + \
               [("draft", a, i) for a, i in drafts.items()]
    kind0, addr0, ref = everyone[0]
    for kind, addr, info in everyone[1:]:
        if (info.vocab_size, info.tokenizer_digest) != (ref.vocab_size, ref.tokenizer_digest):
            raise ValueError(
                f"{kind} at {addr} ({info.model_id}: vocab {info.vocab_size}, tokenizer "
                f"{info.tokenizer_digest}) does not match {kind0} at {addr0} "
                f"({ref.model_id}: vocab {ref.vocab_size}, tokenizer {ref.tokenizer_digest}); "
                "draft and target must share a tokenizer")


def admission_check(ref, kind: str, deadline_s: float):
    """For Router.admit: None when a new replica's vocabulary and tokenizer match `ref`
    (the ModelInfo checked at start-up), else why not."""
    def admit(address: str, client) -> str | None:
        try:
            info = client.info(timeout=min(deadline_s, 5.0))
        except grpc.RpcError as e:
            return f"its Info call failed ({e.code().name})"
        if (info.vocab_size, info.tokenizer_digest) != (ref.vocab_size, ref.tokenizer_digest):
            return (f"{kind} {info.model_id} has vocab {info.vocab_size} and tokenizer "
                    f"{info.tokenizer_digest}, not vocab {ref.vocab_size} and tokenizer "
                    f"{ref.tokenizer_digest} like the replicas this coordinator started with")
        return None

    return admit


def load_tokenizer(name: str, expected_digest: str):
    from specdec.runtime.models import load_tokenizer as load
    from specdec.runtime.models import tokenizer_digest

    tokenizer = load(name)
    if tokenizer is not None and tokenizer_digest(tokenizer) != expected_digest:
        raise ValueError(
            f"tokenizer of {name!r} (digest {tokenizer_digest(tokenizer)}) differs from the "
            f"services' ({expected_digest}); pass --model with the model they serve")
    return tokenizer


def build_service(cfg: CoordinatorConfig) -> GenerationService:
    rtt, jitter = cfg.inject_rtt_ms / 1000, cfg.inject_jitter_ms / 1000

    def target_client(channel):
        return TargetClient(channel, cfg.rpc_deadline, rtt, jitter)

    def draft_client(channel):
        return DraftClient(channel, cfg.rpc_deadline, rtt, jitter)

    # Before any address is dialled: an unusable file is a start-up error, now.
    tls = client_tls(cfg.tls_ca, cfg.tls_cert, cfg.tls_key, cfg.tls_server_name)
    if tls is not None:
        log.info("draft and target over %s", tls.summary())
    target = Router(address_source(cfg.target, cfg.dns_refresh), target_client, tls=tls)
    draft = Router(address_source(cfg.draft, cfg.dns_refresh), draft_client, tls=tls) \
        if cfg.draft.strip() else None
    if not cfg.target.strip():
        raise ValueError("no target address given (--target host:port[,host:port...])")
    t_infos = wait_for_infos(target, "target", cfg.startup_timeout)
    d_infos = wait_for_infos(draft, "draft", cfg.startup_timeout) if draft else {}
    check_compatible(d_infos, t_infos)
    ref = next(iter(t_infos.values()))
    # Replicas found later (DNS) must speak the same token ids as those checked now.
    for router, kind in ((target, "target"), (draft, "draft")):
        if router is not None:
            router.admit = admission_check(ref, kind, cfg.rpc_deadline)
    tokenizer = load_tokenizer(cfg.model or ref.model_id, ref.tokenizer_digest)
    max_verify = min(i.max_draft_tokens for i in t_infos.values())
    # With no draft service, the look-up (--drafter lookup/hybrid) still drafts, up to
    # what the target verifies in one Verify.
    lookup_only = draft is None and cfg.drafter != "model" and cfg.lookup_k > 0
    limits = Limits(
        vocab_size=ref.vocab_size,
        max_context=min(i.max_context for i in t_infos.values()),
        max_draft_tokens=min((i.max_draft_tokens for i in d_infos.values()),
                             default=max_verify if lookup_only else 0),
        default_k=cfg.k if draft or lookup_only else 0,
        max_new_tokens_cap=cfg.max_new_tokens_cap,
        max_concurrency=cfg.max_concurrency,
        amateur_batch_dependent=any(i.batch_dependent_logits for i in d_infos.values()),
    )
    from specdec.runtime.models import stop_token_ids

    eos = stop_token_ids(cfg.model or ref.model_id, tokenizer)
    loop = SpeculativeLoop(draft, target, cfg.policy(), draft_backoff_s=cfg.draft_backoff,
                           max_propose=limits.max_draft_tokens or 1,
                           max_concurrency=cfg.max_concurrency, max_verify=max_verify)
    modes = [name for name, on in (("pipelined", cfg.pipeline), ("adaptive K", cfg.adaptive_k),
                                   ("confidence exit", cfg.confidence_exit),
                                   (f"{cfg.drafter} drafter", cfg.drafter != "model"),
                                   (f"output cache {cfg.lookup_cache}/tenant",
                                    cfg.lookup_cache > 0)) if on]
    log.info("coordinator loop ready: %d target, %d draft replica(s), model %s, K=%d%s",
             len(t_infos), len(d_infos), ref.model_id, limits.default_k,
             f" ({', '.join(modes)})" if modes else "")
    d_ref = next(iter(d_infos.values()), None)
    card = ModelCard(cfg.served_model_name or ref.model_id, ref.model_id,
                     d_ref.model_id if d_ref is not None else None, limits.max_context,
                     limits.default_k)
    return GenerationService(loop, tokenizer, limits, eos, card,
                             expose_replicas=cfg.expose_replicas)
