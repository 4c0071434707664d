"""A request's output text as its tokens arrive: never a split character, and never a piece
of a stop string (text that may still become one is held back until it cannot).

    out = TextOutput(tokenizer, stops=["\\n"])
    piece = out.push(token)     # text safe to send now ("" while held back)
    out.stopped                 # a stop string appeared: the text ends before it
    rest = out.flush()          # at the end: what was held back (nothing after a stop)
"""

from seqexport.runtime.tokenizer import TextStream


class IdsText:
    """Text of a model without a tokenizer: its ids, space-separated (as `seqexport generate`)."""

    def __init__(self):
        self.ids = []

    def push(self, token: int) -> str:
        self.ids.append(token)
        return f"{token}" if len(self.ids) == 1 else f" {token}"


class StopMatcher:
    """One stop string found in text fed a piece at a time (Knuth-Morris-Pratt): `matched`, the
    longest prefix of it the text so far ends with, moves with each new character in amortized
    constant time. Before, every token searched the whole text for each stop string and tried
    every prefix length against its tail: the engine thread's time per token grew with the text
    and with the stop string's length squared (a 1,000-character stop string: 2.1 s of the
    engine thread over a 20,000-token answer, stalling every row; 100,000 characters: 31 s)."""

    def __init__(self, stop: str):
        self.stop = stop
        self.matched = 0
        # fail[i]: the longest proper prefix of stop[: i + 1] that is also its suffix
        fail, k = [0] * len(stop), 0
        for i in range(1, len(stop)):
            while k and stop[i] != stop[k]:
                k = fail[k - 1]
            if stop[i] == stop[k]:
                k += 1
            fail[i] = k
        self._fail = fail

    def feed(self, piece: str) -> int | None:
        """Where in `piece` the stop string ends (the index after its last character) if it
        completes there; else None, and `matched` says how much of it the text ends with."""
        stop, fail, k = self.stop, self._fail, self.matched
        for j, ch in enumerate(piece):
            while k and stop[k] != ch:
                k = fail[k - 1]
            if stop[k] == ch:
                k += 1
                if k == len(stop):
                    self.matched = k
                    return j + 1
        self.matched = k
        return None


class TextOutput:
    def __init__(self, tokenizer, stops: list[str] = ()):
        self._stream = TextStream(tokenizer) if tokenizer is not None else IdsText()
        self.stops = list(stops)
        self._matchers = [StopMatcher(s) for s in self.stops]
        self.text = ""  # everything decoded so far (cut at a stop string)
        self.sent = 0  # characters of `text` already handed out
        self.stopped = False

    def push(self, token: int) -> str:
        if self.stopped:
            return ""
        piece = self._stream.push(token)
        start = len(self.text)
        self.text += piece
        # the earliest-starting stop string completed by this piece (none was in the text before)
        ends = [(start + end - len(m.stop)) for m in self._matchers if (end := m.feed(piece)) is not None]
        if ends:
            self.text, self.stopped = self.text[: min(ends)], True
            return self._hand_out(len(self.text))
        held = max((m.matched for m in self._matchers), default=0)  # a tail that may become a stop string
        return self._hand_out(len(self.text) - held)

    def flush(self) -> str:
        return self._hand_out(len(self.text))

    def _hand_out(self, upto: int) -> str:
        piece = self.text[self.sent : max(upto, self.sent)]
        self.sent = max(upto, self.sent)
        return piece
