"""A step's calls to the services: one batch per replica, items isolated.

`send_predrafts` starts one ProposeBatch per draft replica with every generation's
request for the next round; `collect` waits for them (at most a bound, so that a draft
that hangs costs a step, not a deadline) and hands each round its reply or its failure.
`verify` sends one VerifyBatch per target replica with every round, and repeats, at
once and with the same round, what failed for a reason the coordinator can fix:

  FAILED_PRECONDITION, NOT_FOUND  the view is cut to what the target says it holds (or
                                  forgotten) and the round re-sent: a resync;
  the replica failed (UNAVAILABLE, a deadline, a dropped call, ...)
                                  the generation is re-pinned to another replica, which
                                  re-prefills, and the round re-sent;
  INVALID_ARGUMENT, RESOURCE_EXHAUSTED
                                  the generation fails with that status; the others go on.

A round is re-sent with the same drafts and seeds, so its verdict does not depend on
which replica answers or how often it was asked.
"""

from __future__ import annotations

import grpc

from coordinator.clients import ItemFailure, verify_request
from coordinator.link import RESYNC_CODES
from specdec.errors import InvalidArgument, ResourceExhausted, Unavailable

ATTEMPTS = 4  # sends of one round within a step, at most


def _by_replica(items: list, replica_of) -> dict:
    groups: dict = {}
    for item in items:
        groups.setdefault(id(replica_of(item)), (replica_of(item), []))[1].append(item)
    return groups


def send_predrafts(rounds: list) -> list:
    """Start the ProposeBatch calls of these rounds' pre-drafts; [(call, rounds)]."""
    out = []
    for replica, group in _by_replica(rounds, lambda r: r.predraft.replica).values():
        call = replica.client.propose_batch([r.predraft.request for r in group])
        out.append((call, group))
    return out


def collect(sent: list, timeout: float | None) -> float:
    """Wait for the pre-draft calls and give each round its reply (or ItemFailure);
    returns the longest call's wall time."""
    longest = 0.0
    for call, group in sent:
        outcomes = call.outcomes(timeout)
        longest = max(longest, call.seconds)
        for r, outcome in zip(group, outcomes, strict=True):
            r.reply = outcome
            r.gen.record.rpc("propose", call.seconds)
            if not isinstance(outcome, ItemFailure):
                r.gen.meter.sent += r.predraft.request.ByteSize()
                r.gen.meter.received += outcome.ByteSize()
    return longest


def fetch(gens: list, ks: list[int], guess: bool = False) -> float:
    """Each generation's drafts for this round (and with `guess` a guess at its bonus),
    asked for and waited for before its Verify; returns the longest call's wall time."""
    asks = []
    longest = 0.0
    for gen, k in zip(gens, ks, strict=True):
        pre = gen.drafter.fetch(gen.committed.tokens, k, guess,
                                gen.bonus_seed(gen.round_index + 1)) \
            if gen.drafter is not None else None
        if pre is not None:
            asks.append((gen, pre))
    for replica, group in _by_replica(asks, lambda a: a[1].replica).values():
        call = replica.client.propose_batch([pre.request for _, pre in group])
        for (gen, _), outcome in zip(group, call.outcomes(None), strict=True):
            gen.record.rpc("propose", call.seconds)
            gen.drafter.fetched(outcome)
        longest = max(longest, call.seconds)
    return longest


def verify(rounds: list) -> float:
    """Verify every round, re-sending what failed for a fixable reason (module notes);
    sets each round's verdict or error. Returns the longest call's wall time."""
    tried = {id(r): [] for r in rounds}
    todo = [r for r in rounds if r.error is None]
    longest = 0.0
    for attempt in range(ATTEMPTS):
        if not todo:
            break
        calls = [(replica.client.verify_batch([r.request for r in group]), group)
                 for replica, group in _by_replica(todo, lambda r: r.gen.target.replica).values()]
        again = []
        for call, group in calls:
            outcomes = call.outcomes(None)
            longest = max(longest, call.seconds)
            for r, outcome in zip(group, outcomes, strict=True):
                r.gen.record.rpc("verify", call.seconds)
                if not isinstance(outcome, ItemFailure):
                    _verified(r, outcome)
                elif _fixable(r, outcome, tried[id(r)]) and attempt + 1 < ATTEMPTS:
                    again.append(r)
                elif r.error is None:
                    r.error = Unavailable(f"the target failed this generation's round "
                                          f"{ATTEMPTS} times; last: {outcome.code.name}: "
                                          f"{outcome.message}")
        todo = again
    return longest


def _verified(r, response) -> None:
    from coordinator.clients import target_round_of

    link = r.gen.target
    link.router.mark_ok(link.replica)
    link.view.served(r.sent, response.cached_len)
    r.gen.meter.sent += r.request.ByteSize()
    r.gen.meter.received += response.ByteSize()
    r.verdict = target_round_of(response)


def _fixable(r, failure: ItemFailure, tried: list[str]) -> bool:
    """Fix what made the round fail so that it can be re-sent (True), or set its error."""
    link = r.gen.target
    code = failure.code
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        r.error = InvalidArgument(f"target refused the request: {failure.message}")
        return False
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        r.error = ResourceExhausted(f"target is full: {failure.message}")
        return False
    if code in RESYNC_CODES and not failure.whole:
        link.record.resync("verify")
        held = failure.cached_len
        if held is not None and held < r.request.keep_len:
            link.view.truncate(held)
        else:
            link.view.forget()
    else:
        try:
            link.repin(code, failure.message, tried)
        except Unavailable as e:
            r.error = e
            return False
    sent = r.sent
    prefix = r.gen.committed if not r.partial else None
    sync = link.plan(prefix if prefix is not None else _prefix(sent))
    drafts = list(r.drafts.tokens)
    r.request = verify_request(sync, drafts, list(r.drafts.dists), r.gen.sampling,
                               r.request.round_seed,
                               bonus_seed=r.request.bonus_seed
                               if r.request.HasField("bonus_seed") else None)
    return True


def _prefix(tokens: list[int]):
    from specdec.digest import TokenPrefix

    return TokenPrefix(tokens)
