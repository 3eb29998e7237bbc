"""Token ids -> streamed text: incremental detokenization and stop strings.

Byte-level tokenizers split multi-byte characters across tokens, and some tokens only
form text together with their neighbours, so a token cannot be decoded alone. The
detokenizer decodes a short window of recent ids twice (without and with the new ones)
and emits the difference only once it no longer ends in an incomplete character
(U+FFFD), as TGI and vLLM do.

Why not `tokenizers.decoders.DecodeStream` (tokenizers 0.22), which runs the same
algorithm: with a left context whose decoding ends in an incomplete character (a
`prompt_token_ids` prompt cut mid-character), DecodeStream does not take the context as
its prefix and streams the context's text as part of the first delta, echoing the
prompt (tests/unit/test_text.py, test_prompt_ending_mid_character_is_not_echoed). It
also has no flush (an incomplete last character stays held back for ever), raises
InvalidPrefix where a window decodes inconsistently, and needs the `tokenizers` backend
object rather than any tokenizer with `decode`. On every other case the test suite and
a differential fuzz found both give the same deltas.

Stop strings may straddle chunk boundaries: `TextStream` holds back the last
(longest stop - 1) characters until it knows they do not start a stop string, and cuts
the text at the first stop found.
"""

from __future__ import annotations

from collections.abc import Sequence

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer, context_ids: Sequence[int] = ()):
        self.tokenizer = tokenizer
        # A few prompt ids as left context: some tokenizers decode a leading token
        # differently (e.g. a word-initial space) when it starts the text.
        self.ids: list[int] = list(context_ids)[-4:]
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True,
                                     clean_up_tokenization_spaces=False)

    def add(self, new_ids: Sequence[int]) -> str:
        """Text completed by these ids (possibly empty, held back until complete)."""
        self.ids.extend(new_ids)
        return self._delta(final=False)

    def flush(self) -> str:
        """Whatever is left, incomplete characters included (end of generation)."""
        return self._delta(final=True)

    def _delta(self, final: bool) -> str:
        before = self._decode(self.ids[self.prefix_offset:self.read_offset])
        after = self._decode(self.ids[self.prefix_offset:])
        if len(after) <= len(before) or (after.endswith(REPLACEMENT) and not final):
            return ""
        # Move the window forward: keep the ids just read as the next left context.
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return after[len(before):]


class TextStream:
    """Accumulates text deltas, finds stop strings, releases only text that is final.

    The result is always text[:earliest start of any stop string], however the text was
    chunked: a position is released only once no stop string can start there, and a
    complete stop is acted on only when no longer stop could still start before it.
    """

    def __init__(self, stop: Sequence[str] = (), armed: bool = True):
        self.stop = [s for s in stop if s]
        # False: text passes through and no stop string acts yet (vLLM's min_tokens); the
        # caller arms it at the token from which stops count
        self.armed = armed
        self.text = ""  # everything accepted so far (cut at a stop, once found)
        self.released = 0  # characters of self.text already handed out
        self.stopped = False

    def _earliest_complete(self) -> int | None:
        hits = [i for i in (self.text.find(s, self.released) for s in self.stop) if i >= 0]
        return min(hits, default=None)

    def _earliest_partial(self) -> int | None:
        """First position whose suffix is a proper prefix of some stop string."""
        longest = max((len(s) for s in self.stop), default=0)
        for p in range(max(self.released, len(self.text) - longest + 1), len(self.text)):
            tail = self.text[p:]
            if any(len(s) > len(tail) and s.startswith(tail) for s in self.stop):
                return p
        return None

    def push(self, delta: str) -> str:
        """Add decoded text; return the part that can be streamed now."""
        if self.stopped or not delta:
            return ""
        self.text += delta
        if not self.armed:
            return self._release(len(self.text))
        complete, partial = self._earliest_complete(), self._earliest_partial()
        if complete is not None and (partial is None or partial >= complete):
            return self._cut(complete)
        bounds = [b for b in (complete, partial) if b is not None]
        return self._release(min(bounds, default=len(self.text)))

    def finish(self) -> str:
        """The generation ended: apply a pending stop, else release what was held back."""
        if self.stopped:
            return ""
        complete = self._earliest_complete()
        if complete is not None:
            return self._cut(complete)
        return self._release(len(self.text))

    def _cut(self, at: int) -> str:
        self.text = self.text[:at]
        self.stopped = True
        return self._release(at)

    def _release(self, upto: int) -> str:
        if upto <= self.released:
            return ""
        out = self.text[self.released:upto]
        self.released = upto
        return out
