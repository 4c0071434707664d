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


class TextOutput:
    def __init__(self, tokenizer, stops: list[str] = ()):
        self._stream = TextStream(tokenizer) if tokenizer is not None else IdsText()
        self.stops = list(stops)
        self.text = ""  # everything decoded so far (cut at a stop string)
        self.sent = 0  # characters of `text` already handed out
        self.stopped = False

    def push(self, token: int) -> str:
        if self.stopped:
            return ""
        self.text += self._stream.push(token)
        cut = min((i for i in (self.text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.text, self.stopped = self.text[:cut], True
            return self._hand_out(len(self.text))
        return self._hand_out(len(self.text) - self._held())

    def flush(self) -> str:
        return self._hand_out(len(self.text))

    def _held(self) -> int:
        """Length of the longest tail of the text that begins some stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best

    def _hand_out(self, upto: int) -> str:
        piece = self.text[self.sent : max(upto, self.sent)]
        self.sent = max(upto, self.sent)
        return piece
