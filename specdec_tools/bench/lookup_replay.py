"""What the look-up alone would give on a machine, replayed offline from measured pass
costs (`specdec bench-pass-width --replay`).

The target's greedy text of a prompt is known in advance, so the look-up's rounds can be
replayed without the services: each round, `coordinator.drafters.lookup.LookupDrafter`
(the look-up the coordinator runs) proposes its drafts from the prompt and the text
committed so far, the drafts the text confirms are accepted, and the round commits them plus one
token, exactly as a greedy Verify would. Each round is charged the pass of its width
(1 + drafts) from a measured table, plus, when its width differs from the previous
pass's, the measured cost of a width change. Target-only decoding is one width-1 pass
per token, so

    replayed speedup = tokens x constant(1) / sum over rounds of the round's charge

which leaves out everything but the target's passes (RPC, the coordinator): it bounds
what the look-up alone can reach on that text, and with and without the change cost it
says how much of the gap the width changes explain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from coordinator.drafters.base import NO_DRAFTS, Outcome
from coordinator.drafters.costs import LookupSettings
from coordinator.drafters.lookup import LookupDrafter


@dataclass(frozen=True)
class Replay:
    tokens: int
    rounds: int
    drafted: int
    accepted: int
    width_changes: int
    speedup: float  # with the width-change cost
    speedup_free_changes: float  # had width changes cost nothing


def replay(prompt: Sequence[int], text: Sequence[int], pass_ms: Callable[[int], float],
           change_ms: float, settings: LookupSettings | None = None) -> Replay:
    """Replay the look-up alone over `text` (the target's greedy continuation of
    `prompt`); `pass_ms(width)` is a pass's cost in a run of equal widths, `change_ms`
    what a pass costs more after one of another width. A width change cannot make a pass
    cheaper, so a negative `change_ms` (timing noise on a small model) is charged as 0."""
    if not text:
        raise ValueError("nothing to replay: the text is empty")
    change_ms = max(change_ms, 0.0)
    settings = settings or LookupSettings()
    drafter = LookupDrafter(prompt, settings, request_k=settings.max_tokens)
    context = list(prompt)
    done = rounds = drafted = accepted = changes = 0
    charged = free = 0.0
    previous = 1
    while done < len(text):
        found = drafter.propose(context, settings.max_tokens)
        n = len(found.tokens)
        ok = 0
        while ok < n and done + ok < len(text) and found.tokens[ok] == text[done + ok]:
            ok += 1
        step = min(ok + 1, len(text) - done)
        context += text[done:done + step]
        drafter.observe(Outcome(context, found if n else NO_DRAFTS, ok))
        done += step
        width = n + 1
        cost = pass_ms(width)
        free += cost
        if width != previous:
            changes += 1
            cost += change_ms
        charged += cost
        previous = width
        rounds, drafted, accepted = rounds + 1, drafted + n, accepted + ok
    base = len(text) * pass_ms(1)
    return Replay(len(text), rounds, drafted, accepted, changes, base / charged, base / free)


def greedy_texts(backend, tokenizer, messages: dict[str, str], max_new_tokens: int,
                 progress: bool = True) -> dict[str, tuple[list[int], list[int]]]:
    """(prompt ids, the target's greedy ids) per shipped prompt, from `backend` itself."""
    from tqdm import tqdm

    from specdec.sampling import SamplingParams
    from specdec_tools.bench.scenarios import InProcessTarget, chat_text

    target = InProcessTarget(backend, tokenizer, [tokenizer.eos_token_id])
    out = {}
    for name, message in tqdm(messages.items(), desc="greedy texts", unit="prompt",
                              disable=not progress):
        prompt = tokenizer.encode(chat_text(tokenizer, message), add_special_tokens=False)
        sample = target.run(message, max_new_tokens, SamplingParams(temperature=0.0))
        out[name] = (prompt, sample.token_ids)
    return out
