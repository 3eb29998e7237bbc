"""The draft model as a drafter: drafts come from the draft service, asked in batches.

Pipelined (the default), a round's drafts were drafted during the previous round's
Verify, on an assumption about that round's outcome (a *pre-draft*):

* after a round of model drafts x_1..x_k with the draft's guess g at the bonus, that
  all k are accepted and the bonus is g: it drafts on top of context + x + [g];
* after any other round (none drafted, a look-up's drafts, a confidence exit), that the
  drafts are accepted and the target's next token is the draft's own: its first token
  (the *lead*) stands for the token the target decides now.

Each pre-draft drafts k + 1 tokens (k drafts and a guess at the next bonus, or a lead,
k - 1 drafts and a guess), so every item of a batch takes the same number of passes. It
is used when the round's outcome is what it assumed, else thrown away; the next round
then has no model drafts (a target-only round, or a look-up's) while the next pre-draft
starts from the corrected ids. Sampled rounds couple the guesses with the target's
draws (specdec.coupling): the lead with this round's bonus, the last token with the
next round's, so that a guess holds as often as the two distributions allow.

Sequential (`fetch`), the drafts of a round are asked for first and the Verify waits.

Every request is planned from the link's cache view with the sync formula, and the view
becomes what the reply says the draft holds. A failing draft never fails a generation:
its rounds go target-only and the link tries again after a back-off (coordinator.remote.link).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from coordinator.drafters.adaptive import ConfidenceExit
from coordinator.drafters.base import MODEL, NO_DRAFTS, Drafts, Outcome
from coordinator.record import Recorder
from coordinator.remote.clients import ItemFailure, propose_request
from coordinator.remote.link import RESYNC_CODES, DraftLink
from specdec import wire
from specdec.digest import TokenPrefix
from specdec.propose import ProposeOptions
from specdec.sampling import SamplingParams


@dataclass
class PreDraft:
    """One request to the draft service, and its reply once it came."""

    replica: object  # coordinator.remote.routing.Replica the request goes to
    request: object  # draft_pb2.ProposeRequest
    assumed: list[int]  # the ids it drafts after
    lead: int  # 1: its first token guesses the token the target decides this round
    guess: bool = False  # its last token guesses the bonus after the others
    pipelined: bool = True  # asked during the previous round's Verify (else: fetched)
    reply: object = None  # draft_pb2.ProposeResponse

    @property
    def tokens(self) -> list[int]:
        return list(self.reply.tokens)


class ModelDrafter:
    source = MODEL

    def __init__(self, link: DraftLink, sampling: SamplingParams, record: Recorder,
                 max_tokens: int, top_n: int = 0, exit: ConfidenceExit | None = None):
        self.link, self.sampling, self.record = link, sampling, record
        self.max_tokens = max_tokens  # the draft's max_draft_tokens
        self.top_n, self.exit = top_n, exit
        self.sent: PreDraft | None = None  # asked for this step
        self.ready: PreDraft | None = None  # answered, its assumption still possible

    # -- the round ---------------------------------------------------------------------

    def propose(self, context: Sequence[int], k: int) -> Drafts:
        """The ready pre-draft's drafts if it assumed `context` (at most k), else none.
        A context that went on along the pre-draft's own first tokens (a structured
        output's forced tokens, committed without a pass: the draft's masked q forced
        the same ones) uses the rest."""
        pre, self.ready = self.ready, None
        if pre is None:
            return NO_DRAFTS
        skip = _along(pre, context)
        tokens, dists = pre.tokens[skip or 0:], list(pre.reply.dists)[skip or 0:]
        n = min(k, len(tokens))
        used = skip is not None and n > 0
        if pre.pipelined:
            self.record.predraft(used)
        if not used:
            return NO_DRAFTS
        exited = len(pre.reply.tokens) < pre.request.num_tokens
        if pre.guess and not exited and n == len(tokens):
            n -= 1  # its last token guesses the bonus; it is not a draft
        if n == 0:
            return NO_DRAFTS
        guess = tokens[n] if n < len(tokens) else None
        return Drafts(tokens[:n], dists[:n], self._probs(tokens[:n], dists[:n]), MODEL, guess,
                      exited and n == len(tokens), pre.pipelined, pre.reply.step_seconds)

    def prepare(self, context: Sequence[int], drafts: Drafts, k: int,
                seeds: tuple[int | None, int | None] = (None, None)) -> PreDraft | None:
        """The next round's k drafts, asked for now, on the assumption the module states.
        `seeds`: the bonus seeds of this round and the next (sampled rounds that couple
        the guesses; None otherwise)."""
        if k <= 0 or not self.link.ready():
            return None
        lead = 0 if drafts.guess is not None else 1
        assumed = list(context) + list(drafts.tokens)
        if drafts.guess is not None:
            assumed.append(drafts.guess)
        n = min(k + 1, self.max_tokens)
        if n - lead < 1:
            return None
        lead_seed, guess_seed = seeds if not self.sampling.greedy else (None, None)
        guess = n - lead >= 2  # room for a draft and a guess after it
        pre = self._ask(assumed, n, lead, lead_seed if lead else None,
                        guess_seed if guess else None, guess and guess_seed is not None)
        pre.guess = guess
        return pre

    def fetch(self, context: Sequence[int], k: int, guess: bool = False,
              seed: int | None = None) -> PreDraft | None:
        """This round's k drafts, asked for before its Verify: sequential drafting, or a
        pipelined round whose pre-draft missed. `guess`: and a guess at the bonus after
        them, which the next round's pre-draft can assume, coupled with the round's
        bonus seed `seed` (sampled rounds)."""
        if k <= 0 or not self.link.ready():
            return None
        n = min(k + (1 if guess else 0), self.max_tokens)
        guess = guess and n >= 2
        seed = seed if guess and not self.sampling.greedy else None
        pre = self._ask(list(context), n, 0, None, seed, seed is not None)
        pre.pipelined, pre.guess = False, guess
        return pre

    @property
    def has_drafts(self) -> bool:
        """A pre-draft is at hand (whether its assumption held is for `propose`)."""
        return self.ready is not None

    def observe(self, outcome: Outcome) -> None:
        """The reply to this step's request (if any) and the round's outcome: the view
        follows the reply; the pre-draft stays ready only if its assumption still can
        hold."""
        if self.exit is not None and outcome.drafts.source == MODEL and outcome.drafts:
            self.exit.observe(len(outcome.drafts), outcome.accepted)
        pre, self.sent = self.sent, None
        if pre is None or not self._answered(pre, outcome.reply):
            return
        if _along(pre, outcome.committed) is None:
            self.record.predraft(False)  # the round's outcome is not what it assumed
            return
        self.ready = pre

    def fetched(self, reply) -> None:
        """The reply to `fetch`'s request (sequential drafting)."""
        pre, self.sent = self.sent, None
        if pre is not None and self._answered(pre, reply):
            self.ready = pre

    def finished(self) -> None:
        for pre in (self.ready, self.sent):
            if pre is not None and pre.pipelined:
                self.record.predraft(False)
        self.ready = self.sent = None

    # -- helpers -------------------------------------------------------------------------

    def _ask(self, assumed: list[int], n: int, lead: int, lead_seed: int | None,
             guess_seed: int | None, guess_last: bool) -> PreDraft:
        sync = self.link.plan(TokenPrefix(assumed))
        exit_below = self.exit.threshold if self.exit is not None else 0.0
        request = propose_request(sync, self.sampling, ProposeOptions(
            num_tokens=n, top_n=self.top_n, exit_below=exit_below, guess_seed=guess_seed,
            guess_last=guess_last, lead_seed=lead_seed))
        self.sent = PreDraft(self.link.replica, request, assumed, lead)
        return self.sent

    def _answered(self, pre: PreDraft, reply) -> bool:
        """Take the reply (True) or its failure (False) into the link's view."""
        if reply is None:
            self.link.view.forget()  # never sent: assume nothing
            return False
        if isinstance(reply, ItemFailure):
            if reply.whole or reply.code not in RESYNC_CODES:
                self.link.failed_with(reply.code, reply.message)
                return False
            self.record.resync("propose")
            if reply.cached_len is not None and reply.cached_len < pre.request.keep_len:
                self.link.view.truncate(reply.cached_len)
            else:
                self.link.view.forget()
            return False
        self.link.failures = 0
        self.link.view.served(pre.assumed + list(reply.tokens), reply.cached_len)
        pre.reply = reply
        return True

    def _probs(self, tokens: list[int], dists: list) -> list[float]:
        """q_i(x_i) of each draft (1.0 when greedy: no dists)."""
        if not dists:
            return [1.0] * len(tokens)
        return [wire.dist_from_proto(d, f"dists[{i}]").prob_of(x)
                for i, (x, d) in enumerate(zip(tokens, dists, strict=True))]


def _along(pre: PreDraft, context: Sequence[int]) -> int | None:
    """How many of the pre-draft's tokens `context` has taken: its lead when the context
    is what it assumed, more when the context went on along its own tokens (a structured
    output's forced tokens); None when the context left it."""
    base = pre.assumed + pre.tokens[:pre.lead]
    skip = pre.lead + len(context) - len(base)
    if skip < pre.lead or skip > len(pre.tokens):
        return None
    return skip if base + pre.tokens[pre.lead:skip] == list(context) else None
