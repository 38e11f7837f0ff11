"""Generated tokens to text as they arrive: incremental detokenization with stop strings.

Each round's tokens go in; what comes out is the text that can no longer change. Two things hold text back: a
character still incomplete (a multi-byte character split across tokens decodes to U+FFFD until its last byte comes),
and the tail that could be the start of a stop string. The whole output is decoded each time (a tokenizer's merge of
spaces and byte pieces depends on the neighbours), which costs microseconds at the lengths a request generates.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class TextStream:
    """The text of one request's generated tokens; `stopped` once a stop string appeared (the text ends before it)."""

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer, self.stop = tokenizer, tuple(s for s in stop if s)
        self.tokens: list[int] = []
        self.sent = 0  # characters of the text already given out
        self.text = ""  # the final text so far (cut at a stop string)
        self.stopped = False

    def _decode(self) -> str:
        return self.tokenizer.decode(self.tokens, skip_special_tokens=True)

    def add(self, tokens: list[int]) -> str:
        """The new tokens of a round -> the text that became final with them ('' when none did)."""
        if self.stopped:
            return ""
        self.tokens += tokens
        text = self._decode()
        for s in self.stop:  # the earliest stop string wins, searched from where a new one could start
            at = text.find(s, max(0, self.sent - len(s) + 1))
            if at >= 0 and (not self.stopped or at < len(self.text)):
                self.text, self.stopped = text[:at], True
        if self.stopped:
            return self._take(len(self.text))
        self.text = text
        hold = max((len(s) - 1 for s in self.stop), default=0)
        end = len(text) - hold
        while end > self.sent and text[end - 1] == REPLACEMENT:  # an incomplete character: wait for its bytes
            end -= 1
        return self._take(end)

    def finish(self) -> str:
        """The generation ended: the rest of the text."""
        return self._take(len(self.text))

    def _take(self, end: int) -> str:
        out = self.text[self.sent : end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return out
