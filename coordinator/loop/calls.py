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

from coordinator.remote.clients import ItemFailure
from specdec.errors import Unavailable

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
            r.drafted(outcome, call.seconds)
    return longest


def fetch(gens: list, ks: list[int], guess: bool = False) -> tuple[float, list]:
    """Each generation's drafts for this round (and with `guess` a guess at its bonus),
    asked for and waited for before its Verify; returns the longest call's wall time and
    every (request, reply)."""
    asks, answers = [], []
    longest = 0.0
    for gen, k in zip(gens, ks, strict=True):
        pre = gen.drafter.fetch(gen.committed.tokens, k, guess,
                                gen.bonus_seed(gen.round_index + 1)) \
            if gen.drafter is not None else None
        if pre is not None:
            asks.append((gen, pre))
    for replica, group in _by_replica(asks, lambda a: a[1].replica).values():
        call = replica.client.propose_batch([pre.request for _, pre in group])
        for (gen, pre), outcome in zip(group, call.outcomes(None), strict=True):
            gen.record.rpc("propose", call.seconds)
            if not isinstance(outcome, ItemFailure):  # counted as a pre-draft's reply is
                gen.meter.count(pre.request, outcome)
            gen.drafter.fetched(outcome)
            answers.append((pre.request, outcome))
        longest = max(longest, call.seconds)
    return longest, answers


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
                    r.verified(outcome)
                elif r.repair(outcome, tried[id(r)]) and attempt + 1 < ATTEMPTS:
                    again.append(r)
                elif r.error is None:
                    r.error = Unavailable(f"the target failed this generation's round "
                                          f"{ATTEMPTS} times; last: {outcome.code.name}: "
                                          f"{outcome.message}")
        todo = again
    return longest
