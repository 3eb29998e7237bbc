"""Pipelined drafting: draft round r+1 on the draft's core while the target verifies round r.

A pre-draft assumes every draft of this round is accepted and the bonus equals the
draft's own guess (the K+1-th token it proposed). When the next round starts, the
pre-draft is used if the committed ids are what it assumed; otherwise it is called off
(the draft stops at its next token) and counted wasted. The prefill round's pre-draft
("lead") is different: it proposes from the prompt alone, its own first tokens standing
in for tokens the target has not decided yet, and it is judged once those are known.
Contrastive rounds pre-draft with a lead too (coordinator.loop.contrastive_round): the bonus
is the contrastive choice, which only the look-up decides, so the draft's own next token
is its guess; such a pre-draft is called off as soon as the round's outcome rules it out.

Decisions never depend on timing: a pre-draft called off is always assumed to have left
the draft holding only the prefix it kept, whether the call-off or the reply won.
"""

from __future__ import annotations

from concurrent.futures import Executor, Future
from dataclasses import dataclass, replace

import grpc

from coordinator.record import Recorder
from coordinator.remote.clients import Cancel, Proposal
from coordinator.remote.link import RESYNC_CODES, DraftLink
from specdec.digest import TokenPrefix
from specdec.propose import ProposeOptions
from specdec.sampling import SamplingParams
from specdec.sync import SyncRequest


@dataclass
class PreDraft:
    """A pre-draft in flight: the next round's drafts, on an assumption."""

    future: Future  # -> (Proposal, the ids the draft then holds)
    assumed: list[int]  # the committed ids it assumed (all accepted, bonus = its guess)
    cancel: Cancel
    surely_held: list[int]  # what the draft holds however far it got when called off
    lead: int = 0  # its first tokens are guesses too
    prefill: bool = False  # the prefill round's: never called off
    called_off: bool = False

    def call_off(self) -> None:
        self.called_off = True
        self.cancel()


class PreDrafts:
    """The pre-draft of one generation (at most one in flight)."""

    def __init__(self, executor: Executor, draft: DraftLink, record: Recorder,
                 sampling: SamplingParams, top_n: int):
        self.executor, self.draft, self.record = executor, draft, record
        self.sampling, self.top_n = sampling, top_n
        self.pending: PreDraft | None = None

    def start(self, committed: TokenPrefix, assumed_tokens: list[int],
              options: ProposeOptions, lead: int = 0, prefill: bool = False,
              guess: bool = True) -> None:
        """Propose options.num_tokens drafts and a guess (unless not `guess`) on top of
        `assumed_tokens` (the committed ids plus guesses) plus the draft's own first `lead`
        tokens, with this generation's top_n. `prefill`: this is the prefill round's
        pre-draft (never called off)."""
        replica = self.draft.replica
        if replica is None:
            return
        assumed = committed.extended(assumed_tokens[len(committed):])
        keep_len, keep_digest, new_tokens = self.draft.view.plan(assumed)
        sync = SyncRequest(self.draft.session_id, keep_len, keep_digest, new_tokens)
        client, cancel = replica.client, Cancel()
        options = replace(options, top_n=self.top_n,
                          num_tokens=lead + options.num_tokens + (1 if guess else 0))

        def predraft():
            proposal = client.propose(sync, self.sampling, options, self.draft.meter, cancel)
            return proposal, (assumed.tokens + proposal.tokens)[:proposal.cached_len]

        # Called off at any point, the draft still holds the kept prefix: a request never
        # crops below its keep_len, and what it fed before stopping only adds to it.
        self.pending = PreDraft(self.executor.submit(predraft), list(assumed_tokens), cancel,
                                assumed.tokens[:keep_len], lead, prefill)
        self.record.predraft_started()

    def expect(self, tokens: list[int], lead: list[int] = ()) -> None:
        """The round's outcome is known to begin the ids `tokens`: call the pending
        pre-draft off now if it assumed other ids, or drew other `lead` tokens (known
        before its reply: a read-only Score says them)."""
        pre = self.pending
        assumed = pre.assumed + list(lead) if pre is not None else []
        if pre is not None and not pre.prefill and tokens[:len(assumed)] != assumed:
            pre.call_off()

    def take(self, committed: list[int], k: int) -> Proposal | None:
        """The pending pre-draft for this round if its assumption held (its K may differ:
        adaptive K); else it is called off. Either way the draft's view is updated."""
        pre, self.pending = self.pending, None
        if pre is None:
            return None
        # A prefill's pre-draft (lead) is judged once its own first tokens are known, and
        # never called off: it may be about done, and a draft stopped mid-prefill would
        # hold nothing and prefill again.
        useful = k > 0 and not pre.called_off and (bool(pre.lead) or pre.assumed == committed)
        if not useful and not pre.prefill:
            pre.call_off()
        try:
            proposal, view_tokens = pre.future.result()
        except grpc.FutureCancelledError:
            proposal, view_tokens = None, pre.surely_held
        except grpc.RpcError as e:
            self.record.predraft(False)
            self.draft.view.forget()
            if self.draft.replica is not None and \
                    e.code() not in RESYNC_CODES + (grpc.StatusCode.ABORTED,):
                self.draft.failed(e)  # the next Propose re-prefills; no back-off for those
            return None
        if pre.called_off:
            # Whether the call-off or the reply won the race, assume the same: the next
            # Propose then splits its work the same way, whatever the timing.
            view_tokens = pre.surely_held
        self.draft.view.holds(view_tokens)
        if useful and pre.lead:
            useful = pre.assumed + proposal.tokens[:pre.lead] == committed and \
                len(proposal.tokens) > pre.lead
            proposal = Proposal(proposal.tokens[pre.lead:], proposal.dists[pre.lead:],
                                proposal.cached_len, proposal.requested - pre.lead,
                                proposal.step_seconds)
        self.record.predraft(useful)
        return proposal if useful else None

    def drop(self) -> None:
        """Call off a pre-draft in flight and count it wasted (the generation is over)."""
        pre, self.pending = self.pending, None
        if pre is None:
            return
        pre.call_off()
        try:
            pre.future.result()
        except (grpc.RpcError, grpc.FutureCancelledError):
            pass
        self.draft.view.holds(pre.surely_held)
        self.record.predraft(False)
