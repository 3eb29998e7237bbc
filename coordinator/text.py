"""Token ids -> streamed text: incremental detokenization and stop strings.

Byte-level tokenizers split multi-byte characters across tokens, and some tokens only
form text together with their neighbours, so a token cannot be decoded alone. The
detokenizer decodes a short window of recent ids twice (without and with the new ones)
and emits the difference only once it no longer ends in an incomplete character
(U+FFFD), as TGI and vLLM do.

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
    """Accumulates text deltas, finds stop strings, releases only text that is final."""

    def __init__(self, stop: Sequence[str] = ()):
        self.stop = [s for s in stop if s]
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.text = ""  # everything accepted so far (cut at a stop, once found)
        self.released = 0  # characters of self.text already handed out
        self.stopped = False

    def push(self, delta: str) -> str:
        """Add decoded text; return the part that can be streamed now."""
        if self.stopped or not delta:
            return ""
        start = max(0, len(self.text) - self.holdback)
        self.text += delta
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True
            return self._release(len(self.text))
        return self._release(len(self.text) - self.holdback)

    def finish(self) -> str:
        """Release what was held back (the generation ended without a stop string)."""
        return self._release(len(self.text))

    def _release(self, upto: int) -> str:
        if upto <= self.released:
            return ""
        out = self.text[self.released:upto]
        self.released = upto
        return out
